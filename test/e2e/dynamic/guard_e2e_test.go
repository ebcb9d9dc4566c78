package dynamic

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/gateway"
	"github.com/volplane/volplane/pkg/kube"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
	"github.com/volplane/volplane/test/harness/e2e"
)

// testGateway is a REST gateway in front of this package's services.
type testGateway struct {
	url string
}

// newTestGateway builds the gateway the way cmd/gateway does, authorizing
// callers against the test cluster's API server. Its callers act as the
// cluster admin (do): every route is allowed, so what refuses a request
// below is the state, never RBAC.
func newTestGateway(t *testing.T) *testGateway {
	t.Helper()
	h, closeAll, err := gateway.NewHandler(context.Background(), gateway.Options{
		BinderAddress: cluster.binderAddr, ProvisionerAddress: cluster.provisionerAddr, ReclaimerAddress: cluster.reclaimerAddr,
		TLS: cluster.e2e.TLS("gateway"), Auth: gateway.AuthOptions{RESTConfig: cluster.env.RESTConfig},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(func() { srv.Close(); closeAll() })
	return &testGateway{url: srv.URL}
}

// do sends a request with the admin's bearer token and returns the status
// and the body.
func (g *testGateway) do(t *testing.T, method, path string, body any) (int, string) {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, g.url+path, r)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+cluster.env.RESTConfig.BearerToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// forgedVolume is pv as a caller could claim it is: Released, policy
// Delete, its claim gone, with the given backing volume handle.
func forgedVolume(t *testing.T, pv *corev1.PersistentVolume, name, handle string) []byte {
	t.Helper()
	f := pv.DeepCopy()
	f.Name = name
	f.Status.Phase = corev1.VolumeReleased
	f.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimDelete
	f.Spec.CSI.VolumeHandle = handle
	f.Spec.ClaimRef.UID = "gone"
	b, err := kube.EncodeProto(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A Bound volume holding data: every destructive route, over gRPC and over
// REST, with the volume's name only or with forged volumes in the request
// (claiming it Released, pointing at its handle from another name, from a
// Released Retain volume, or from a name that does not exist), is refused
// with FailedPrecondition / 409, and the data, the volume and the claim
// stay as they were.
func TestGuardEveryDestructiveRouteRefusesABoundVolume(t *testing.T) {
	ns := e2e.Namespace(t, cluster.client)
	sc := class(t)
	createClaim(t, ns, "victim", "1Gi", sc.Name)
	claim, pv := bound(t, ns, "victim")
	handle := pv.Spec.CSI.VolumeHandle
	data := filepath.Join(cluster.driver.VolumePath(handle), "precious.txt")
	if err := os.WriteFile(data, []byte("do not lose me"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A volume the caller may own: Released, policy Retain.
	retain := corev1.PersistentVolumeReclaimRetain
	kept := class(t, func(sc *storagev1.StorageClass) { sc.ReclaimPolicy = &retain })
	createClaim(t, ns, "mine", "1Gi", kept.Name)
	mineClaim, mine := bound(t, ns, "mine")
	deleteClaim(t, mineClaim)
	e2e.VolumePhase(t, cluster.client, mine.Name, corev1.VolumeReleased, 30*time.Second)
	t.Cleanup(func() {
		_ = cluster.client.CoreV1().PersistentVolumes().Delete(context.Background(), mine.Name, metav1.DeleteOptions{})
	})
	ghost := "pvc-ghost-" + strings.ToLower(ns)

	forgedSame := forgedVolume(t, pv, pv.Name, handle)
	forgedOther := forgedVolume(t, pv, pv.Name, "another-handle")
	forgedMine := forgedVolume(t, mine, mine.Name, handle)
	forgedMine2 := forgedVolume(t, pv, mine.Name, handle)
	forgedGhost := forgedVolume(t, pv, ghost, handle)

	pc, err := cluster.e2e.Dial(cluster.provisionerAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	rc, err := cluster.e2e.Dial(cluster.reclaimerAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	prov, recl := provisionerv1.NewProvisionerServiceClient(pc), reclaimerv1.NewReclaimerServiceClient(rc)
	ctx := t.Context()

	grpcCalls := map[string]func() error{
		"DeleteVolume by name": func() error {
			_, err := prov.DeleteVolume(ctx, &provisionerv1.DeleteVolumeRequest{VolumeName: pv.Name})
			return err
		},
		"DeleteVolume forged as Released": func() error {
			_, err := prov.DeleteVolume(ctx, &provisionerv1.DeleteVolumeRequest{VolumeName: pv.Name, Volume: forgedSame})
			return err
		},
		"DeleteVolume forged with another handle": func() error {
			_, err := prov.DeleteVolume(ctx, &provisionerv1.DeleteVolumeRequest{VolumeName: pv.Name, Volume: forgedOther})
			return err
		},
		"DeleteVolume of a Retain volume forged with its handle": func() error {
			_, err := prov.DeleteVolume(ctx, &provisionerv1.DeleteVolumeRequest{VolumeName: mine.Name, Volume: forgedMine})
			return err
		},
		"DeleteVolume of a Retain volume forged with another UID": func() error {
			_, err := prov.DeleteVolume(ctx, &provisionerv1.DeleteVolumeRequest{VolumeName: mine.Name, Volume: forgedMine2})
			return err
		},
		"DeleteVolume of a name that does not exist": func() error {
			_, err := prov.DeleteVolume(ctx, &provisionerv1.DeleteVolumeRequest{VolumeName: ghost, Volume: forgedGhost})
			return err
		},
		"Reclaim by name": func() error {
			_, err := recl.Reclaim(ctx, &reclaimerv1.ReclaimRequest{VolumeName: pv.Name, VolumeUid: string(pv.UID)})
			return err
		},
		"Reclaim forged as Released": func() error {
			_, err := recl.Reclaim(ctx, &reclaimerv1.ReclaimRequest{VolumeName: pv.Name, Volume: forgedSame})
			return err
		},
		"Reclaim forged with another handle": func() error {
			_, err := recl.Reclaim(ctx, &reclaimerv1.ReclaimRequest{VolumeName: pv.Name, Volume: forgedOther})
			return err
		},
		"Reclaim of a name that does not exist": func() error {
			_, err := recl.Reclaim(ctx, &reclaimerv1.ReclaimRequest{VolumeName: ghost, Volume: forgedGhost})
			return err
		},
		"RetryReclaim": func() error {
			_, err := recl.RetryReclaim(ctx, &reclaimerv1.RetryReclaimRequest{VolumeName: pv.Name})
			return err
		},
		"RetryReclaim of a Retain volume": func() error {
			_, err := recl.RetryReclaim(ctx, &reclaimerv1.RetryReclaimRequest{VolumeName: mine.Name})
			return err
		},
		"RetryReclaim of a name that does not exist": func() error {
			_, err := recl.RetryReclaim(ctx, &reclaimerv1.RetryReclaimRequest{VolumeName: ghost})
			return err
		},
	}
	for name, call := range grpcCalls {
		if err := call(); status.Code(err) != codes.FailedPrecondition {
			t.Errorf("gRPC %s: %v, want FailedPrecondition", name, err)
		}
	}
	// Reclaim of a Released Retain volume forged as Delete only records
	// RETAINED (the binder hands over every released volume): nothing is
	// destroyed.
	if r, err := recl.Reclaim(ctx, &reclaimerv1.ReclaimRequest{VolumeName: mine.Name, Volume: forgedMine}); err != nil || r.Reclaim.State != reclaimerv1.State_STATE_RETAINED {
		t.Errorf("gRPC Reclaim of a Retain volume forged as Delete: %v %v, want RETAINED", r, err)
	}

	gw := newTestGateway(t)
	b64 := base64.StdEncoding.EncodeToString
	type restCall struct {
		method, path string
		body         any
	}
	restCalls := map[string]restCall{
		"deleteBacking by name":                       {"POST", "/v1/volumes/" + pv.Name + ":deleteBacking", map[string]any{}},
		"deleteBacking forged as Released":            {"POST", "/v1/volumes/" + pv.Name + ":deleteBacking?" + url.Values{"volume": {b64(forgedSame)}}.Encode(), map[string]any{}},
		"deleteBacking forged with another handle":    {"POST", "/v1/volumes/" + pv.Name + ":deleteBacking?" + url.Values{"volume": {b64(forgedOther)}}.Encode(), nil},
		"deleteBacking of a Retain volume":            {"POST", "/v1/volumes/" + mine.Name + ":deleteBacking?" + url.Values{"volume": {b64(forgedMine)}}.Encode(), nil},
		"deleteBacking of a name that does not exist": {"POST", "/v1/volumes/" + ghost + ":deleteBacking?" + url.Values{"volume": {b64(forgedGhost)}}.Encode(), nil},
		"reclaims by name":                            {"POST", "/v1/reclaims", map[string]any{"volumeName": pv.Name}},
		"reclaims forged as Released":                 {"POST", "/v1/reclaims", map[string]any{"volumeName": pv.Name, "volume": b64(forgedSame)}},
		"reclaims forged with another handle":         {"POST", "/v1/reclaims", map[string]any{"volumeName": pv.Name, "volumeUid": string(pv.UID), "volume": b64(forgedOther)}},
		"reclaims of a name that does not exist":      {"POST", "/v1/reclaims", map[string]any{"volumeName": ghost, "volume": b64(forgedGhost)}},
		"retry":                                       {"POST", "/v1/reclaims/" + pv.Name + ":retry", map[string]any{}},
		"retry of a Retain volume":                    {"POST", "/v1/reclaims/" + mine.Name + ":retry", map[string]any{"volumeName": pv.Name}},
		"retry of a name that does not exist":         {"POST", "/v1/reclaims/" + ghost + ":retry", nil},
	}
	for name, c := range restCalls {
		if code, body := gw.do(t, c.method, c.path, c.body); code != http.StatusConflict {
			t.Errorf("REST %s: %d %s, want 409", name, code, body)
		}
	}

	// Nothing was lost: the data, the backing volume, the PV and the claim.
	if b, err := os.ReadFile(data); err != nil || string(b) != "do not lose me" {
		t.Errorf("the volume's data: %q, %v", b, err)
	}
	if !driverVolumes(t)[handle] || len(cluster.requests.deletesOf(handle)) != 0 {
		t.Errorf("the driver was asked to delete %s (%d calls)", handle, len(cluster.requests.deletesOf(handle)))
	}
	if got := e2e.VolumePhase(t, cluster.client, pv.Name, corev1.VolumeBound, 5*time.Second); got.UID != pv.UID || got.Spec.ClaimRef.UID != claim.UID {
		t.Errorf("volume %s: %+v", pv.Name, got.Spec.ClaimRef)
	}
	if got := e2e.ClaimPhase(t, cluster.client, ns, "victim", corev1.ClaimBound, 5*time.Second); got.Spec.VolumeName != pv.Name {
		t.Errorf("claim bound to %q", got.Spec.VolumeName)
	}
	if r := reclaimOf(t, pv.Name); r.State != reclaimerv1.State_STATE_UNSPECIFIED {
		t.Errorf("a reclaim of the Bound volume exists: %v", r)
	}
	if !driverVolumes(t)[mine.Spec.CSI.VolumeHandle] {
		t.Errorf("the Retain volume's backing volume is gone")
	}
}

// Provision with a forged claim (a far bigger request, another node) and a
// forged class (a secret of another namespace, other parameters), even
// with the real objects' UID and resourceVersion, over gRPC and REST:
// CreateVolume gets only what the real claim and class say, and the
// forged secret is never read.
func TestGuardProvisionIgnoresForgedObjects(t *testing.T) {
	ns := e2e.Namespace(t, cluster.client)
	secretNS := e2e.Namespace(t, cluster.client)
	if _, err := cluster.client.CoreV1().Secrets(secretNS).Create(t.Context(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "admin"}, StringData: map[string]string{"password": e2e.Secret("forged-secret-value")},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sc := class(t, func(sc *storagev1.StorageClass) { sc.Parameters = map[string]string{"tier": "gold"} })
	created := createClaim(t, ns, "data", "1Mi", sc.Name)

	forge := func(c *corev1.PersistentVolumeClaim, cls *storagev1.StorageClass) ([]byte, []byte) {
		fc := c.DeepCopy()
		fc.Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse("1Ti")
		fs := cls.DeepCopy()
		fs.Parameters = map[string]string{"tier": "platinum",
			"csi.storage.k8s.io/provisioner-secret-name": "admin", "csi.storage.k8s.io/provisioner-secret-namespace": secretNS}
		cb, err := kube.EncodeProto(fc)
		if err != nil {
			t.Fatal(err)
		}
		sb, err := kube.EncodeProto(fs)
		if err != nil {
			t.Fatal(err)
		}
		return cb, sb
	}
	cb, sb := forge(created, sc)
	pc, err := cluster.e2e.Dial(cluster.provisionerAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	// The binder provisions the claim too; whichever call comes first, the
	// driver sees the real claim and class.
	_, err = provisionerv1.NewProvisionerServiceClient(pc).Provision(t.Context(), &provisionerv1.ProvisionRequest{
		ClaimNamespace: ns, ClaimName: "data", ClaimUid: string(created.UID), Claim: cb, StorageClass: sb})
	if err != nil {
		t.Fatalf("Provision with forged objects: %v", err)
	}
	gw := newTestGateway(t)
	if code, body := gw.do(t, "POST", "/v1/provisions", map[string]any{"claimNamespace": ns, "claimName": "data",
		"claimUid": string(created.UID), "claim": base64.StdEncoding.EncodeToString(cb), "storageClass": base64.StdEncoding.EncodeToString(sb)}); code != http.StatusOK {
		t.Errorf("REST provision with forged objects: %d %s", code, body)
	}
	// Another namespace's claim in the bytes is refused outright.
	other, _ := kube.EncodeProto(&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: secretNS, Name: "data", UID: created.UID}})
	if code, body := gw.do(t, "POST", "/v1/provisions", map[string]any{"claimNamespace": ns, "claimName": "data",
		"claimUid": string(created.UID), "claim": base64.StdEncoding.EncodeToString(other)}); code != http.StatusBadRequest {
		t.Errorf("REST provision with a claim of another namespace: %d %s, want 400", code, body)
	}

	c, pv := bound(t, ns, "data")
	// Forged again with the real objects' UID and resourceVersion.
	class, err := cluster.client.StorageV1().StorageClasses().Get(t.Context(), sc.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cb, sb = forge(c, class)
	if _, err := provisionerv1.NewProvisionerServiceClient(pc).Provision(t.Context(), &provisionerv1.ProvisionRequest{
		ClaimNamespace: ns, ClaimName: "data", ClaimUid: string(c.UID), Claim: cb, StorageClass: sb}); err != nil {
		t.Fatalf("Provision forged with the real resourceVersions: %v", err)
	}

	creates := cluster.requests.createsFor(pv.Name)
	if len(creates) == 0 {
		t.Fatalf("no CreateVolume for %s", pv.Name)
	}
	for i, q := range creates {
		if q.GetCapacityRange().GetRequiredBytes() != 1<<20 || q.GetParameters()["tier"] != "gold" || len(q.GetSecrets()) != 0 {
			t.Errorf("CreateVolume %d got forged values: %d bytes, parameters %v, %d secrets", i, q.GetCapacityRange().GetRequiredBytes(), q.GetParameters(), len(q.GetSecrets()))
		}
	}
	if q := pv.Spec.Capacity[corev1.ResourceStorage]; q.Cmp(resource.MustParse("1Ti")) >= 0 {
		t.Errorf("volume of %s", q.String())
	}
	if logsContain(t, "forged-secret-value") || logsContain(t, fmt.Sprintf("secret %s/admin", secretNS)) {
		t.Error("the forged secret was read")
	}
}
