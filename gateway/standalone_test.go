package gateway

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/kube"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// standaloneProvisioner answers what the standalone explain and timeline
// ask of the provisioner.
type standaloneProvisioner struct {
	provisionerv1.UnimplementedProvisionerServiceServer
}

func (standaloneProvisioner) ListDrivers(context.Context, *provisionerv1.ListDriversRequest) (*provisionerv1.ListDriversResponse, error) {
	return &provisionerv1.ListDriversResponse{Drivers: []*provisionerv1.Driver{{ProvisionerName: "csi.example.com", DriverName: "csi.example.com", Ready: true}}}, nil
}

func (standaloneProvisioner) ListOperations(_ context.Context, req *provisionerv1.ListOperationsRequest) (*provisionerv1.ListOperationsResponse, error) {
	if req.GetClaimUid() != "uid-1" {
		return &provisionerv1.ListOperationsResponse{}, nil
	}
	return &provisionerv1.ListOperationsResponse{Operations: []*provisionerv1.Operation{{Kind: "provision", VolumeName: "pvc-uid-1", Attempts: 2, ClaimUid: "uid-1"}}}, nil
}

func (standaloneProvisioner) GetClaimTimeline(_ context.Context, req *provisionerv1.GetClaimTimelineRequest) (*provisionerv1.GetClaimTimelineResponse, error) {
	return &provisionerv1.GetClaimTimelineResponse{Spans: []*provisionerv1.TimelineSpan{{Name: "CreateVolume", Detail: req.GetClaimUid()}}}, nil
}

// newStandaloneGateway is a gateway in standalone mode, a provisioner
// backend, and a claim of a served class in the fake API server.
func newStandaloneGateway(t *testing.T) *testGateway {
	t.Helper()
	provAddr, _, _ := startBackend(t, func(s *grpc.Server) { provisionerv1.RegisterProvisionerServiceServer(s, standaloneProvisioner{}) })
	c := newFakeCluster()
	class := "fast"
	if _, err := c.cs.StorageV1().StorageClasses().Create(t.Context(), &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: class}, Provisioner: "csi.example.com"}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.cs.CoreV1().PersistentVolumeClaims("ns").Create(t.Context(), &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "data", UID: "uid-1", Annotations: map[string]string{kube.AnnStorageProvisioner: "csi.example.com"}},
		Spec:       corev1.PersistentVolumeClaimSpec{StorageClassName: &class}, Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimPending},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h, closeAll, err := NewHandler(t.Context(), Options{
		Standalone: true, ProvisionerAddress: provAddr,
		TLS:    grpcutil.TLSFiles{InsecurePlaintext: true},
		Auth:   AuthOptions{Client: c.cs, TokenCacheTTL: -1, AllowedCacheTTL: -1, DeniedCacheTTL: -1},
		Logger: discard(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeAll)
	web := httptest.NewServer(h)
	t.Cleanup(web.Close)
	return &testGateway{url: web.URL, cluster: c, handler: h}
}

// Every route that needs volplane's binder answers FailedPrecondition
// naming the mode; authorization still comes first.
func TestStandaloneBinderRoutesNameTheMode(t *testing.T) {
	g := newStandaloneGateway(t)
	for _, r := range []struct{ method, path, token string }{
		{"GET", "/v1/claims", "viewer-token"},
		{"GET", "/v1/namespaces/ns/claims", "viewer-token"},
		{"GET", "/v1/namespaces/ns/claims/data", "viewer-token"},
		{"GET", "/v1/volumes", "viewer-token"},
		{"GET", "/v1/volumes/pv-1", "viewer-token"},
		{"GET", "/v1/binder/status", "viewer-token"},
		{"POST", "/v1/namespaces/ns/claims/data:sync", "operator-token"},
		{"POST", "/v1/volumes/pv-1:sync", "operator-token"},
		{"POST", "/v1/claims:match", "viewer-token"},
	} {
		var body io.Reader
		if r.method == "POST" {
			body = strings.NewReader(`{"spec":{"accessModes":["ReadWriteOnce"],"resources":{"requests":{"storage":"1Gi"}}}}`)
		}
		resp, e := g.do(t, r.method, r.path, r.token, body, "Content-Type", "application/json")
		if resp.StatusCode != http.StatusConflict || e.Code != 9 || !strings.HasPrefix(e.Message, "volplane runs in standalone mode: kube-controller-manager binds claims, so ") {
			t.Errorf("%s %s: %s code %d %q; want 409, FailedPrecondition naming standalone mode", r.method, r.path, resp.Status, e.Code, e.Message)
		}
	}
	if resp, _ := g.do(t, "GET", "/v1/claims", "", nil); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET /v1/claims without a credential: %s, want 401", resp.Status)
	}
	if resp, _ := g.do(t, "POST", "/v1/volumes/pv-1:sync", "viewer-token", nil); resp.StatusCode != http.StatusForbidden {
		t.Errorf("a viewer's sync: %s, want 403", resp.Status)
	}
}

// getJSON GETs path as the viewer and decodes the 200 answer.
func getJSON(t *testing.T, g *testGateway, path string, into any) {
	t.Helper()
	req, _ := http.NewRequest("GET", g.url+path, nil)
	req.Header.Set("Authorization", "Bearer viewer-token")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %s %s", path, resp.Status, b)
	}
	if err := json.Unmarshal(b, into); err != nil {
		t.Fatalf("GET %s: %v in %s", path, err, b)
	}
}

// Explain and timeline answer the provisioning side.
func TestStandaloneExplainAndTimeline(t *testing.T) {
	g := newStandaloneGateway(t)
	var ex struct {
		Claim        struct{ UID string }
		Message      string
		Provisioning struct {
			Served, Requested bool
			Provisioner       string
			Operation         struct {
				VolumeName string
				Attempts   int
			}
		}
	}
	getJSON(t, g, "/v1/namespaces/ns/claims/data:explain", &ex)
	p := ex.Provisioning
	if ex.Claim.UID != "uid-1" || !p.Served || !p.Requested || p.Provisioner != "csi.example.com" || p.Operation.VolumeName != "pvc-uid-1" || p.Operation.Attempts != 2 ||
		!strings.Contains(ex.Message, "standalone mode") {
		t.Errorf("explain: %+v", ex)
	}
	var tl struct {
		Spans   []struct{ Name, Detail string }
		Missing []string
	}
	getJSON(t, g, "/v1/namespaces/ns/claims/data:timeline", &tl)
	if len(tl.Spans) != 1 || tl.Spans[0].Name != "CreateVolume" || tl.Spans[0].Detail != "uid-1" || len(tl.Missing) != 1 || !strings.Contains(tl.Missing[0], "standalone mode") {
		t.Errorf("timeline: %+v", tl)
	}
	if resp, e := g.do(t, "GET", "/v1/namespaces/ns/claims/gone:explain", "viewer-token", nil); resp.StatusCode != http.StatusNotFound {
		t.Errorf("explain of a missing claim: %s %q, want 404", resp.Status, e.Message)
	}
}

func TestStandaloneRefusesABinderAddress(t *testing.T) {
	_, _, err := NewHandler(t.Context(), Options{Standalone: true, BinderAddress: "127.0.0.1:7702", TLS: grpcutil.TLSFiles{InsecurePlaintext: true},
		Auth: AuthOptions{Client: newFakeCluster().cs}, Logger: discard()})
	if err == nil || !strings.Contains(err.Error(), "standalone mode") {
		t.Errorf("standalone with a binder address: %v", err)
	}
}
