package kubectlplugin

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/printers"
)

// output is a command's -o and its kin. The gateway's answers are JSON
// objects, not Kubernetes objects: -o json, yaml, kyaml, jsonpath=...,
// go-template=... (cli-runtime's printers) see the answer as the gateway
// sent it, every page of a list merged ({"claims": [...]}); -o name
// prints the Kubernetes object each item is (persistentvolumeclaim/data);
// no -o (and -o wide) is the command's table or description.
type output struct {
	flags *genericclioptions.PrintFlags
	// human: the formats besides cli-runtime's this command prints:
	// "wide" (tables, descriptions); noHeaders: --no-headers.
	wide, table bool
	noHeaders   bool
}

// Kinds of -o name.
var (
	kindClaim     = schema.GroupVersionKind{Version: "v1", Kind: "PersistentVolumeClaim"}
	kindVolume    = schema.GroupVersionKind{Version: "v1", Kind: "PersistentVolume"}
	kindCSIDriver = schema.GroupVersionKind{Group: "storage.k8s.io", Version: "v1", Kind: "CSIDriver"}
)

// newOutput adds -o (and --template, --allow-missing-template-keys) to
// cmd; table adds -o wide and --no-headers; wide adds -o wide alone (a
// description with more fields).
func newOutput(cmd *cobra.Command, operation string, table, wide bool) *output {
	o := &output{flags: genericclioptions.NewPrintFlags(operation), table: table, wide: wide || table}
	o.flags.AddFlags(cmd)
	_ = cmd.Flags().MarkHidden("show-managed-fields") // the answers have no managed fields
	formats := o.formats()
	f := cmd.Flags().Lookup("output")
	f.Usage = "output format: " + strings.Join(formats, ", ")
	if table {
		f.Usage += " (default: a table)"
		cmd.Flags().BoolVar(&o.noHeaders, "no-headers", false, "print no header line in tables")
	}
	_ = cmd.RegisterFlagCompletionFunc("output", func(_ *cobra.Command, _ []string, prefix string) ([]string, cobra.ShellCompDirective) {
		fs := prefixed(formats, prefix)
		for _, f := range fs {
			if !strings.HasSuffix(f, "=") {
				return fs, noFiles
			}
		}
		return fs, noFiles | cobra.ShellCompDirectiveNoSpace // jsonpath=... goes on
	})
	return o
}

// formats are the -o values, as completion offers them.
func (o *output) formats() []string {
	var out []string
	if o.wide {
		out = append(out, "wide")
	}
	out = append(out, o.flags.JSONYamlPrintFlags.AllowedFormats()...)
	out = append(out, "name", "jsonpath=", "jsonpath-as-json=", "jsonpath-file=", "go-template=", "go-template-file=")
	return out
}

// format is -o ("" for none).
func (o *output) format() string { return strings.ToLower(*o.flags.OutputFormat) }

// human: no -o, or -o wide where the command has it.
func (o *output) human() bool { return o.format() == "" || (o.wide && o.format() == "wide") }

// validate refuses an -o no printer takes, before anything is asked of
// the gateway.
func (o *output) validate() error {
	if o.human() {
		return nil
	}
	if _, err := o.flags.ToPrinter(); err != nil {
		if genericclioptions.IsNoCompatiblePrinterError(err) {
			return usagef("--output %q: use one of %s", *o.flags.OutputFormat, strings.Join(o.formats(), ", "))
		}
		return usagef("--output: %w", err)
	}
	return nil
}

// printAnswer writes v (an *object, or anything json.Marshal writes as
// the gateway's answer) with cli-runtime's printer for -o.
func (o *output) printAnswer(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	p, err := o.flags.ToPrinter()
	if err != nil {
		return usagef("--output: %w", err)
	}
	return p.PrintObj(&runtime.Unknown{Raw: b, ContentType: runtime.ContentTypeJSON}, w)
}

// printNames writes -o name: kind/name per name, by cli-runtime's name
// printer.
func (o *output) printNames(w io.Writer, kind schema.GroupVersionKind, names ...string) error {
	p, err := o.flags.ToPrinter()
	if err != nil {
		return usagef("--output: %w", err)
	}
	for _, n := range names {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(kind)
		u.SetName(n)
		if err := p.PrintObj(u, w); err != nil {
			return err
		}
	}
	return nil
}

// column is one column of a table: its header and its cell of an item.
type column struct {
	header string
	cell   func(*object) string
	// wide: only with -o wide.
	wide bool
}

// table is a list's table: metav1.Table, printed by cli-runtime's table
// printer as kubectl get prints the API server's tables (wide columns at
// priority 1, --no-headers, terminal escapes made harmless).
func table(items []any, cols []column) *metav1.Table {
	t := &metav1.Table{}
	for _, c := range cols {
		def := metav1.TableColumnDefinition{Name: c.header, Type: "string"}
		if c.wide {
			def.Priority = 1
		}
		t.ColumnDefinitions = append(t.ColumnDefinitions, def)
	}
	for _, it := range items {
		o, _ := it.(*object)
		row := metav1.TableRow{Cells: make([]any, len(cols))}
		for i, c := range cols {
			row.Cells[i] = cell(c.cell(o))
		}
		t.Rows = append(t.Rows, row)
	}
	return t
}

// printTable writes items as a table of cols.
func (o *output) printTable(w io.Writer, items []any, cols []column) error {
	p := printers.NewTablePrinter(printers.PrintOptions{NoHeaders: o.noHeaders, Wide: o.format() == "wide"})
	return p.PrintObj(table(items, cols), w)
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

// age is how long ago t was, as kubectl prints ages; "" for no time.
func age(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return duration.HumanDuration(time.Since(t))
}

// until is how long until t, "in 5s", or "now" when it passed; "" for no
// time.
func until(t time.Time) string {
	switch {
	case t.IsZero():
		return ""
	case !t.After(time.Now()):
		return "now"
	}
	return "in " + duration.HumanDuration(time.Until(t))
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

// enumWords turns an enum value into kubectl's CamelCase words:
// RULE_STORAGE_CLASS -> StorageClass, DECISION_WAIT_FOR_FIRST_CONSUMER ->
// WaitForFirstConsumer; "" for the unspecified value.
func enumWords(s, prefix string) string {
	s = strings.TrimPrefix(s, prefix)
	if s == "" || s == "UNSPECIFIED" {
		return ""
	}
	var b strings.Builder
	for _, w := range strings.Split(s, "_") {
		if w == "" {
			continue
		}
		b.WriteString(w[:1])
		b.WriteString(strings.ToLower(w[1:]))
	}
	return b.String()
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
		case rs[i-1] == '_':
			b.WriteRune(unicode.ToUpper(r))
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// text is a scalar (or a list of scalars) as text.
func text(v any) string {
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
			parts[i] = text(e)
		}
		return strings.Join(parts, ", ")
	}
	return fmt.Sprint(v)
}
