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
	"strconv"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"
)

// fakeGateway answers like the gateway: claims in pages of the pageSize
// asked for, an explain answer in two pages, match echoing the claim, and
// refusals. It records each request's Authorization header.
type fakeGateway struct {
	auth  []string
	match []byte
}

func (f *fakeGateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.auth = append(f.auth, r.Header.Get("Authorization"))
	w.Header().Set("Content-Type", "application/json")
	if r.Header.Get("Authorization") != "Bearer good" {
		w.WriteHeader(http.StatusUnauthorized)
		io.WriteString(w, `{"code":16,"message":"unauthorized: send a bearer token","details":[]}`)
		return
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
	case r.URL.Path == "/v1/namespaces/team/claims/data:explain":
		if r.URL.Query().Get("pageToken") == "" {
			io.WriteString(w, `{"claim":{"name":"data","phase":"Pending"},"wouldBind":"","candidates":[{"volumeName":"pv-a","rejectedBy":"capacity","detail":{"capacityBytes":"1"}}],"nextPageToken":"p2"}`)
			return
		}
		io.WriteString(w, `{"claim":{"name":"data","phase":"Pending"},"wouldBind":"","candidates":[{"volumeName":"pv-b","rejectedBy":"class"}],"nextPageToken":""}`)
	case r.URL.Path == "/v1/claims:match" && r.Method == http.MethodPost:
		f.match, _ = io.ReadAll(r.Body)
		io.WriteString(w, `{"outcome":"PROVISION","provision":{"driver":"fast.csi","parameters":{"type":"ssd"}}}`)
	case r.URL.Path == "/v1/drivers":
		w.WriteHeader(http.StatusForbidden)
		io.WriteString(w, `{"code":7,"message":"drivers.volplane.io is forbidden: User \"x\" cannot list resource \"drivers\"","details":[]}`)
	default:
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, `{"code":5,"message":"Not Found","details":[]}`)
	}
}

// kubeconfigFile writes a kubeconfig whose context "ctx" is in namespace
// team, with users "good" (token good), "stale" (token bad) and "none".
func kubeconfigFile(t *testing.T) string {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["c"] = &clientcmdapi.Cluster{Server: "https://127.0.0.1:1"}
	cfg.AuthInfos["good"] = &clientcmdapi.AuthInfo{Token: "good"}
	cfg.AuthInfos["stale"] = &clientcmdapi.AuthInfo{Token: "bad"}
	cfg.AuthInfos["none"] = &clientcmdapi.AuthInfo{}
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
	var out, errOut bytes.Buffer
	kc := kubeconfigFile(t)
	err := Run(context.Background(), append([]string{"--kubeconfig", kc, "--gateway", gw}, args...), Streams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
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

func TestExplainAndMatchShowAnyAnswer(t *testing.T) {
	f := &fakeGateway{}
	srv := httptest.NewServer(f)
	defer srv.Close()
	out, _, err := run(t, srv.URL, "explain", "pvc", "data")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Claim:\n  Name:   data\n  Phase:  Pending", "Would Bind:  <none>", "VOLUME NAME   REJECTED BY   DETAIL.CAPACITY BYTES", "pv-a", "pv-b"} {
		if !strings.Contains(out, want) {
			t.Errorf("explain output lacks %q:\n%s", want, out)
		}
	}
	out, _, err = run(t, srv.URL, "explain", "pvc/data", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out, "{\n    \"claim\"") || strings.Count(out, "volumeName") != 2 || strings.Contains(out, "nextPageToken") {
		t.Errorf("explain -o json keeps the answer's order and merges the pages:\n%s", out)
	}

	claim := filepath.Join(t.TempDir(), "claim.yaml")
	os.WriteFile(claim, []byte("apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: new}\nspec:\n  storageClassName: fast\n  accessModes: [ReadWriteOnce]\n  resources: {requests: {storage: 1Gi}}\n"), 0o600)
	out, _, err = run(t, srv.URL, "match", "-f", claim)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "Outcome:  PROVISION") || !strings.Contains(out, "  Parameters:\n    Type:  ssd") {
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

func TestTitle(t *testing.T) {
	for in, want := range map[string]string{"storageClassName": "Storage Class Name", "volumeId": "Volume Id", "node_affinity": "Node Affinity", "CSIDriver": "CSI Driver", "uid": "Uid"} {
		if got := title(in); got != want {
			t.Errorf("title(%q) = %q, want %q", in, got, want)
		}
	}
}
