package kubectlplugin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"

	"k8s.io/cli-runtime/pkg/printers"
)

// block is a run of "Key:  value" lines aligned as kubectl describe
// aligns them. Empty values are left out: an unset field of the answer is
// no line at all.
type block struct {
	indent int
	rows   [][2]string
}

func (b *block) add(k, v string) {
	if v != "" {
		b.rows = append(b.rows, [2]string{k, v})
	}
}

func (b *block) write(w *bytes.Buffer) {
	width := 0
	for _, r := range b.rows {
		width = max(width, len(r[0])+1)
	}
	pad := strings.Repeat("  ", b.indent)
	for _, r := range b.rows {
		fmt.Fprintf(w, "%s%-*s  %s\n", pad, width, r[0]+":", oneLine(r[1]))
	}
}

// oneLine keeps a value on its line and makes terminal escapes harmless
// (a driver's error message is shown as it came).
func oneLine(s string) string {
	return printers.EscapeTerminal(strings.Join(strings.FieldsFunc(s, func(r rune) bool { return r == '\n' || r == '\t' }), " "))
}

// section writes a blank line and a title line (when there is one) before
// what follows.
func section(w *bytes.Buffer, title string) {
	if w.Len() > 0 {
		w.WriteByte('\n')
	}
	if title != "" {
		w.WriteString(title + "\n")
	}
}

// describeVerdict lays out an explain or match answer as kubectl
// describe lays out an object, the answer first: the decision and its
// reason; the claim; the candidates as a table; then, for a claim that is
// (or would be) provisioned, the provisioning fields that say something,
// and for match the CreateVolume request the provisioner would send. A
// field the answer leaves unset is no line. An answer that is not one
// (no decision: a gateway this plugin does not know) is shown field by
// field.
// match: the answer is match's, whose claim does not exist (no age).
func describeVerdict(w io.Writer, a *object, wide, match bool) error {
	if a.str("decision") == "" {
		return describeAny(w, a)
	}
	var b bytes.Buffer
	top := block{}
	top.add("Decision", enumWords(a.str("decision"), "DECISION_"))
	top.add("Reason", a.str("message"))
	top.write(&b)

	section(&b, "")
	claimBlock(a, wide, match).write(&b)

	if cands := a.list("candidates"); len(cands) > 0 {
		t := fmt.Sprintf("Candidates (%d):", len(cands))
		if total := a.int("totalCandidates"); total > int64(len(cands)) {
			t = fmt.Sprintf("Candidates (%d of %d):", len(cands), total)
		}
		section(&b, t)
		var tb bytes.Buffer
		p := printers.NewTablePrinter(printers.PrintOptions{Wide: wide})
		if err := p.PrintObj(table(cands, candidateColumns), &tb); err != nil {
			return err
		}
		for _, l := range strings.Split(strings.TrimRight(tb.String(), "\n"), "\n") {
			b.WriteString("  " + strings.TrimRight(l, " ") + "\n")
		}
	}
	if p := a.obj("provisioning"); p != nil {
		if pb := provisioningBlock(p); len(pb.rows) > 0 {
			section(&b, "Provisioning:")
			pb.write(&b)
		}
	}
	if cv := a.obj("createVolume"); cv != nil {
		if cb := createVolumeBlock(cv); len(cb.rows) > 0 {
			section(&b, "Would Create Volume:")
			cb.write(&b)
		}
	}
	_, err := w.Write(b.Bytes())
	return err
}

// candidateColumns are the candidates table's.
var candidateColumns = []column{
	{header: "RANK", cell: func(o *object) string { return o.str("rank") }},
	{header: "VOLUME", cell: func(o *object) string { return o.str("name") }},
	{header: "CAPACITY", cell: func(o *object) string { return size(o.int("capacityBytes")) }},
	{header: "ACCESS MODES", cell: func(o *object) string { return modes(o.strs("accessModes")) }},
	{header: "CLASS", cell: func(o *object) string { return o.str("storageClassName") }},
	{header: "REJECTED BY", cell: func(o *object) string { return enumWords(o.str("rejectedBy"), "RULE_") }},
	{header: "MESSAGE", cell: func(o *object) string { return o.str("message") }},
	{header: "VOLUME MODE", wide: true, cell: func(o *object) string { return o.str("volumeMode") }},
	{header: "PHASE", wide: true, cell: func(o *object) string { return o.str("phase") }},
	{header: "PRE-BOUND", wide: true, cell: func(o *object) string { return yes(o.bool("claimRefToClaim")) }},
}

func yes(b bool) string {
	if b {
		return "yes"
	}
	return ""
}

// claimBlock is the claim as the binder sees it (explain) or as the API
// server would store it (match), and how it was bound.
func claimBlock(a *object, wide, match bool) *block {
	c := a.obj("claim")
	b := &block{}
	b.add("Claim", ref(c.str("namespace"), c.str("name")))
	status := c.str("phase")
	if c.bool("deleting") {
		status += " (being deleted)"
	}
	b.add("Status", status)
	volume := c.str("volumeName")
	bd := a.obj("binding")
	if bd != nil && bd.str("volumeName") != "" {
		volume = bd.str("volumeName")
		if ph := bd.str("volumePhase"); ph != "" {
			volume += " (" + ph + ")"
		}
	}
	b.add("Volume", volume)
	b.add("Capacity", size(c.int("capacityBytes")))
	b.add("Request", size(c.int("requestedBytes")))
	b.add("Access Modes", modes(c.strs("accessModes")))
	b.add("Volume Mode", c.str("volumeMode"))
	b.add("StorageClass", c.str("storageClassName"))
	if bd != nil {
		b.add("Provisioned By", bd.str("provisionedBy"))
	}
	if p := c.str("storageProvisioner"); bd == nil || p != bd.str("provisionedBy") {
		b.add("Provisioner", p)
	}
	b.add("Selected Node", c.str("selectedNode"))
	if !match {
		b.add("Age", age(c.time("createTime")))
	}
	if wide {
		b.add("UID", c.str("uid"))
		b.add("Resource Version", c.str("resourceVersion"))
		b.add("Answered By", a.str("memberId"))
	}
	return b
}

// provisioningBlock is what matters of the provisioning side: its state
// in words, the class, the driver when volplane serves it, the journaled
// operation and its last error, the binder's next call.
func provisioningBlock(p *object) *block {
	b := &block{indent: 1}
	b.add("Status", p.str("message"))
	class := p.str("storageClassName")
	switch {
	case class != "" && !p.bool("classFound"):
		class += " (not found)"
	case class != "":
		var about []string
		if pr := p.str("provisioner"); pr != "" {
			about = append(about, "provisioner "+pr)
		}
		if m := p.str("volumeBindingMode"); m != "" {
			about = append(about, m)
		}
		if len(about) > 0 {
			class += " (" + strings.Join(about, ", ") + ")"
		}
	}
	b.add("StorageClass", class)
	if p.bool("served") {
		ready := "ready"
		if !p.bool("driverReady") {
			ready = "not ready"
		}
		b.add("Driver", p.str("driverName")+" ("+ready+")")
	}
	if p.bool("waitingForNode") {
		b.add("Waiting For", "a pod using the claim to be scheduled (volume.kubernetes.io/selected-node)")
	}
	if op := p.obj("operation"); op != nil && op.str("volumeName") != "" {
		s := op.str("volumeName")
		var about []string
		if n := op.int("attempts"); n > 0 {
			about = append(about, plural(n, "attempt"))
		}
		if a := age(op.time("startTime")); a != "" {
			about = append(about, "started "+a+" ago")
		}
		if o := op.str("owner"); o != "" {
			about = append(about, "held by "+o)
		}
		if len(about) > 0 {
			s += " (" + strings.Join(about, ", ") + ")"
		}
		b.add("Operation", s)
		if code, msg := op.str("lastErrorCode"), op.str("lastErrorMessage"); code != "" || msg != "" {
			e := strings.TrimPrefix(code+": "+msg, ": ")
			if a := age(op.time("lastAttemptTime")); a != "" {
				e += " (" + a + " ago)"
			}
			b.add("Last Error", e)
		}
	}
	if p.bool("callInFlight") {
		b.add("In Flight", "a Provision call of the binder is running now")
	}
	b.add("Next Retry", until(p.time("nextRetryTime")))
	b.add("Last Result", p.str("lastResult"))
	return b
}

func plural(n int64, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// createVolumeBlock is match's CreateVolume request as the provisioner
// would send it (secrets never shown: only whether there are some).
func createVolumeBlock(cv *object) *block {
	b := &block{indent: 1}
	b.add("Name", cv.str("volumeName"))
	b.add("Driver", cv.str("driverName"))
	capacity := size(cv.int("requiredBytes"))
	if l := size(cv.int("limitBytes")); l != "" {
		capacity = strings.TrimSpace(capacity + " (limit " + l + ")")
	}
	b.add("Capacity", capacity)
	var caps []string
	for _, it := range cv.list("volumeCapabilities") {
		c, _ := it.(*object)
		s := c.str("accessMode")
		if c.bool("block") {
			s += ", block"
		} else {
			s += ", filesystem"
			if fs := c.str("fsType"); fs != "" {
				s += " " + fs
			}
			if fl := c.strs("mountFlags"); len(fl) > 0 {
				s += " (mount flags " + strings.Join(fl, ",") + ")"
			}
		}
		caps = append(caps, s)
	}
	b.add("Capabilities", strings.Join(caps, "; "))
	b.add("Parameters", pairs(cv.obj("parameters")))
	b.add("Mutable Parameters", pairs(cv.obj("mutableParameters")))
	b.add("Requisite Topology", segments(cv.list("requisiteTopology")))
	b.add("Preferred Topology", segments(cv.list("preferredTopology")))
	b.add("Source Snapshot", cv.str("sourceSnapshotId"))
	b.add("Source Volume", cv.str("sourceVolumeId"))
	if cv.bool("withSecrets") {
		b.add("Secrets", "the StorageClass names provisioner secrets (never shown)")
	}
	return b
}

// pairs is a map as k=v, ... in key order; "" for none.
func pairs(m *object) string {
	if m == nil {
		return ""
	}
	keys := slices.Clone(m.keys)
	slices.Sort(keys)
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = k + "=" + m.str(k)
	}
	return strings.Join(out, ", ")
}

// segments is a list of topology segments, each as k=v,k=v, joined by
// " or ".
func segments(l []any) string {
	var out []string
	for _, it := range l {
		s, _ := it.(*object)
		if p := pairs(s.obj("segments")); p != "" {
			out = append(out, strings.ReplaceAll(p, ", ", ","))
		}
	}
	return strings.Join(out, " or ")
}

// describeAny writes any JSON object field by field, as kubectl describe
// lays an object out: "Field:  value" lines, nested objects indented,
// lists of objects as tables. Empty values (a protobuf field left unset)
// are left out. It is the layout of an answer this plugin does not know.
func describeAny(w io.Writer, o *object) error {
	var b bytes.Buffer
	describeObject(&b, o, 0)
	_, err := w.Write(b.Bytes())
	return err
}

func describeObject(b *bytes.Buffer, o *object, depth int) {
	scalars := &block{indent: depth}
	flush := func() {
		scalars.write(b)
		scalars.rows = nil
	}
	for _, k := range o.keys {
		if k == "nextPageToken" || empty(o.m[k]) {
			continue
		}
		switch x := o.m[k].(type) {
		case *object:
			flush()
			fmt.Fprintf(b, "%s%s:\n", strings.Repeat("  ", depth), title(k))
			describeObject(b, x, depth+1)
		case []any:
			if isScalarish(x) {
				scalars.add(title(k), text(x))
				continue
			}
			flush()
			fmt.Fprintf(b, "%s%s:\n", strings.Repeat("  ", depth), title(k))
			describeTable(b, x, depth+1)
		default:
			scalars.add(title(k), text(x))
		}
	}
	flush()
}

// empty: a value protojson writes for an unset field (null, "", 0,
// false, [], {}, an enum's UNSPECIFIED).
func empty(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case string:
		return x == "" || x == "0" || strings.HasSuffix(x, "_UNSPECIFIED")
	case bool:
		return !x
	case []any:
		return len(x) == 0
	case *object:
		for _, k := range x.keys {
			if !empty(x.m[k]) {
				return false
			}
		}
		return true
	}
	return text(v) == "0"
}

// describeTable writes a list of objects as a table whose columns are
// their scalar fields (nested objects flattened as a.b), in the order they
// first appear; columns empty in every row are left out.
func describeTable(b *bytes.Buffer, items []any, depth int) {
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
	var use []column
	for _, c := range cols {
		for _, r := range rows {
			if r[c] != "" {
				use = append(use, column{header: strings.ToUpper(title(c)), cell: func(o *object) string { return o.str(c) }})
				break
			}
		}
	}
	flat := make([]any, len(rows))
	for i, r := range rows {
		o := newObject()
		for k, v := range r {
			o.set(k, v)
		}
		flat[i] = o
	}
	var tb bytes.Buffer
	_ = printers.NewTablePrinter(printers.PrintOptions{}).PrintObj(table(flat, use), &tb)
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
			meet(key)
			if isScalarish(x) {
				row[key] = text(x)
			} else if !empty(x) {
				j, _ := json.Marshal(x)
				row[key] = string(j)
			}
		default:
			meet(key)
			if !empty(x) {
				row[key] = text(x)
			}
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
			switch e.(type) {
			case *object, []any:
				return false
			}
		}
	}
	return true
}
