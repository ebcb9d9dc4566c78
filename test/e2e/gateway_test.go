package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/volplane/volplane/gateway"
)

// gatewayAuth authenticates and authorizes the tests' gateways with the
// cluster's own TokenReviews and SubjectAccessReviews.
func gatewayAuth() gateway.AuthOptions {
	return gateway.AuthOptions{RESTConfig: cluster.env.RESTConfig}
}

// adminDo sends req with the admin's bearer token (system:masters: every
// route is allowed).
func adminDo(t *testing.T, req *http.Request) *http.Response {
	t.Helper()
	req.Header.Set("Authorization", "Bearer "+cluster.env.RESTConfig.BearerToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func getJSON(t *testing.T, url string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp := adminDo(t, req)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("GET %s: %d, not JSON: %s", url, resp.StatusCode, b)
	}
	return resp.StatusCode, m
}

// The README's demo through the REST gateway: a bound claim shows up Bound
// with its volume; errors carry the right status.
func TestGatewayServesBindingState(t *testing.T) {
	h, closeAll, err := gateway.NewHandler(context.Background(), gateway.Options{
		BinderAddress: cluster.binderAddr, WatcherAddress: cluster.watcherAddr, TLS: cluster.e2e.TLS("gateway"), Auth: gatewayAuth(),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll()
	srv := httptest.NewServer(h)
	defer srv.Close()

	n := ns(t)
	createPV(t, n+"-gw-pv", "1Gi", "gw")
	createPVC(t, n, "gw-claim", "1Gi", "gw")
	pvcPhase(t, n, "gw-claim", corev1.ClaimBound)

	eventually(t, 30*time.Second, func() string {
		code, body := getJSON(t, srv.URL+"/v1/namespaces/"+n+"/claims/gw-claim")
		claim, _ := body["claim"].(map[string]any)
		if code != 200 || claim["phase"] != "Bound" || claim["volumeName"] != n+"-gw-pv" {
			return "claim through the gateway: " + string(mustJSON(body))
		}
		return ""
	})
	code, body := getJSON(t, srv.URL+"/v1/volumes/"+n+"-gw-pv")
	vol, _ := body["volume"].(map[string]any)
	if code != 200 || vol["phase"] != "Bound" {
		t.Errorf("volume through the gateway: %d %s", code, mustJSON(body))
	}
	if code, body := getJSON(t, srv.URL+"/v1/namespaces/"+n+"/claims/nope"); code != http.StatusNotFound {
		t.Errorf("unknown claim: %d %s, want 404", code, mustJSON(body))
	}
	if code, body := getJSON(t, srv.URL+"/v1/claims?pageSize=-1"); code != http.StatusBadRequest {
		t.Errorf("negative page size: %d %s, want 400", code, mustJSON(body))
	}
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/namespaces/"+n+"/claims/gw-claim:sync", nil)
	resp := adminDo(t, req)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("sync a claim: %s, want 200", resp.Status)
	}
	req, _ = http.NewRequest(http.MethodPost, srv.URL+"/v1/namespaces/"+n+"/claims/nope:sync", nil)
	resp = adminDo(t, req)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("sync an unknown claim: %s, want 404", resp.Status)
	}
	if code, body := getJSON(t, srv.URL+"/v1/watcher/status"); code != 200 || body["synced"] != true {
		t.Errorf("watcher status: %d %s", code, mustJSON(body))
	}
	if code, body := getJSON(t, srv.URL+"/readyz"); code != 200 {
		t.Errorf("readyz: %d %s", code, mustJSON(body))
	}
	if code, body := getJSON(t, srv.URL+"/openapi.json"); code != 200 || body["swagger"] != "2.0" {
		t.Errorf("openapi: %d", code)
	}
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}
