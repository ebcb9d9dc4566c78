package csisidecar

import (
	"bufio"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// docRow is one row of docs/compatibility.md's table of csi-provisioner's
// flags.
type docRow struct {
	def   string
	class Class
}

var rowRE = regexp.MustCompile("^\\| (?:`-[a-z]`, )?`--([a-z0-9-]+)` \\| `?([^|`]*)`? \\| ([a-z]+) \\| (.+) \\|$")

// docTable reads the table from docs/compatibility.md.
func docTable(t *testing.T) map[string]docRow {
	t.Helper()
	f, err := os.Open("../../docs/compatibility.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows := map[string]docRow{}
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			in = strings.HasPrefix(line, "## volplane-csi-sidecar: csi-provisioner "+ProvisionerVersion)
			continue
		}
		if !in || !strings.HasPrefix(line, "| `") {
			continue
		}
		m := rowRE.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("docs/compatibility.md: row %q does not read as | `--flag` | default | class | what |", line)
		}
		if _, dup := rows[m[1]]; dup {
			t.Fatalf("docs/compatibility.md: --%s has two rows", m[1])
		}
		rows[m[1]] = docRow{def: strings.TrimSpace(m[2]), class: Class(m[3])}
	}
	if len(rows) == 0 {
		t.Fatal("docs/compatibility.md has no table of csi-provisioner's flags")
	}
	return rows
}

// TestDocTableIsTheFlagList: the documented table and Flags list the same
// flags, classes and defaults (the sidecar's own defaults).
func TestDocTableIsTheFlagList(t *testing.T) {
	rows := docTable(t)
	var o Options
	fs := NewCommand(&o).FlagSet()
	for _, f := range Flags {
		row, ok := rows[f.Name]
		if !ok {
			t.Errorf("--%s: no row in docs/compatibility.md", f.Name)
			continue
		}
		if row.class != f.Class {
			t.Errorf("--%s: docs say %s, the code %s", f.Name, row.class, f.Class)
		}
		if def := fs.Lookup(f.Name).DefValue; row.def != def {
			t.Errorf("--%s: docs say the default is %q, the flag's is %q", f.Name, row.def, def)
		}
		delete(rows, f.Name)
	}
	for name := range rows {
		t.Errorf("docs/compatibility.md lists --%s, which Flags does not", name)
	}
}

// sample is a value of a flag of type typ that parses.
func sample(typ string) string {
	switch typ {
	case "bool":
		return "true"
	case "duration":
		return "7s"
	case "int", "uint", "uint32":
		return "3"
	case "float64", "float32":
		return "2.5"
	case "labels":
		return "team:storage"
	case "mapStringBool":
		return "Topology=true"
	case "quantity":
		return "1Ki"
	}
	return "x"
}

// TestEveryFlagParses: the sidecar's command line accepts every flag of
// the table, with a value, and booleans with and without one; a refused
// flag's error names it; the sidecar's own flags are no csi-provisioner
// flag.
func TestEveryFlagParses(t *testing.T) {
	var o Options
	fs := NewCommand(&o).FlagSet()
	for _, f := range Flags {
		fl := fs.Lookup(f.Name)
		if fl == nil {
			t.Errorf("--%s is not a flag of the sidecar", f.Name)
			continue
		}
		val := sample(fl.Value.Type())
		forms := [][]string{{"--" + f.Name + "=" + val}, {"--" + f.Name, val}}
		if fl.Value.Type() == "bool" {
			forms = [][]string{{"--" + f.Name + "=true"}, {"--" + f.Name}, {"--" + f.Name + "=false"}}
		}
		if fl.Shorthand != "" {
			forms = append(forms, []string{"-" + fl.Shorthand + "=" + val}, []string{"-" + fl.Shorthand, val})
		}
		for _, args := range forms {
			arg := args[0]
			o, err := Parse(args)
			if err != nil {
				t.Errorf("%v: %v", args, err)
				continue
			}
			refusals := o.Refusals()
			if f.Class == Refused && arg != "--"+f.Name+"=false" {
				if len(refusals) != 1 || !strings.Contains(refusals[0].Error(), "--"+f.Name+"=true") {
					t.Errorf("%v: refusals %v, want one naming --%s", args, refusals, f.Name)
				}
			}
			if f.Class == Accepted && !slices.ContainsFunc(o.NotNeeded(), func(l string) bool { return strings.HasPrefix(l, "flag --"+f.Name+" is accepted and not needed: ") }) {
				t.Errorf("%v: no log line says it is not needed: %q", args, o.NotNeeded())
			}
		}
	}
	fs.VisitAll(func(fl *pflag.Flag) {
		if _, ok := FlagByName(fl.Name); !ok && !strings.HasPrefix(fl.Name, "volplane-") && fl.Name != "help" {
			t.Errorf("--%s is neither csi-provisioner's (Flags) nor the sidecar's own (--volplane-*)", fl.Name)
		}
	})
}

// TestDefaultsRefuseNothing: the sidecar runs with csi-provisioner's
// defaults.
func TestDefaultsRefuseNothing(t *testing.T) {
	o, err := Parse(nil)
	if err != nil {
		t.Fatal(err)
	}
	if r := o.Refusals(); len(r) != 0 {
		t.Fatalf("defaults refused: %v", r)
	}
	if lines := o.NotNeeded(); len(lines) != 0 {
		t.Fatalf("defaults logged as not needed: %q", lines)
	}
	if s := o.Settings; s.VolumeNamePrefix != "pvc" || s.VolumeNameUUIDLength != 0 || s.ImmediateTopology == nil || !*s.ImmediateTopology ||
		s.PreventVolumeModeConversion == nil || !*s.PreventVolumeModeConversion ||
		s.Timeout != 10*time.Second || s.FeatureGates != nil || s.ExtraCreateMetadata || s.StrictTopology || s.DefaultFSType != "" {
		t.Fatalf("default settings %+v", s)
	}
}

// --prevent-volume-mode-conversion is carried as given, not refused: the
// provisioner compares it with its own.
func TestVolumeModeConversionIsCarried(t *testing.T) {
	o, err := Parse([]string{"--prevent-volume-mode-conversion=false"})
	if err != nil {
		t.Fatal(err)
	}
	if r := o.Refusals(); len(r) != 0 {
		t.Fatalf("refused: %v", r)
	}
	if p := o.Settings.PreventVolumeModeConversion; p == nil || *p {
		t.Fatalf("carried %v, want false", p)
	}
}

// TestRefusalsNameTheirFlag covers the refusals beyond the Refused class:
// values csi-provisioner itself would not run with.
func TestRefusalsNameTheirFlag(t *testing.T) {
	t.Setenv("NODE_NAME", "")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--node-deployment"}, "NODE_NAME"},
		{[]string{"--volume-name-uuid-length=0"}, "--volume-name-uuid-length=0"},
		{[]string{"--volume-name-uuid-length=33"}, "--volume-name-uuid-length=33"},
		{[]string{"--http-endpoint=:8080", "--metrics-address=:8081"}, "--metrics-address"},
		{[]string{"--worker-threads=0"}, "--worker-threads=0"},
		{[]string{"--timeout=0s"}, "--timeout=0s"},
		{[]string{"--logging-format=xml"}, "--logging-format"},
		{[]string{"--csi-address="}, "--csi-address"},
	} {
		o, err := Parse(tc.args)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		err = o.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Count(err.Error(), "\n") != 0 {
			t.Errorf("%v: %v, want one line naming %s", tc.args, err, tc.want)
		}
	}
	for _, args := range [][]string{{"--no-such-flag"}, {"--timeout=soon"}, {"--feature-gates=Topology"}, {"--leader-election-labels=a"}, {"positional"}} {
		if _, err := Parse(args); err == nil {
			t.Errorf("%v parsed", args)
		}
	}
}

// TestNodeDeploymentTakesNodeNameFromTheEnvironment runs what the
// command runs, Parse (Finish) then Validate, with $NODE_NAME set as a
// DaemonSet's downward API sets it: the node name must be read before the
// validation that requires it. The first multi-node cluster run found the
// sidecar refusing to start in every node's pod.
func TestNodeDeploymentTakesNodeNameFromTheEnvironment(t *testing.T) {
	t.Setenv("NODE_NAME", "node-a")
	o, err := Parse([]string{"--node-deployment", "--csi-address=/csi/csi.sock"})
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Validate(); err != nil {
		t.Fatalf("refused with NODE_NAME set: %v", err)
	}
	if o.NodeName != "node-a" {
		t.Fatalf("node name %q, want node-a", o.NodeName)
	}
}

// TestChartArgs parses the csi-provisioner arguments of a real chart: the
// aws-ebs-csi-driver Helm chart's controller, written from memory of its
// templates (charts/aws-ebs-csi-driver/templates/controller.yaml, with
// the values most clusters set), not copied from a file here.
func TestChartArgs(t *testing.T) {
	args := []string{"--csi-address=$(ADDRESS)", "--v=2", "--feature-gates=Topology=true", "--extra-create-metadata", "--leader-election=true",
		"--default-fstype=ext4", "--timeout=60s", "--kube-api-qps=20", "--kube-api-burst=100", "--worker-threads=100", "--retry-interval-max=30m"}
	o, err := Parse(args)
	if err != nil {
		t.Fatal(err)
	}
	if r := o.Refusals(); len(r) != 0 {
		t.Fatalf("refused: %v", r)
	}
	p, s := o.Provisioner, o.Settings
	if p.CSIAddress != "$(ADDRESS)" || !p.LeaderElection || p.KubeAPIQPS != 20 || p.KubeAPIBurst != 100 || p.WorkerThreads != 100 || p.Verbosity != 2 || p.Timeout != time.Minute {
		t.Fatalf("kept flags %+v", p)
	}
	if !s.ExtraCreateMetadata || s.DefaultFSType != "ext4" || s.Timeout != time.Minute || !s.FeatureGates["Topology"] {
		t.Fatalf("carried settings %+v", s)
	}
	if got := o.NotNeeded(); len(got) != 1 || !strings.HasPrefix(got[0], "flag --retry-interval-max is accepted and not needed: ") {
		t.Fatalf("not-needed lines %q", got)
	}
}

// helpFlagRE is a flag line of csi-provisioner --help.
var helpFlagRE = regexp.MustCompile(`^\s+(?:-[a-zA-Z], )?--([a-z0-9-]+)\b(.*)$`)

var helpDefaultRE = regexp.MustCompile(`\(default "?([^")]*)"?\)\s*$`)

// TestProvisionerHelpListsNoFlagTheTableLacks runs the pinned
// csi-provisioner ($VOLPLANE_CSI_PROVISIONER, which make test sets) with
// --help: every flag it lists must be in docs/compatibility.md's table,
// with the same default, and the table must list nothing else.
func TestProvisionerHelpListsNoFlagTheTableLacks(t *testing.T) {
	bin := os.Getenv("VOLPLANE_CSI_PROVISIONER")
	if bin == "" {
		t.Skip("VOLPLANE_CSI_PROVISIONER is not set (make test sets it; make external-provisioner builds it)")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("VOLPLANE_CSI_PROVISIONER=%s: %v (make external-provisioner builds it)", bin, err)
	}
	out, _ := exec.CommandContext(t.Context(), bin, "--help").CombinedOutput()
	help := helpFlags(string(out))
	if len(help) < 20 {
		t.Fatalf("%s --help lists %d flags:\n%s", bin, len(help), out)
	}
	rows := docTable(t)
	for name, def := range help {
		row, ok := rows[name]
		switch {
		case !ok:
			t.Errorf("csi-provisioner %s has --%s; docs/compatibility.md's table (and csisidecar.Flags) lack it", ProvisionerVersion, name)
		case def != "" && def != row.def:
			t.Errorf("--%s: csi-provisioner's default is %q, the table's %q", name, def, row.def)
		}
	}
	for name := range rows {
		if _, ok := help[name]; !ok {
			t.Errorf("docs/compatibility.md lists --%s, which csi-provisioner %s --help does not", name, ProvisionerVersion)
		}
	}
}

// helpFlags are the flags of a pflag usage text with the default each
// states ("" when it states none).
func helpFlags(out string) map[string]string {
	flags := map[string]string{}
	var last string
	for line := range strings.SplitSeq(out, "\n") {
		if m := helpFlagRE.FindStringSubmatch(line); m != nil {
			last = m[1]
			flags[last] = ""
			line = m[2]
		}
		if d := helpDefaultRE.FindStringSubmatch(line); d != nil && last != "" {
			flags[last] = d[1]
		}
	}
	return flags
}
