package kubectlplugin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"

	"github.com/volplane/volplane/pkg/version"
)

// fakeGateway answers like the gateway: claims in pages of the pageSize
// asked for, explain answers (in two pages for one claim) and match
// answers as protojson writes the real messages, the write routes, and
// refusals. Token "good" may do anything, "viewer" only read. It records
// each request's Authorization header and each write.
type fakeGateway struct {
	auth   []string
	match  []byte
	writes []string // "POST /path body"
}

func (f *fakeGateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.auth = append(f.auth, r.Header.Get("Authorization"))
	w.Header().Set("Content-Type", "application/json")
	auth := r.Header.Get("Authorization")
	if auth != "Bearer good" && auth != "Bearer viewer" {
		w.WriteHeader(http.StatusUnauthorized)
		io.WriteString(w, `{"code":16,"message":"unauthorized: send a bearer token","details":[]}`)
		return
	}
	if r.Method == http.MethodPost && !strings.HasSuffix(r.URL.Path, ":match") {
		body, _ := io.ReadAll(r.Body)
		f.writes = append(f.writes, strings.TrimSpace(r.Method+" "+r.URL.Path+" "+string(body)))
		if auth == "Bearer viewer" {
			w.WriteHeader(http.StatusForbidden)
			fmt.Fprintf(w, `{"code":7,"message":"%s is forbidden: User \"viewer\" cannot do it","details":[]}`, r.URL.Path)
			return
		}
		if answer, ok := writeAnswers[r.URL.Path]; ok {
			io.WriteString(w, answer)
			return
		}
	}
	switch {
	case r.URL.Path == "/v1/namespaces/team/claims":
		size, _ := strconv.Atoi(r.URL.Query().Get("pageSize"))
		start, _ := strconv.Atoi(r.URL.Query().Get("pageToken"))
		var claims []string
		end := min(start+size, 5)
		for i := start; i < end; i++ {
			claims = append(claims, fmt.Sprintf(`{"namespace":"team","name":"c%d","phase":"Pending","capacityBytes":"0","requestedBytes":"1073741824","accessModes":["ReadWriteOnce"],"storageClassName":"fast","createTime":"2020-01-01T00:00:00Z"}`, i))
		}
		next := ""
		if end < 5 {
			next = strconv.Itoa(end)
		}
		fmt.Fprintf(w, `{"claims":[%s],"nextPageToken":%q}`, strings.Join(claims, ","), next)
	case strings.HasPrefix(r.URL.Path, "/v1/namespaces/team/claims/") && strings.HasSuffix(r.URL.Path, ":explain"):
		name := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/v1/namespaces/team/claims/"), ":explain")
		ans, ok := explainAnswers(time.Now())[name]
		if !ok {
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, `{"code":5,"message":"Not Found","details":[]}`)
			return
		}
		if name == "data" {
			// In two pages: the candidates of the second page only.
			if r.URL.Query().Get("pageToken") == "" {
				ans.Candidates, ans.NextPageToken = ans.Candidates[:2], "p2"
			} else {
				ans.Candidates = ans.Candidates[2:]
			}
		}
		b, _ := protojson.MarshalOptions{EmitUnpopulated: true}.Marshal(ans)
		w.Write(b)
	case r.URL.Path == "/v1/claims:match" && r.Method == http.MethodPost:
		f.match, _ = io.ReadAll(r.Body)
		b, _ := protojson.MarshalOptions{EmitUnpopulated: true}.Marshal(matchAnswer(time.Now()))
		w.Write(b)
	case r.URL.Path == "/v1/volumes" && r.Method == http.MethodGet:
		created := time.Now().Add(-5 * time.Minute).UTC().Format(time.RFC3339Nano)
		fmt.Fprintf(w, `{"volumes":[`+
			`{"name":"pv-a","uid":"u-a","phase":"Bound","message":"","claimRef":{"namespace":"team","name":"data","uid":"c1"},"storageClassName":"fast","capacityBytes":"1073741824","accessModes":["ReadWriteOnce"],"volumeMode":"Filesystem","reclaimPolicy":"Delete","provisionedBy":"fast.csi","createTime":%q},`+
			`{"name":"pv-b","uid":"u-b","phase":"Available","message":"","claimRef":null,"storageClassName":"","capacityBytes":"2147483648","accessModes":["ReadWriteOnce","ReadOnlyMany"],"volumeMode":"Block","reclaimPolicy":"Retain","provisionedBy":"","createTime":%q}`+
			`],"nextPageToken":""}`, created, created)
	case r.URL.Path == "/v1/volumes/pv-a" && r.Method == http.MethodGet:
		io.WriteString(w, `{"volume":{"name":"pv-a","phase":"Failed","claimRef":{"namespace":"team","name":"gone","uid":"u1"},"capacityBytes":"1073741824","reclaimPolicy":"Delete","provisionedBy":"fast.csi"}}`)
	case r.URL.Path == "/v1/volumes/evil:sync":
		w.WriteHeader(http.StatusConflict)
		io.WriteString(w, `{"code":9,"message":"driver says \u001b[2J\u001b[31mall fine\r","details":[]}`)
	case r.URL.Path == "/v1/drivers":
		w.WriteHeader(http.StatusForbidden)
		io.WriteString(w, `{"code":7,"message":"drivers.volplane.io is forbidden: User \"x\" cannot list resource \"drivers\"","details":[]}`)
	default:
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, `{"code":5,"message":"Not Found","details":[]}`)
	}
}

// writeAnswers are the write routes' answers, by path.
var writeAnswers = map[string]string{
	"/v1/namespaces/team/claims/data:sync": `{}`,
	"/v1/volumes/pv-a:sync":                `{}`,
	"/v1/reclaims/pv-a:retry":              `{"reclaim":{"volumeName":"pv-a","policy":"Delete","state":"STATE_PENDING","message":"retry asked","attempts":3,"claimNamespace":"team","claimName":"gone","method":"METHOD_PROVISIONER"}}`,
	"/v1/reclaims":                         `{"reclaim":{"volumeName":"pv-a","policy":"Retain","state":"STATE_RETAINED","message":"policy Retain","attempts":0,"method":"METHOD_NONE"}}`,
	"/v1/volumes/pv-a:deleteBacking":       `{"outcome":"OUTCOME_FINISHED","message":""}`,
	"/v1/volumes/pv-slow:deleteBacking":    `{"outcome":"OUTCOME_IN_BACKGROUND","message":"DeleteVolume timed out"}`,
	"/v1/volumes/pv-no:deleteBacking":      `{"outcome":"OUTCOME_NO_CHANGE","message":"driver said InvalidArgument: no such volume"}`,
	"/v1/orphans:delete":                   `{"orphan":{"kind":"ORPHAN_KIND_VOLUME","driverName":"fast.csi","volumeId":"vol/1","capacityBytes":"1048576"}}`,
}

// kubeconfigFile writes a kubeconfig whose context "ctx" is in namespace
// team, with users "good" (token good), "stale" (token bad), "none",
// "viewer" (token viewer) and "impersonating" (token good, as alice).
func kubeconfigFile(t *testing.T) string {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["c"] = &clientcmdapi.Cluster{Server: "https://127.0.0.1:1"}
	cfg.AuthInfos["good"] = &clientcmdapi.AuthInfo{Token: "good"}
	cfg.AuthInfos["stale"] = &clientcmdapi.AuthInfo{Token: "bad"}
	cfg.AuthInfos["none"] = &clientcmdapi.AuthInfo{}
	cfg.AuthInfos["viewer"] = &clientcmdapi.AuthInfo{Token: "viewer"}
	cfg.AuthInfos["impersonating"] = &clientcmdapi.AuthInfo{Token: "good", Impersonate: "alice"}
	cfg.Contexts["ctx"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "good", Namespace: "team"}
	cfg.CurrentContext = "ctx"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

func run(t *testing.T, gw string, args ...string) (string, string, error) {
	t.Helper()
	return runTerminal(t, gw, false, "", args...)
}

// runTerminal runs with in as standard input, a terminal or not.
func runTerminal(t *testing.T, gw string, terminal bool, in string, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	kc := kubeconfigFile(t)
	err := Run(context.Background(), append([]string{"--kubeconfig", kc, "--gateway", gw}, args...), Streams{In: strings.NewReader(in), Out: &out, ErrOut: &errOut, Terminal: terminal})
	return out.String(), errOut.String(), err
}

func TestListsArePagedThrough(t *testing.T) {
	f := &fakeGateway{}
	srv := httptest.NewServer(f)
	defer srv.Close()
	out, _, err := run(t, srv.URL, "claims", "--page-size", "2")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 6 || !strings.HasPrefix(lines[0], "NAME") || !strings.Contains(lines[0], "ACCESS MODES") {
		t.Fatalf("table:\n%s", out)
	}
	if f := strings.Fields(lines[5]); f[0] != "c4" || f[1] != "Pending" || f[2] != "<none>" || f[4] != "RWO" || f[5] != "fast" {
		t.Fatalf("last row %q", lines[5])
	}
	if len(f.auth) != 3 {
		t.Fatalf("%d requests for 5 claims in pages of 2, want 3", len(f.auth))
	}
	for _, a := range f.auth {
		if a != "Bearer good" {
			t.Fatalf("sent Authorization %q, want the kubeconfig user's token", a)
		}
	}
	for _, format := range []string{"json", "yaml"} {
		out, _, err = run(t, srv.URL, "claims", "-o", format, "--page-size", "2")
		if err != nil {
			t.Fatal(err)
		}
		var l struct {
			Claims []struct{ Name, RequestedBytes string }
		}
		b := []byte(out)
		if format == "yaml" {
			if b, err = yaml.YAMLToJSON(b); err != nil {
				t.Fatal(err)
			}
		}
		if err := json.Unmarshal(b, &l); err != nil || len(l.Claims) != 5 || l.Claims[4].Name != "c4" || l.Claims[0].RequestedBytes != "1073741824" {
			t.Fatalf("-o %s: %v\n%s", format, err, out)
		}
		if strings.Contains(out, "nextPageToken") {
			t.Fatalf("-o %s shows a page token:\n%s", format, out)
		}
	}
}

// explain and match are laid out as kubectl describe lays out an object
// (describe_test.go has the golden layouts); -o json keeps the answer's
// order and merges its pages; match sends the claim in the context's
// namespace.
func TestExplainAndMatch(t *testing.T) {
	f := &fakeGateway{}
	srv := httptest.NewServer(f)
	defer srv.Close()
	out, _, err := run(t, srv.URL, "explain", "pvc", "data")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out, "Decision:  Bind\nReason:    binds volume pv-big now") || !strings.Contains(out, "pv-small") || !strings.Contains(out, "pv-big") {
		t.Errorf("explain output:\n%s", out)
	}
	out, _, err = run(t, srv.URL, "explain", "pvc/data", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out, "{\n    \"claim\"") || strings.Count(out, `"rank"`) != 3 || strings.Contains(out, "nextPageToken") {
		t.Errorf("explain -o json keeps the answer's order and merges the pages:\n%s", out)
	}

	claim := filepath.Join(t.TempDir(), "claim.yaml")
	os.WriteFile(claim, []byte("apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: new}\nspec:\n  storageClassName: fast\n  accessModes: [ReadWriteOnce]\n  resources: {requests: {storage: 1Gi}}\n"), 0o600)
	out, _, err = run(t, srv.URL, "match", "-f", claim)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out, "Decision:  Provision\n") || !strings.Contains(out, "  Parameters:          type=ssd, zone=a\n") {
		t.Errorf("match output:\n%s", out)
	}
	if !strings.Contains(string(f.match), `"namespace":"team"`) || !strings.Contains(string(f.match), `"storageClassName":"fast"`) {
		t.Errorf("match sent %s: want the claim, in the context's namespace", f.match)
	}
}

func TestErrors(t *testing.T) {
	srv := httptest.NewServer(&fakeGateway{})
	defer srv.Close()
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"forbidden":         {[]string{"drivers"}, "Error from gateway (403 Forbidden): drivers.volplane.io is forbidden"},
		"no such claim":     {[]string{"explain", "pvc", "nope"}, "Error from gateway (404 Not Found): Not Found"},
		"a stale token":     {[]string{"claims", "--user", "stale"}, "Error from gateway (401 Unauthorized): unauthorized: send a bearer token\nThe gateway did not accept"},
		"no credential":     {[]string{"claims", "--user", "none"}, "Error from gateway (401 Unauthorized): unauthorized: send a bearer token\nThe kubeconfig's user has no token"},
		"unknown command":   {[]string{"pods"}, `unknown command "pods"`},
		"a foreign flag":    {[]string{"drivers", "--state", "failed"}, "drivers does not take --state"},
		"explain a volume":  {[]string{"explain", "pv", "x"}, `explains claims (pvc), not "pv"`},
		"a bad state":       {[]string{"reclaims", "--state", "lost"}, `--state "lost"`},
		"match without -f":  {[]string{"match"}, "match needs -f FILE"},
		"a bad output":      {[]string{"claims", "-o", "xml"}, `--output "xml"`},
		"a bad orphan kind": {[]string{"orphans", "--kind", "x"}, `--kind "x"`},
	} {
		t.Run(name, func(t *testing.T) {
			_, _, err := run(t, srv.URL, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
			var ge *Error
			if strings.HasPrefix(tc.want, "Error from gateway") != errors.As(err, &ge) {
				t.Fatalf("error %T: a gateway refusal must be an *Error, a usage error not", err)
			}
		})
	}
}

// What the gateway says (a driver's message, a name) cannot drive the
// terminal: escape sequences and carriage returns are shown, not obeyed,
// in refusals, tables and descriptions.
func TestTerminalEscapes(t *testing.T) {
	srv := httptest.NewServer(&fakeGateway{})
	defer srv.Close()
	_, _, err := run(t, srv.URL, "sync", "pv", "evil")
	if err == nil || strings.ContainsAny(err.Error(), "\x1b\r") || !strings.Contains(err.Error(), "driver says ^[[2J^[[31mall fine\\r") {
		t.Errorf("refusal %q", err)
	}
	o, _ := decodeObject([]byte(`{"decision":"DECISION_NO_MATCH","message":"bad \u001b[31mred","claim":{"name":"x\u001b[1m"},"candidates":[{"rank":1,"name":"pv\u001b[2J","message":"m\r"}]}`))
	var b bytes.Buffer
	if err := describeVerdict(&b, o, false, false); err != nil {
		t.Fatal(err)
	}
	if strings.ContainsAny(b.String(), "\x1b\r") || !strings.Contains(b.String(), "bad ^[[31mred") || !strings.Contains(b.String(), "pv^[[2J") {
		t.Errorf("description %q", b.String())
	}
}

func TestTitle(t *testing.T) {
	for in, want := range map[string]string{"storageClassName": "Storage Class Name", "volumeId": "Volume Id", "node_affinity": "Node Affinity", "CSIDriver": "CSI Driver", "uid": "Uid"} {
		if got := title(in); got != want {
			t.Errorf("title(%q) = %q, want %q", in, got, want)
		}
	}
}

// Every command's --help is its own: its description, usage line and
// examples, not the list of commands.
func TestHelpPerCommand(t *testing.T) {
	root, _, err := run(t, "http://127.0.0.1:1", "--help")
	if err != nil || !strings.Contains(root, "Read (volplane-viewer):") || !strings.Contains(root, "Act (volplane-operator):") {
		t.Fatalf("--help: %v\n%s", err, root)
	}
	for _, path := range [][]string{
		{"claims"}, {"volumes"}, {"volumes", "delete-backing"}, {"drivers"}, {"operations"}, {"reclaims"},
		{"reclaims", "retry"}, {"reclaims", "start"}, {"orphans"}, {"orphans", "delete"}, {"explain"}, {"match"}, {"sync"},
	} {
		t.Run(strings.Join(path, " "), func(t *testing.T) {
			for _, args := range [][]string{append(slices.Clone(path), "--help"), append([]string{"help"}, path...)} {
				out, _, err := run(t, "http://127.0.0.1:1", args...)
				if err != nil {
					t.Fatal(err)
				}
				if out == root || !strings.Contains(out, "Usage:\n  kubectl volplane "+strings.Join(path, " ")) || !strings.Contains(out, "Examples:\n  ") {
					t.Errorf("%v:\n%s", args, out)
				}
			}
		})
	}
}

// --as and its kin, and a kubeconfig user that impersonates, are refused
// before anything is sent: the gateway would act as the credential's user.
func TestImpersonationRefused(t *testing.T) {
	f := &fakeGateway{}
	srv := httptest.NewServer(f)
	defer srv.Close()
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"--as":                {[]string{"claims", "--as", "alice"}, "--as alice: the volplane gateway does not support impersonation"},
		"--as-group":          {[]string{"drivers", "--as-group", "admins"}, "--as groups admins: the volplane gateway does not support impersonation"},
		"--as-uid":            {[]string{"sync", "pvc", "data", "--as-uid", "1"}, "does not support impersonation"},
		"--as-user-extra":     {[]string{"volumes", "--as-user-extra", "scopes=admin"}, "--as user extras scopes=admin: the volplane gateway does not support impersonation"},
		"the kubeconfig's as": {[]string{"claims", "--user", "impersonating"}, `the kubeconfig's user "impersonating" impersonates alice (its as: fields): the volplane gateway does not support impersonation`},
	} {
		t.Run(name, func(t *testing.T) {
			_, _, err := run(t, srv.URL, tc.args...)
			if !errors.Is(err, ErrImpersonation) || !IsUsage(err) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "kubectl create token") {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
	if len(f.auth) > 0 {
		t.Errorf("%d requests sent while impersonating", len(f.auth))
	}
}

// Credentials given as flags (kubectl's --token) go to the gateway too.
func TestTokenFlag(t *testing.T) {
	f := &fakeGateway{}
	srv := httptest.NewServer(f)
	defer srv.Close()
	if _, _, err := run(t, srv.URL, "claims", "--page-size", "5", "--user", "none", "--token", "good"); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(f.auth, []string{"Bearer good"}) {
		t.Errorf("sent %q, want the --token", f.auth)
	}
}

// --version answers as every other volplane binary does (pkg/cmdutil's
// TestEveryBinaryCommandLine): the name, then the build.
func TestVersion(t *testing.T) {
	out, _, err := run(t, "http://127.0.0.1:1", "--version")
	want := "kubectl-volplane " + version.Get().String() + "\n"
	if err != nil || out != want {
		t.Errorf("--version: %q, %v; want %q", out, err, want)
	}
}
