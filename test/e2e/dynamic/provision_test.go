package dynamic

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/test/harness/e2e"
)

func TestProvisionMakesTheVolumeAUserExpects(t *testing.T) {
	ns := e2e.Namespace(t, cluster.client)
	sc := class(t, func(sc *storagev1.StorageClass) {
		sc.Parameters = map[string]string{"tier": "gold", "csi.storage.k8s.io/fstype": "xfs"}
		sc.MountOptions = []string{"noatime"}
	})
	createClaim(t, ns, "data", "1Gi", sc.Name)
	c, pv := bound(t, ns, "data")

	if pv.Name != pvName(c) {
		t.Errorf("PV name %q, want pvc-<claim UID>", pv.Name)
	}
	src := pv.Spec.CSI
	if src == nil || src.Driver != driverName || src.VolumeHandle == "" || src.VolumeHandle != cluster.requests.idOf(pv.Name) || src.FSType != "xfs" {
		t.Fatalf("CSI source %+v", src)
	}
	if q := pv.Spec.Capacity[corev1.ResourceStorage]; q.Cmp(resource.MustParse("1Gi")) != 0 {
		t.Errorf("capacity %s", q.String())
	}
	if pv.Annotations[kube.AnnDynamicallyProvisioned] != driverName || pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete ||
		len(pv.Finalizers) != 1 || pv.Finalizers[0] != kube.FinalizerExternalProvisioner {
		t.Errorf("provisioned-by %q, policy %s, finalizers %v", pv.Annotations[kube.AnnDynamicallyProvisioned], pv.Spec.PersistentVolumeReclaimPolicy, pv.Finalizers)
	}
	if ref := pv.Spec.ClaimRef; ref == nil || ref.UID != c.UID || ref.Name != "data" || ref.Namespace != ns {
		t.Errorf("claimRef %v", ref)
	}
	if len(pv.Spec.MountOptions) != 1 || pv.Spec.MountOptions[0] != "noatime" || pv.Spec.StorageClassName != sc.Name {
		t.Errorf("mount options %v, class %q", pv.Spec.MountOptions, pv.Spec.StorageClassName)
	}
	if a := pv.Spec.NodeAffinity; a == nil || a.Required.NodeSelectorTerms[0].MatchExpressions[0].Key != devcsi.TopologyKey ||
		a.Required.NodeSelectorTerms[0].MatchExpressions[0].Values[0] != "node-a" {
		t.Errorf("node affinity %v, want the driver's node", a)
	}
	if metav1.HasAnnotation(pv.ObjectMeta, kube.AnnBoundByController) {
		t.Error("a provisioned PV carries bound-by-controller; Kubernetes sets it on the claim only")
	}
	for _, k := range []string{kube.AnnStorageProvisioner, kube.AnnBetaStorageProvisioner} {
		if c.Annotations[k] != driverName {
			t.Errorf("claim annotation %s = %q", k, c.Annotations[k])
		}
	}
	if c.Annotations[kube.AnnBindCompleted] != "yes" || c.Annotations[kube.AnnBoundByController] != "yes" {
		t.Errorf("claim annotations %v", c.Annotations)
	}
	if q := c.Status.Capacity[corev1.ResourceStorage]; q.Cmp(resource.MustParse("1Gi")) != 0 || len(c.Status.AccessModes) != 1 {
		t.Errorf("claim status %+v", c.Status)
	}

	reqs := cluster.requests.createsFor(pv.Name)
	if len(reqs) != 1 {
		t.Fatalf("%d CreateVolume calls, want 1", len(reqs))
	}
	req := reqs[0]
	wantParams := map[string]string{"tier": "gold", "csi.storage.k8s.io/pvc/name": "data", "csi.storage.k8s.io/pvc/namespace": ns, "csi.storage.k8s.io/pv/name": pv.Name}
	if fmt.Sprint(req.GetParameters()) != fmt.Sprint(wantParams) {
		t.Errorf("parameters %v, want %v", req.GetParameters(), wantParams)
	}
	if req.GetCapacityRange().GetRequiredBytes() != 1<<30 || req.GetCapacityRange().GetLimitBytes() != 0 {
		t.Errorf("capacity range %v", req.GetCapacityRange())
	}
	if caps := req.GetVolumeCapabilities(); len(caps) != 1 || caps[0].GetMount().GetFsType() != "xfs" ||
		// The dev driver has SINGLE_NODE_MULTI_WRITER, so ReadWriteOnce is
		// asked for as that, as external-provisioner does.
		caps[0].GetMount().GetMountFlags()[0] != "noatime" || caps[0].GetAccessMode().GetMode() != csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER {
		t.Errorf("capabilities %v", caps)
	}
	hasEventFrom(t, c, kube.EventExternalProvisioning, driverName, kube.ControllerComponent)
	hasEventFrom(t, c, kube.EventProvisioning, "External provisioner is provisioning volume for claim", driverName)
	hasEventFrom(t, c, kube.EventProvisioningSucceeded, "Successfully provisioned volume "+pv.Name, driverName)
	noJournal(t, pv.Name)
}

func TestProvisionFiftyClaimsAtOnce(t *testing.T) {
	ns := e2e.Namespace(t, cluster.client)
	sc := class(t)
	const n = 50
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := cluster.client.CoreV1().PersistentVolumeClaims(ns).Create(context.Background(),
				e2e.Claim(ns, fmt.Sprintf("c-%02d", i), "1Gi", sc.Name), metav1.CreateOptions{})
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	e2e.Eventually(t, 90*time.Second, func() string {
		list, err := cluster.client.CoreV1().PersistentVolumeClaims(ns).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			return err.Error()
		}
		b := 0
		for _, c := range list.Items {
			if c.Status.Phase == corev1.ClaimBound {
				b++
			}
		}
		if b < n {
			return fmt.Sprintf("%d of %d claims Bound", b, n)
		}
		return ""
	})
	list, _ := cluster.client.CoreV1().PersistentVolumeClaims(ns).List(t.Context(), metav1.ListOptions{})
	vols := driverVolumes(t)
	seen := map[string]bool{}
	for _, c := range list.Items {
		if c.Spec.VolumeName != pvName(&c) || seen[c.Spec.VolumeName] {
			t.Errorf("claim %s bound to %q", c.Name, c.Spec.VolumeName)
		}
		seen[c.Spec.VolumeName] = true
		if id := cluster.requests.idOf(c.Spec.VolumeName); !vols[id] {
			t.Errorf("volume %s (%q) is not in the driver", c.Spec.VolumeName, id)
		}
		if k := len(cluster.requests.createsFor(c.Spec.VolumeName)); k != 1 {
			t.Errorf("volume %s: %d CreateVolume calls, want 1", c.Spec.VolumeName, k)
		}
	}
}

// A driver that says "try again" (or times out) may be making the volume:
// the same name is asked for again until it answers, and exactly one
// volume exists in the end.
func TestProvisionRetriesWhatMayStillBeRunning(t *testing.T) {
	for _, tc := range []struct {
		name   string
		inject func(f *devcsi.Faults)
		want   string // in the ProvisioningFailed event
	}{
		{"unavailable twice", func(f *devcsi.Faults) { f.FailNext("CreateVolume", 2, codes.Unavailable, "driver restarting") }, "driver restarting"},
		{"deadline exceeded twice", func(f *devcsi.Faults) { f.FailNext("CreateVolume", 2, codes.DeadlineExceeded, "backend slow") }, "backend slow"},
		{"a call outlives its timeout and completes", func(f *devcsi.Faults) { f.HangNext("CreateVolume", 1, devcsi.HangComplete) }, "DeadlineExceeded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := e2e.Namespace(t, cluster.client)
			sc := class(t)
			before := driverVolumes(t)
			tc.inject(faults(t))
			c := createClaim(t, ns, "data", "1Gi", sc.Name)
			hasEventFrom(t, c, kube.EventProvisioningFailed, tc.want, driverName)
			c, pv := bound(t, ns, "data")
			reqs := cluster.requests.createsFor(pv.Name)
			if len(reqs) < 2 {
				t.Errorf("%d CreateVolume calls, want retries", len(reqs))
			}
			for _, r := range reqs {
				if r.GetName() != pv.Name || r.GetCapacityRange().GetRequiredBytes() != 1<<30 {
					t.Errorf("a retry asked for something else: %v", r)
				}
			}
			if a := added(before, driverVolumes(t)); len(a) != 1 || a[0] != pv.Spec.CSI.VolumeHandle {
				t.Errorf("driver volumes added %v; want exactly %s", a, pv.Spec.CSI.VolumeHandle)
			}
			noJournal(t, pvName(c))
			// kube-controller-manager says ExternalProvisioning at a
			// claim's syncs (its 15s resync), not at every retry: one
			// event (aggregated by count) for a claim provisioned within
			// seconds, however often it was retried.
			evs, err := e2e.Events(cluster.client, ns, "PersistentVolumeClaim", "data")
			if err != nil {
				t.Fatal(err)
			}
			var n int32
			for _, e := range evs {
				if e.Reason == kube.EventExternalProvisioning {
					n += max(e.Count, 1)
				}
			}
			if n != 1 {
				t.Errorf("%d ExternalProvisioning events over %d attempts, want 1", n, len(reqs))
			}
		})
	}
}

func TestClaimDeletedWhileCreateVolumeHangsLeavesNoVolume(t *testing.T) {
	for _, mode := range []devcsi.HangMode{devcsi.HangComplete, devcsi.HangAbandon} {
		t.Run(mode.String(), func(t *testing.T) {
			ns := e2e.Namespace(t, cluster.client)
			sc := class(t)
			before := driverVolumes(t)
			f := faults(t)
			f.HangNext("CreateVolume", 1, mode)
			c := createClaim(t, ns, "data", "1Gi", sc.Name)
			e2e.Eventually(t, 30*time.Second, func() string {
				if f.Hanging("CreateVolume") == 0 {
					return "CreateVolume not called yet"
				}
				return ""
			})
			deleteClaim(t, c)
			// The provisioner undoes the journaled operation: whatever the
			// driver made in the background is deleted.
			noJournal(t, pvName(c))
			e2e.Eventually(t, 30*time.Second, func() string { return noneAdded(t, before) })
			e2e.Consistently(t, time.Second, func() string { return noneAdded(t, before) })
			if _, err := cluster.client.CoreV1().PersistentVolumes().Get(t.Context(), pvName(c), metav1.GetOptions{}); err == nil {
				t.Error("a PV was made for the deleted claim")
			}
		})
	}
}

// A final error other than InvalidArgument is retried on the claim's
// backoff (InvalidArgument waits --retry-interval-max: infeasible_test.go).
func TestFinalErrorReportsAndRetriesWithBackoff(t *testing.T) {
	ns := e2e.Namespace(t, cluster.client)
	sc := class(t)
	before := driverVolumes(t)
	f := faults(t)
	f.FailNext("CreateVolume", -1, codes.FailedPrecondition, "pool platinum is read-only")
	c := createClaim(t, ns, "data", "1Gi", sc.Name)
	hasEventFrom(t, c, kube.EventProvisioningFailed, "pool platinum is read-only", driverName)
	e2e.Consistently(t, 2*time.Second, func() string {
		if _, err := cluster.client.CoreV1().PersistentVolumes().Get(t.Context(), pvName(c), metav1.GetOptions{}); err == nil {
			return "a PV exists after a final error"
		}
		// An attempt journals itself before calling the driver and its
		// final error removes the record: a record seen here is always a
		// fresh attempt, never one left behind by an earlier attempt.
		for _, op := range operations(t, pvName(c)) {
			if op.GetAttempts() != 1 || op.GetLastError() != "" {
				return fmt.Sprintf("a final error left a journal record %v", op)
			}
		}
		return noneAdded(t, before)
	})
	noJournal(t, pvName(c)) // between attempts, while the driver still fails
	calls := f.Calls("CreateVolume")
	if calls < 2 || calls > 20 {
		t.Errorf("%d CreateVolume calls in 2s: want retries with backoff", calls)
	}
	f.Clear("CreateVolume")
	bound(t, ns, "data")
}

func TestWaitForFirstConsumerProvisionsOnTheSelectedNode(t *testing.T) {
	ns := e2e.Namespace(t, cluster.client)
	sc := class(t, waitForFirstConsumer)
	node := makeNode(t, "node-b")
	c := createClaim(t, ns, "data", "1Gi", sc.Name)
	e2e.HasEvent(t, cluster.client, ns, "PersistentVolumeClaim", "data", kube.EventWaitForFirstConsumer, "waiting for first consumer", kube.ControllerComponent, 30*time.Second)
	e2e.Consistently(t, time.Second, func() string {
		if n := len(cluster.requests.createsFor(pvName(c))); n > 0 {
			return "provisioned before a node was selected"
		}
		return ""
	})
	selectNode(t, c, node)
	_, pv := bound(t, ns, "data")
	// As external-provisioner (without --strict-topology): every node of
	// the driver is requisite, the selected one preferred first.
	req := cluster.requests.createsFor(pv.Name)[0]
	tr := req.GetAccessibilityRequirements()
	var requisite []string
	for _, ts := range tr.GetRequisite() {
		requisite = append(requisite, ts.GetSegments()[devcsi.TopologyKey])
	}
	if !slices.Contains(requisite, node) || !slices.Contains(requisite, cluster.driver.NodeID()) || len(tr.GetPreferred()) != len(requisite) ||
		tr.GetPreferred()[0].GetSegments()[devcsi.TopologyKey] != node {
		t.Errorf("topology requirement %v, want every node of the driver with %s preferred first", tr, node)
	}
	terms := pv.Spec.NodeAffinity.Required.NodeSelectorTerms
	if terms[0].MatchExpressions[0].Values[0] != node {
		t.Errorf("node affinity %v, want %s", terms, node)
	}
}

func TestAllowedTopologiesLimitWhereVolumesGo(t *testing.T) {
	ns := e2e.Namespace(t, cluster.client)
	sc := class(t, func(sc *storagev1.StorageClass) {
		sc.AllowedTopologies = []corev1.TopologySelectorTerm{{MatchLabelExpressions: []corev1.TopologySelectorLabelRequirement{
			{Key: devcsi.TopologyKey, Values: []string{"node-c"}}}}}
	})
	createClaim(t, ns, "data", "1Gi", sc.Name)
	_, pv := bound(t, ns, "data")
	if v := pv.Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0].Values[0]; v != "node-c" {
		t.Errorf("volume on %s, want node-c", v)
	}
}

func TestResourceExhaustedOnTheSelectedNodeAsksTheSchedulerAgain(t *testing.T) {
	ns := e2e.Namespace(t, cluster.client)
	sc := class(t, waitForFirstConsumer)
	node := makeNode(t, "node-full")
	f := faults(t)
	f.FailNext("CreateVolume", 1, codes.ResourceExhausted, "node is full")
	c := createClaim(t, ns, "data", "1Gi", sc.Name)
	selectNode(t, c, node)
	hasEventFrom(t, c, kube.EventProvisioningFailed, "node is full", driverName)
	e2e.Eventually(t, 30*time.Second, func() string {
		c, err := cluster.client.CoreV1().PersistentVolumeClaims(ns).Get(t.Context(), "data", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if _, ok := c.Annotations[kube.AnnSelectedNode]; ok {
			return "selected-node is still set"
		}
		return ""
	})
	if _, err := cluster.client.CoreV1().PersistentVolumes().Get(t.Context(), pvName(c), metav1.GetOptions{}); err == nil {
		t.Error("a PV was made on a full node")
	}
}

func TestCloneCopiesTheSourceClaim(t *testing.T) {
	ns := e2e.Namespace(t, cluster.client)
	sc := class(t)
	createClaim(t, ns, "source", "1Gi", sc.Name)
	_, src := bound(t, ns, "source")
	if err := os.WriteFile(filepath.Join(cluster.driver.VolumePath(src.Spec.CSI.VolumeHandle), "hello.txt"), []byte("hi"), 0o644); err != nil {
		t.Fatal(err)
	}
	createClaim(t, ns, "copy", "1Gi", sc.Name, func(c *corev1.PersistentVolumeClaim) {
		c.Spec.DataSource = &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "source"}
	})
	_, dst := bound(t, ns, "copy")
	req := cluster.requests.createsFor(dst.Name)[0]
	if got := req.GetVolumeContentSource().GetVolume().GetVolumeId(); got != src.Spec.CSI.VolumeHandle {
		t.Errorf("content source %v, want volume %s", req.GetVolumeContentSource(), src.Spec.CSI.VolumeHandle)
	}
	b, err := os.ReadFile(filepath.Join(cluster.driver.VolumePath(dst.Spec.CSI.VolumeHandle), "hello.txt"))
	if err != nil || string(b) != "hi" {
		t.Errorf("the clone holds %q, %v", b, err)
	}

	// A clone of a claim of another class is refused with a clear event.
	other := class(t)
	bad := createClaim(t, ns, "bad-copy", "1Gi", other.Name, func(c *corev1.PersistentVolumeClaim) {
		c.Spec.DataSource = &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "source"}
	})
	hasEventFrom(t, bad, kube.EventProvisioningFailed, "a clone must be of the same class", driverName)
}

func TestSecretsReachTheDriverButNeverTheLogs(t *testing.T) {
	ns := e2e.Namespace(t, cluster.client)
	password := e2e.Secret("s3cr3t-Value-9f8e")
	if _, err := cluster.client.CoreV1().Secrets(ns).Create(t.Context(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "data-creds", Namespace: ns},
		StringData: map[string]string{"password": password},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sc := class(t, func(sc *storagev1.StorageClass) {
		sc.Parameters = map[string]string{
			"csi.storage.k8s.io/provisioner-secret-name":       "${pvc.name}-creds",
			"csi.storage.k8s.io/provisioner-secret-namespace":  "${pvc.namespace}",
			"csi.storage.k8s.io/node-publish-secret-name":      "${pvc.name}-creds",
			"csi.storage.k8s.io/node-publish-secret-namespace": "${pvc.namespace}",
		}
	})
	createClaim(t, ns, "data", "1Gi", sc.Name)
	_, pv := bound(t, ns, "data")
	req := cluster.requests.createsFor(pv.Name)[0]
	if req.GetSecrets()["password"] != password {
		t.Errorf("CreateVolume secrets %d keys, want the password", len(req.GetSecrets()))
	}
	if len(req.GetParameters()) != 3 { // only the extra create metadata
		t.Errorf("secret parameters reached the driver: %v", req.GetParameters())
	}
	if r := pv.Spec.CSI.NodePublishSecretRef; r == nil || r.Name != "data-creds" || r.Namespace != ns {
		t.Errorf("node publish secret ref %v", r)
	}
	if pv.Annotations["volume.kubernetes.io/provisioner-deletion-secret-name"] != "data-creds" ||
		pv.Annotations["volume.kubernetes.io/provisioner-deletion-secret-namespace"] != ns {
		t.Errorf("deletion secret annotations %v", pv.Annotations)
	}
	if !logsContain(t, "CreateVolume") {
		t.Fatal("the services' debug log has no CreateVolume call: the check below would prove nothing")
	}
	if logsContain(t, password) {
		t.Error("a secret value is in the services' log")
	}
}

func TestClassesOfOtherProvisionersAreLeftToThem(t *testing.T) {
	ns := e2e.Namespace(t, cluster.client)
	sc := class(t, func(sc *storagev1.StorageClass) { sc.Provisioner = "example.com/nfs" })
	c := createClaim(t, ns, "data", "1Gi", sc.Name)
	e2e.HasEvent(t, cluster.client, ns, "PersistentVolumeClaim", "data", kube.EventExternalProvisioning, "example.com/nfs", kube.ControllerComponent, 30*time.Second)
	e2e.Consistently(t, time.Second, func() string {
		c, err := cluster.client.CoreV1().PersistentVolumeClaims(ns).Get(t.Context(), "data", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if c.Annotations[kube.AnnStorageProvisioner] != "example.com/nfs" || c.Status.Phase != corev1.ClaimPending {
			return fmt.Sprintf("claim %v %s", c.Annotations, c.Status.Phase)
		}
		if len(cluster.requests.createsFor(pvName(c))) > 0 {
			return "volplane provisioned it"
		}
		return ""
	})
	_ = c
}

// makeNode registers a node with the dev driver installed (its CSINode
// lists the driver's topology key), as a kubelet would.
func makeNode(t *testing.T, name string) string {
	t.Helper()
	ctx := t.Context()
	_, err := cluster.client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: name, Labels: map[string]string{devcsi.TopologyKey: name, "kubernetes.io/hostname": name}}}, metav1.CreateOptions{})
	if err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	_, err = cluster.client.StorageV1().CSINodes().Create(ctx, &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{Name: driverName, NodeID: name, TopologyKeys: []string{devcsi.TopologyKey}}}}},
		metav1.CreateOptions{})
	if err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	// Later tests provision without a node: every CSINode of the driver
	// would take part in their topology.
	t.Cleanup(func() {
		_ = cluster.client.StorageV1().CSINodes().Delete(context.Background(), name, metav1.DeleteOptions{})
		_ = cluster.client.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return name
}

// selectNode sets the claim's selected-node annotation, as the scheduler
// does for a WaitForFirstConsumer claim of a scheduled pod.
func selectNode(t *testing.T, c *corev1.PersistentVolumeClaim, node string) {
	t.Helper()
	e2e.Eventually(t, 10*time.Second, func() string {
		cur, err := cluster.client.CoreV1().PersistentVolumeClaims(c.Namespace).Get(t.Context(), c.Name, metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		metav1.SetMetaDataAnnotation(&cur.ObjectMeta, kube.AnnSelectedNode, node)
		if _, err := cluster.client.CoreV1().PersistentVolumeClaims(c.Namespace).Update(t.Context(), cur, metav1.UpdateOptions{}); err != nil {
			return err.Error()
		}
		return ""
	})
}
