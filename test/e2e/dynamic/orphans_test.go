package dynamic

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/encoding/protojson"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	"github.com/volplane/volplane/test/harness/e2e"
)

// roleToken makes a ServiceAccount in namespace bound to the ClusterRole
// role of deploy/kubernetes/roles.yaml (created from the file itself) and
// returns a token for it.
func roleToken(t *testing.T, namespace, role string) string {
	t.Helper()
	ctx := context.Background()
	f, err := os.Open(filepath.Join("..", "..", "..", "deploy", "kubernetes", "roles.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	var found *rbacv1.ClusterRole
	for {
		var cr rbacv1.ClusterRole
		if err := dec.Decode(&cr); err != nil {
			break
		}
		if cr.Name == role {
			found = &cr
		}
	}
	if found == nil {
		t.Fatalf("roles.yaml has no ClusterRole %s", role)
	}
	found.Name = role + "-" + namespace // the file as it is, whatever another test made
	if _, err := cluster.client.RbacV1().ClusterRoles().Create(ctx, found, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	name := strings.TrimPrefix(role, "volplane-")
	if _, err := cluster.client.CoreV1().ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: found.Name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: found.Name},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: namespace}}}
	if _, err := cluster.client.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.client.RbacV1().ClusterRoleBindings().Delete(context.Background(), crb.Name, metav1.DeleteOptions{})
		_ = cluster.client.RbacV1().ClusterRoles().Delete(context.Background(), found.Name, metav1.DeleteOptions{})
	})
	tr, err := cluster.client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authnv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// call sends a request to the gateway with token.
func (g *testGateway) call(t *testing.T, method, path, token, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, g.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// orphansOf lists the orphan report over REST.
func orphansOf(t *testing.T, g *testGateway, token string) *provisionerv1.ListOrphansResponse {
	t.Helper()
	code, body := g.call(t, http.MethodGet, "/v1/orphans", token, "")
	if code != http.StatusOK {
		t.Fatalf("GET /v1/orphans: %d %s", code, body)
	}
	var out provisionerv1.ListOrphansResponse
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal([]byte(body), &out); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	return &out
}

func findOrphan(r *provisionerv1.ListOrphansResponse, id string) *provisionerv1.Orphan {
	for _, o := range r.GetOrphans() {
		if o.GetVolumeId() == id {
			return o
		}
	}
	return nil
}

func deleteOrphanBody(id string) string {
	return fmt.Sprintf(`{"driverName":%q,"volumeId":%q}`, driverName, id)
}

// A volume made on the driver behind volplane's back is reported, with its
// size and age, and an operator deletes it through the REST gateway; a
// viewer may not. A provisioned volume with its PV is never reported nor
// deletable; a PV whose volume the driver does not have is reported.
func TestOrphansAreReportedAndDeletedOnlyWhileOrphans(t *testing.T) {
	ns := e2e.Namespace(t, cluster.client)
	g := newTestGateway(t)
	operator := roleToken(t, ns, "volplane-operator")
	viewer := roleToken(t, ns, "volplane-viewer")

	before := time.Now().Add(-time.Second)
	resp, err := cluster.csi.CreateVolume(t.Context(), &csi.CreateVolumeRequest{Name: "leak-" + rand.String(8),
		CapacityRange:      &csi.CapacityRange{RequiredBytes: 2 * gib},
		VolumeCapabilities: []*csi.VolumeCapability{{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}}, AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}}})
	if err != nil {
		t.Fatalf("CreateVolume on the driver: %v", err)
	}
	leak := resp.GetVolume().GetVolumeId()

	sc := class(t)
	createClaim(t, ns, "kept", "1Gi", sc.Name)
	_, pv := bound(t, ns, "kept")
	kept := pv.Spec.CSI.VolumeHandle

	// A static PV naming a volume the driver does not have.
	missing := "vol-" + strings.Repeat("0", 24) + rand.String(8)
	ghost := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "ghost-" + rand.String(6)}, Spec: corev1.PersistentVolumeSpec{
		Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("3Gi")},
		AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
		StorageClassName:              "ghost-" + rand.String(6),
		PersistentVolumeSource:        corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driverName, VolumeHandle: missing}}}}
	if ghost, err = cluster.client.CoreV1().PersistentVolumes().Create(t.Context(), ghost, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.client.CoreV1().PersistentVolumes().Delete(context.Background(), ghost.Name, metav1.DeleteOptions{})
	})

	var report *provisionerv1.ListOrphansResponse
	e2e.Eventually(t, 30*time.Second, func() string {
		report = orphansOf(t, g, viewer)
		if o := findOrphan(report, leak); o == nil || o.GetUncertain() != "" {
			return fmt.Sprintf("the leaked volume %s is not (certainly) reported: %v", leak, o)
		}
		return ""
	})
	o := findOrphan(report, leak)
	if o.GetKind() != provisionerv1.OrphanKind_ORPHAN_KIND_VOLUME || o.GetDriverName() != driverName || o.GetCapacityBytes() != 2*gib {
		t.Errorf("leak reported as %v", o)
	}
	if at := o.GetCreateTime().AsTime(); o.GetCreateTime() == nil || at.Before(before.Truncate(time.Second)) || at.After(time.Now()) {
		t.Errorf("leak's creation time %v, want about now", o.GetCreateTime())
	}
	if o := findOrphan(report, kept); o != nil {
		t.Errorf("the volume of a Bound PV is reported: %v", o)
	}
	if o := findOrphan(report, missing); o == nil || o.GetKind() != provisionerv1.OrphanKind_ORPHAN_KIND_PERSISTENT_VOLUME ||
		o.GetPersistentVolumeName() != ghost.Name || o.GetCapacityBytes() != 3*gib {
		t.Errorf("the PV without a volume is reported as %v", o)
	}
	checked := false
	for _, d := range report.GetDrivers() {
		checked = checked || (d.GetDriverName() == driverName && d.GetChecked() && d.GetVolumesListed() > 0)
	}
	if !checked {
		t.Errorf("drivers %v: the dev driver is not said to be checked", report.GetDrivers())
	}

	if code, body := g.call(t, http.MethodPost, "/v1/orphans:delete", viewer, deleteOrphanBody(leak)); code != http.StatusForbidden {
		t.Errorf("a viewer deletes an orphan: %d %s, want 403", code, body)
	}
	if code, body := g.call(t, http.MethodPost, "/v1/orphans:delete", operator, deleteOrphanBody(kept)); code != http.StatusConflict || !strings.Contains(body, pv.Name) {
		t.Errorf("the operator deletes a Bound PV's volume: %d %s, want 409 naming %s", code, body, pv.Name)
	}
	if !driverVolumes(t)[kept] {
		t.Fatal("the Bound PV's volume is gone")
	}
	e2e.Eventually(t, 30*time.Second, func() string {
		// A provisioning of another test still in flight makes it
		// uncertain (409) until it ends.
		code, body := g.call(t, http.MethodPost, "/v1/orphans:delete", operator, deleteOrphanBody(leak))
		if code != http.StatusOK {
			return fmt.Sprintf("delete the leak: %d %s", code, body)
		}
		return ""
	})
	if driverVolumes(t)[leak] {
		t.Error("the leaked volume is still on the driver")
	}
	if code, body := g.call(t, http.MethodPost, "/v1/orphans:delete", operator, deleteOrphanBody(leak)); code != http.StatusNotFound {
		t.Errorf("delete it again: %d %s, want 404", code, body)
	}
	if o := findOrphan(orphansOf(t, g, viewer), leak); o != nil {
		t.Errorf("still reported after its deletion: %v", o)
	}
	if logsContain(t, operator) || logsContain(t, viewer) {
		t.Error("a caller's token is in the services' log")
	}
}
