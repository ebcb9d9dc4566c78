package kubectlplugin

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/yaml"
)

// column is one column of a table: its header and its cell of an item.
type column struct {
	header string
	cell   func(*object) string
	// wide: only with -o wide.
	wide bool
}

// newTable is a tab writer set up as kubectl's printers set theirs up.
func newTable(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 6, 4, 3, ' ', 0) }

// printTable writes items as a table of the columns (the wide ones too
// when wide).
func printTable(w io.Writer, items []any, cols []column, wide bool) error {
	var use []column
	for _, c := range cols {
		if !c.wide || wide {
			use = append(use, c)
		}
	}
	tw := newTable(w)
	hdr := make([]string, len(use))
	for i, c := range use {
		hdr[i] = c.header
	}
	fmt.Fprintln(tw, strings.Join(hdr, "\t"))
	for _, it := range items {
		o, _ := it.(*object)
		row := make([]string, len(use))
		for i, c := range use {
			row[i] = cell(c.cell(o))
		}
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	return tw.Flush()
}

// cell makes a value fit one table cell: one line, tabs out, "<none>"
// for nothing.
func cell(s string) string {
	s = strings.Join(strings.FieldsFunc(s, func(r rune) bool { return r == '\n' || r == '\r' || r == '\t' }), " ")
	if s == "" {
		return "<none>"
	}
	return s
}

// printData writes v (an *object) as JSON or YAML.
func printData(w io.Writer, format string, v any) error {
	b, err := json.MarshalIndent(v, "", "    ")
	if err != nil {
		return err
	}
	if format == "yaml" {
		if b, err = yaml.JSONToYAML(b); err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// age is how long ago t was, as kubectl prints ages; "" for no time.
func age(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return duration.HumanDuration(time.Since(t))
}

// size prints bytes as a Kubernetes quantity (1Gi); "" for 0.
func size(b int64) string {
	if b == 0 {
		return ""
	}
	return resource.NewQuantity(b, resource.BinarySI).String()
}

// modes abbreviates access modes as kubectl does (RWO, ROX, RWX, RWOP).
func modes(ms []string) string {
	short := map[string]string{"ReadWriteOnce": "RWO", "ReadOnlyMany": "ROX", "ReadWriteMany": "RWX", "ReadWriteOncePod": "RWOP"}
	out := make([]string, len(ms))
	for i, m := range ms {
		if s, ok := short[m]; ok {
			out[i] = s
		} else {
			out[i] = m
		}
	}
	return strings.Join(out, ",")
}

// trimEnum drops an enum's type prefix: STATE_FAILED -> FAILED.
func trimEnum(s, prefix string) string { return strings.TrimPrefix(s, prefix) }

// describe writes any JSON object as kubectl describe lays an object out:
// "Field:  value" lines, nested objects indented, lists of scalars joined,
// lists of objects as tables. It knows no field by name, so it shows any
// answer whatever its shape.
func describe(w io.Writer, o *object) error {
	var b strings.Builder
	describeObject(&b, o, 0)
	_, err := io.WriteString(w, b.String())
	return err
}

func describeObject(b *strings.Builder, o *object, depth int) {
	pad := strings.Repeat("  ", depth)
	// Align the scalar fields' values.
	width := 0
	for _, k := range o.keys {
		if isScalarish(o.m[k]) {
			width = max(width, len(title(k))+1)
		}
	}
	for _, k := range o.keys {
		if k == "nextPageToken" {
			continue
		}
		v := o.m[k]
		label := title(k) + ":"
		switch x := v.(type) {
		case *object:
			if len(x.keys) == 0 {
				fmt.Fprintf(b, "%s%-*s  <none>\n", pad, width, label)
				continue
			}
			fmt.Fprintf(b, "%s%s\n", pad, label)
			describeObject(b, x, depth+1)
		case []any:
			if isScalarish(x) {
				fmt.Fprintf(b, "%s%-*s  %s\n", pad, width, label, cell(scalarText(x)))
				continue
			}
			fmt.Fprintf(b, "%s%s\n", pad, label)
			describeTable(b, x, depth+1)
		default:
			fmt.Fprintf(b, "%s%-*s  %s\n", pad, width, label, cell(scalarText(x)))
		}
	}
}

// describeTable writes a list of objects as a table whose columns are
// their scalar fields (nested objects flattened as a.b), in the order they
// first appear.
func describeTable(b *strings.Builder, items []any, depth int) {
	var cols []string
	seen := map[string]bool{}
	rows := make([]map[string]string, len(items))
	for i, it := range items {
		rows[i] = map[string]string{}
		o, ok := it.(*object)
		if !ok {
			o = newObject()
			o.set("value", it)
		}
		flatten(o, "", rows[i], func(k string) {
			if !seen[k] {
				seen[k] = true
				cols = append(cols, k)
			}
		})
	}
	var tb strings.Builder
	tw := newTable(&tb)
	hdr := make([]string, len(cols))
	for i, c := range cols {
		hdr[i] = strings.ToUpper(title(c))
	}
	fmt.Fprintln(tw, strings.Join(hdr, "\t"))
	for _, r := range rows {
		cells := make([]string, len(cols))
		for i, c := range cols {
			cells[i] = cell(r[c])
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	tw.Flush()
	pad := strings.Repeat("  ", depth)
	for _, line := range strings.Split(strings.TrimRight(tb.String(), "\n"), "\n") {
		fmt.Fprintf(b, "%s%s\n", pad, strings.TrimRight(line, " "))
	}
}

// flatten puts an object's scalar fields into row, nested ones as
// "parent.child", and names each key as it meets it.
func flatten(o *object, prefix string, row map[string]string, meet func(string)) {
	for _, k := range o.keys {
		key := prefix + k
		switch x := o.m[k].(type) {
		case *object:
			flatten(x, key+".", row, meet)
		case []any:
			if isScalarish(x) {
				meet(key)
				row[key] = scalarText(x)
			} else {
				meet(key)
				j, _ := json.Marshal(x)
				row[key] = string(j)
			}
		default:
			meet(key)
			row[key] = scalarText(x)
		}
	}
}

// isScalarish: a scalar, or a list of scalars.
func isScalarish(v any) bool {
	switch x := v.(type) {
	case *object:
		return false
	case []any:
		for _, e := range x {
			if !isScalarish(e) {
				return false
			}
			if _, ok := e.([]any); ok {
				return false
			}
		}
		return true
	}
	return true
}

func scalarText(v any) string {
	switch x := v.(type) {
	case nil:
		return ""
	case string:
		return x
	case json.Number:
		return x.String()
	case bool:
		return fmt.Sprint(x)
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = scalarText(e)
		}
		return strings.Join(parts, ", ")
	}
	return fmt.Sprint(v)
}

// title turns a JSON field name into words: storageClassName -> Storage
// Class Name.
func title(k string) string {
	var b strings.Builder
	rs := []rune(k)
	for i, r := range rs {
		switch {
		case i == 0:
			b.WriteRune(unicode.ToUpper(r))
		case r == '_':
			b.WriteRune(' ')
		case unicode.IsUpper(r) && (unicode.IsLower(rs[i-1]) || (i+1 < len(rs) && unicode.IsLower(rs[i+1]) && unicode.IsUpper(rs[i-1]))):
			b.WriteRune(' ')
			b.WriteRune(r)
		case i > 0 && rs[i-1] == '_':
			b.WriteRune(unicode.ToUpper(r))
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}
