package dynamic

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/volplane/volplane/internal/devcsi"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	"github.com/volplane/volplane/test/harness/e2e"
)

const driverName = devcsi.DefaultName

// class creates a StorageClass of the dev driver (policy Delete,
// Immediate) with a name unique to the test, changed by opts.
func class(t *testing.T, opts ...func(*storagev1.StorageClass)) *storagev1.StorageClass {
	t.Helper()
	policy := corev1.PersistentVolumeReclaimDelete
	sc := &storagev1.StorageClass{
		ObjectMeta:    metav1.ObjectMeta{Name: "dyn-" + rand.String(6)},
		Provisioner:   driverName,
		ReclaimPolicy: &policy,
	}
	for _, o := range opts {
		o(sc)
	}
	return e2e.CreateClass(t, cluster.client, sc)
}

func waitForFirstConsumer(sc *storagev1.StorageClass) {
	m := storagev1.VolumeBindingWaitForFirstConsumer
	sc.VolumeBindingMode = &m
}

// createClaim creates a claim of class cls.
func createClaim(t *testing.T, ns, name, size, cls string, opts ...func(*corev1.PersistentVolumeClaim)) *corev1.PersistentVolumeClaim {
	t.Helper()
	c, err := cluster.client.CoreV1().PersistentVolumeClaims(ns).Create(t.Context(), e2e.Claim(ns, name, size, cls, opts...), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create claim %s/%s: %v", ns, name, err)
	}
	return c
}

// bound waits until the claim is Bound and returns it with its volume.
func bound(t *testing.T, ns, name string) (*corev1.PersistentVolumeClaim, *corev1.PersistentVolume) {
	t.Helper()
	c := e2e.ClaimPhase(t, cluster.client, ns, name, corev1.ClaimBound, 60*time.Second)
	v := e2e.VolumePhase(t, cluster.client, c.Spec.VolumeName, corev1.VolumeBound, 30*time.Second)
	return c, v
}

func pvName(c *corev1.PersistentVolumeClaim) string { return "pvc-" + string(c.UID) }

// driverVolumes lists the ids of the volumes the dev driver holds.
func driverVolumes(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	token := ""
	for {
		resp, err := cluster.csi.ListVolumes(t.Context(), &csi.ListVolumesRequest{StartingToken: token})
		if err != nil {
			t.Fatalf("ListVolumes: %v", err)
		}
		for _, e := range resp.GetEntries() {
			out[e.GetVolume().GetVolumeId()] = true
		}
		if token = resp.GetNextToken(); token == "" {
			return out
		}
	}
}

// added lists the driver volumes in after that were not in before.
// Volumes that went are not counted: earlier tests' volumes are deleted by
// the reclaimer while later tests run.
func added(before, after map[string]bool) []string {
	var out []string
	for id := range after {
		if !before[id] {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out
}

// noneAdded says which driver volumes were added since before, "" if none.
func noneAdded(t *testing.T, before map[string]bool) string {
	if a := added(before, driverVolumes(t)); len(a) > 0 {
		return fmt.Sprintf("driver volumes added: %v", a)
	}
	return ""
}

// operations lists the provisioner's journal for a volume name.
func operations(t *testing.T, volume string) []*provisionerv1.Operation {
	t.Helper()
	cc, err := cluster.e2e.Dial(cluster.provisionerAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	resp, err := provisionerv1.NewProvisionerServiceClient(cc).ListOperations(t.Context(), &provisionerv1.ListOperationsRequest{})
	if err != nil {
		t.Fatalf("ListOperations: %v", err)
	}
	var out []*provisionerv1.Operation
	for _, op := range resp.GetOperations() {
		if op.GetVolumeName() == volume {
			out = append(out, op)
		}
	}
	return out
}

// noJournal waits until the provisioner's journal holds nothing for volume.
func noJournal(t *testing.T, volume string) {
	t.Helper()
	e2e.Eventually(t, 30*time.Second, func() string {
		if ops := operations(t, volume); len(ops) > 0 {
			return fmt.Sprintf("journal still holds %v", ops)
		}
		return ""
	})
}

// faults programs the dev driver's fault injector and clears it when the
// test ends.
func faults(t *testing.T) *devcsi.Faults {
	t.Helper()
	f := cluster.driver.Faults()
	t.Cleanup(func() {
		f.Reset()
	})
	return f
}

// hasEventFrom waits for an event of reason on the claim from component.
func hasEventFrom(t *testing.T, c *corev1.PersistentVolumeClaim, reason, msg, component string) {
	t.Helper()
	if component == driverName {
		// The provisioner's events come from "<driver>_<host>_<uuid>", as
		// external-provisioner's.
		component = driverName + "_"
	}
	e2e.HasEvent(t, cluster.client, c.Namespace, "PersistentVolumeClaim", c.Name, reason, msg, component, 30*time.Second)
}

// logsContain reports whether the services' log holds s.
func logsContain(t *testing.T, s string) bool {
	t.Helper()
	b, err := readLogs()
	if err != nil {
		t.Fatal(err)
	}
	return strings.Contains(string(b), s)
}

// deleteClaim deletes a claim and waits until it is gone.
func deleteClaim(t *testing.T, c *corev1.PersistentVolumeClaim) {
	t.Helper()
	if err := cluster.client.CoreV1().PersistentVolumeClaims(c.Namespace).Delete(context.Background(), c.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete claim %s/%s: %v", c.Namespace, c.Name, err)
	}
	e2e.Eventually(t, 30*time.Second, func() string {
		if _, err := cluster.client.CoreV1().PersistentVolumeClaims(c.Namespace).Get(context.Background(), c.Name, metav1.GetOptions{}); err == nil {
			return "claim still there"
		}
		return ""
	})
}
