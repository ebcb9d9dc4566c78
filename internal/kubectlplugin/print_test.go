package kubectlplugin

import (
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Each -o of a list, and --no-headers: cli-runtime's printers over the
// gateway's answer (every page merged), kubectl's table printer over the
// columns, cli-runtime's name printer over the Kubernetes kind.
func TestPrinters(t *testing.T) {
	srv := httptest.NewServer(&fakeGateway{})
	defer srv.Close()
	tmpl := filepath.Join(t.TempDir(), "names.tmpl")
	if err := os.WriteFile(tmpl, []byte(`{{range .volumes}}{{.name}}={{.phase}};{{end}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	jp := filepath.Join(t.TempDir(), "names.jsonpath")
	if err := os.WriteFile(jp, []byte(`{.volumes[*].reclaimPolicy}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"a table": {[]string{"volumes"}, `NAME   CAPACITY   ACCESS MODES   RECLAIM POLICY   STATUS      CLAIM       STORAGECLASS   AGE
pv-a   1Gi        RWO            Delete           Bound       team/data   fast           5m
pv-b   2Gi        RWO,ROX        Retain           Available   <none>      <none>         5m
`},
		"wide": {[]string{"volumes", "-o", "wide"}, `NAME   CAPACITY   ACCESS MODES   RECLAIM POLICY   STATUS      CLAIM       STORAGECLASS   AGE   VOLUMEMODE   PROVISIONED BY   MESSAGE
pv-a   1Gi        RWO            Delete           Bound       team/data   fast           5m    Filesystem   fast.csi         <none>
pv-b   2Gi        RWO,ROX        Retain           Available   <none>      <none>         5m    Block        <none>           <none>
`},
		"no headers": {[]string{"volumes", "--no-headers"}, `pv-a   1Gi   RWO       Delete   Bound       team/data   fast     5m
pv-b   2Gi   RWO,ROX   Retain   Available   <none>      <none>   5m
`},
		"wide, no headers": {[]string{"volumes", "-o", "wide", "--no-headers"}, `pv-a   1Gi   RWO       Delete   Bound       team/data   fast     5m    Filesystem   fast.csi   <none>
pv-b   2Gi   RWO,ROX   Retain   Available   <none>      <none>   5m    Block        <none>     <none>
`},
		"name":               {[]string{"volumes", "-o", "name"}, "persistentvolume/pv-a\npersistentvolume/pv-b\n"},
		"claims by name":     {[]string{"claims", "-o", "name", "--page-size", "2"}, "persistentvolumeclaim/c0\npersistentvolumeclaim/c1\npersistentvolumeclaim/c2\npersistentvolumeclaim/c3\npersistentvolumeclaim/c4\n"},
		"jsonpath":           {[]string{"volumes", "-o", "jsonpath={.volumes[*].name}"}, "pv-a pv-b"},
		"jsonpath, a range":  {[]string{"volumes", "-o", `jsonpath={range .volumes[*]}{.name}{"\t"}{.claimRef.name}{"\n"}{end}`}, "pv-a\tdata\npv-b\t\n"},
		"jsonpath, a filter": {[]string{"claims", "--page-size", "2", "-o", `jsonpath={.claims[?(@.name=="c3")].requestedBytes}`}, "1073741824"},
		"jsonpath-file":      {[]string{"volumes", "-o", "jsonpath-file=" + jp}, "Delete Retain"},
		"jsonpath-as-json":   {[]string{"volumes", "-o", "jsonpath-as-json={.volumes[0].name}"}, "[\n    \"pv-a\"\n]\n"},
		"go-template":        {[]string{"volumes", "-o", `go-template={{range .volumes}}{{.name}} {{end}}`}, "pv-a pv-b "},
		"go-template-file":   {[]string{"volumes", "-o", "go-template-file=" + tmpl}, "pv-a=Bound;pv-b=Available;"},
		"--template":         {[]string{"volumes", "-o", "go-template", "--template", `{{len .volumes}}`}, "2"},
		"json":               {[]string{"volumes", "-o", "json", "--no-headers"}, ""}, // checked below
	} {
		t.Run(name, func(t *testing.T) {
			out, errOut, err := run(t, srv.URL, tc.args...)
			if err != nil {
				t.Fatalf("%v\n%s", err, errOut)
			}
			if name == "json" {
				if !strings.HasPrefix(out, "{\n    \"volumes\": [\n        {\n            \"name\": \"pv-a\",\n            \"uid\": \"u-a\",") || !strings.HasSuffix(out, "}\n") {
					t.Errorf("-o json is the gateway's answer, indented, in its order:\n%s", out)
				}
				return
			}
			if out != tc.want {
				t.Errorf("got:\n%q\nwant:\n%q", out, tc.want)
			}
		})
	}
}

// -o name prints the Kubernetes object behind each item; an orphan has
// none, and says what to use instead.
func TestNames(t *testing.T) {
	srv := httptest.NewServer(&fakeGateway{})
	defer srv.Close()
	out, _, err := run(t, srv.URL, "explain", "pvc", "stuck", "-o", "name")
	if err != nil || out != "persistentvolumeclaim/stuck\n" {
		t.Errorf("explain -o name: %v %q", err, out)
	}
	for _, args := range [][]string{{"orphans", "-o", "name"}, {"orphans", "delete", "--driver", "d", "--volume-id", "v", "--yes", "-o", "name"}} {
		if _, _, err := run(t, srv.URL, args...); !IsUsage(err) || !strings.Contains(err.Error(), "use -o json or -o jsonpath") {
			t.Errorf("%v: %v, want a usage error naming what to use", args, err)
		}
	}
}

// Bad -o values are refused before anything is asked, with the formats
// the command takes.
func TestBadOutputs(t *testing.T) {
	f := &fakeGateway{}
	srv := httptest.NewServer(f)
	defer srv.Close()
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"xml":                 {[]string{"volumes", "-o", "xml"}, `--output "xml": use one of wide, json, yaml`},
		"wide of a write":     {[]string{"sync", "pvc", "data", "-o", "wide"}, `--output "wide": use one of json, yaml`},
		"a broken jsonpath":   {[]string{"volumes", "-o", "jsonpath={.volumes[}"}, "--output: "},
		"a missing template":  {[]string{"volumes", "-o", "go-template-file=/no/such/file"}, "--output: "},
		"custom-columns (no)": {[]string{"claims", "-o", "custom-columns=NAME:.name"}, `--output "custom-columns=NAME:.name"`},
	} {
		t.Run(name, func(t *testing.T) {
			before := len(f.auth)
			_, _, err := run(t, srv.URL, tc.args...)
			if !IsUsage(err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want a usage error with %q", err, tc.want)
			}
			if len(f.auth) != before {
				t.Errorf("%d requests sent for a bad -o", len(f.auth)-before)
			}
		})
	}
}
