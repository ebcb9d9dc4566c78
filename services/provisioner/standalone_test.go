package provisioner

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/kube"
)

// TestShouldProvision is upstream's table (sig-storage-lib-external-
// provisioner's TestShouldProvision and csi-provisioner's ShouldProvision
// cases), plus the claims volplane's Provision would not act on.
func TestShouldProvision(t *testing.T) {
	const served = "csi.example.com"
	wffc, immediate := storagev1.VolumeBindingWaitForFirstConsumer, storagev1.VolumeBindingImmediate
	classes := map[string]*storagev1.StorageClass{
		"fast":  {ObjectMeta: metav1.ObjectMeta{Name: "fast"}, Provisioner: served, VolumeBindingMode: &immediate},
		"late":  {ObjectMeta: metav1.ObjectMeta{Name: "late"}, Provisioner: served, VolumeBindingMode: &wffc},
		"plain": {ObjectMeta: metav1.ObjectMeta{Name: "plain"}, Provisioner: served},
	}
	classOf := func(name string) (*storagev1.StorageClass, error) {
		if c, ok := classes[name]; ok {
			return c, nil
		}
		return nil, errNoClass
	}
	serves := func(name string) bool { return name == served }
	claim := func(class string, ann map[string]string, mut ...func(*corev1.PersistentVolumeClaim)) *corev1.PersistentVolumeClaim {
		c := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c", UID: "u", Annotations: ann},
			Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &class}, Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimPending}}
		for _, m := range mut {
			m(c)
		}
		return c
	}
	ann := func(kv ...string) map[string]string {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	now := metav1.Now()
	for _, tc := range []struct {
		name    string
		claim   *corev1.PersistentVolumeClaim
		want    bool
		wantErr bool
	}{
		{"annotation missing", claim("fast", nil), false, false},
		{"other provisioner", claim("fast", ann(kube.AnnStorageProvisioner, "other.example.com")), false, false},
		{"served provisioner", claim("fast", ann(kube.AnnStorageProvisioner, served)), true, false},
		{"beta annotation", claim("fast", ann(kube.AnnBetaStorageProvisioner, served)), true, false},
		{"GA annotation wins over beta", claim("fast", ann(kube.AnnStorageProvisioner, "other.example.com", kube.AnnBetaStorageProvisioner, served)), false, false},
		{"no binding mode", claim("plain", ann(kube.AnnStorageProvisioner, served)), true, false},
		{"WFFC without node", claim("late", ann(kube.AnnStorageProvisioner, served)), false, false},
		{"WFFC with empty node", claim("late", ann(kube.AnnStorageProvisioner, served, kube.AnnSelectedNode, "")), false, false},
		{"WFFC with node", claim("late", ann(kube.AnnStorageProvisioner, served, kube.AnnSelectedNode, "node-a")), true, false},
		{"already bound", claim("fast", ann(kube.AnnStorageProvisioner, served), func(c *corev1.PersistentVolumeClaim) {
			c.Spec.VolumeName = "pv-1"
			c.Status.Phase = corev1.ClaimBound
		}), false, false},
		{"volumeName set, still Pending", claim("fast", ann(kube.AnnStorageProvisioner, served), func(c *corev1.PersistentVolumeClaim) { c.Spec.VolumeName = "pv-1" }), false, false},
		{"deleting", claim("fast", ann(kube.AnnStorageProvisioner, served), func(c *corev1.PersistentVolumeClaim) { c.DeletionTimestamp = &now }), false, false},
		{"lost", claim("fast", ann(kube.AnnStorageProvisioner, served), func(c *corev1.PersistentVolumeClaim) { c.Status.Phase = corev1.ClaimLost }), false, false},
		{"no phase yet", claim("fast", ann(kube.AnnStorageProvisioner, served), func(c *corev1.PersistentVolumeClaim) { c.Status.Phase = "" }), true, false},
		{"class missing: retried", claim("gone", ann(kube.AnnStorageProvisioner, served)), false, true},
		{"class missing, other provisioner: not read", claim("gone", ann(kube.AnnStorageProvisioner, "other.example.com")), false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := shouldProvision(tc.claim, serves, classOf)
			if got != tc.want || (err != nil) != tc.wantErr {
				t.Errorf("shouldProvision = %v, %v; want %v, error %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

// newStandaloneOf is the standalone controller over g's provisioner, its
// caches, and a PV store.
func newStandaloneOf(g *guarded) *standalone {
	objs := &objectCache{claims: g.claims, classes: g.classes}
	return newStandalone(discard, g.s.p, objs, cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{}), time.Millisecond, time.Second)
}

func annotatedClaim(uid, provisioner string) *corev1.PersistentVolumeClaim {
	class := "fast"
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c-" + uid, UID: types.UID("uid-" + uid),
			Annotations: map[string]string{kube.AnnStorageProvisioner: provisioner}},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &class, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}}},
		Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimPending},
	}
}

func TestStandaloneProvisionsAnnotatedClaimsOnce(t *testing.T) {
	g := newGuarded(t)
	if err := g.classes.Add(&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, Provisioner: devcsi.DefaultName,
		ReclaimPolicy: new(corev1.PersistentVolumeReclaimDelete)}); err != nil {
		t.Fatal(err)
	}
	s := newStandaloneOf(g)
	mine := g.addClaim(t, annotatedClaim("1", devcsi.DefaultName))
	other := g.addClaim(t, annotatedClaim("2", "other.example.com"))

	retry, err := s.sync(t.Context(), mine.Namespace+"/"+mine.Name, false)
	if retry || err != nil {
		t.Fatalf("sync = %v, %v", retry, err)
	}
	pv, err := g.api.CoreV1().PersistentVolumes().Get(t.Context(), VolumeName("pvc", mine), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("no PV for the claim: %v", err)
	}
	if pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.UID != mine.UID || pv.Annotations[kube.AnnDynamicallyProvisioned] != devcsi.DefaultName {
		t.Errorf("PV claimRef %v, annotations %v", pv.Spec.ClaimRef, pv.Annotations)
	}
	// kube-controller-manager has not bound it yet: the next sync of the
	// still Pending claim asks the driver for nothing.
	if retry, err := s.sync(t.Context(), mine.Namespace+"/"+mine.Name, false); retry || err != nil {
		t.Fatalf("second sync = %v, %v", retry, err)
	}
	if retry, err := s.sync(t.Context(), other.Namespace+"/"+other.Name, false); retry || err != nil {
		t.Fatalf("other provisioner's claim: sync = %v, %v", retry, err)
	}
	if retry, err := s.sync(t.Context(), "ns/missing", false); retry || err != nil {
		t.Fatalf("missing claim: sync = %v, %v", retry, err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.creates) != 1 {
		t.Errorf("CreateVolume calls %d, want 1", len(g.creates))
	}
}

func TestStandaloneRetriesAMissingClassAndUnfinishedAttempts(t *testing.T) {
	g := newGuarded(t)
	s := newStandaloneOf(g)
	c := g.addClaim(t, annotatedClaim("3", devcsi.DefaultName))
	key := c.Namespace + "/" + c.Name
	if _, err := s.sync(t.Context(), key, true); !errors.Is(err, errNoClass) {
		t.Fatalf("sync without the class: %v, want errNoClass", err)
	}
	// Another replica holds the operation: retried, nothing made.
	if err := g.classes.Add(&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, Provisioner: devcsi.DefaultName}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := g.journal.AcquireGet(t.Context(), kindProvision, VolumeName("pvc", c), "other-replica"); err != nil {
		t.Fatal(err)
	}
	if retry, err := s.sync(t.Context(), key, true); !retry || err != nil {
		t.Fatalf("sync while another replica provisions = %v, %v; want a retry", retry, err)
	}
	if _, err := g.api.CoreV1().PersistentVolumes().Get(t.Context(), VolumeName("pvc", c), metav1.GetOptions{}); err == nil {
		t.Error("a PV was made while another replica held the operation")
	}
}

func TestStandaloneRescheduleRemovesTheSelectedNode(t *testing.T) {
	g := newGuarded(t)
	s := newStandaloneOf(g)
	c := annotatedClaim("4", devcsi.DefaultName)
	c.Annotations[kube.AnnSelectedNode] = "node-a"
	c = g.addClaim(t, c)
	if err := s.reschedule(t.Context(), c); err != nil {
		t.Fatal(err)
	}
	got, err := g.api.CoreV1().PersistentVolumeClaims(c.Namespace).Get(t.Context(), c.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := got.Annotations[kube.AnnSelectedNode]; ok || got.Annotations[kube.AnnStorageProvisioner] != devcsi.DefaultName {
		t.Errorf("annotations after reschedule: %v", got.Annotations)
	}
}

func TestStandaloneOptions(t *testing.T) {
	o := Options{RetryIntervalStart: 2 * time.Minute, RetryIntervalMax: time.Minute}
	if errs := o.validateStandalone(); len(errs) != 1 {
		t.Errorf("max below start: %v", errs)
	}
	o = Options{StandaloneWorkers: -1}
	if errs := o.validateStandalone(); len(errs) != 1 {
		t.Errorf("negative workers: %v", errs)
	}
	o = Options{}
	if errs := o.validateStandalone(); len(errs) != 0 || o.StandaloneWorkers != DefaultStandaloneWorkers || o.RetryIntervalMax != DefaultRetryIntervalMax {
		t.Errorf("defaults: %v %+v", errs, o)
	}
}

// A retry asks the API server: another replica's PV that the informer
// has not brought yet stops the attempt.
func TestStandaloneRetrySeesAnotherReplicasVolume(t *testing.T) {
	g := newGuarded(t)
	if err := g.classes.Add(&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, Provisioner: devcsi.DefaultName}); err != nil {
		t.Fatal(err)
	}
	s := newStandaloneOf(g)
	c := g.addClaim(t, annotatedClaim("5", devcsi.DefaultName))
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: VolumeName("pvc", c)},
		Spec: corev1.PersistentVolumeSpec{ClaimRef: &corev1.ObjectReference{Namespace: c.Namespace, Name: c.Name, UID: c.UID}}}
	if _, err := g.api.CoreV1().PersistentVolumes().Create(t.Context(), pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if retry, err := s.sync(t.Context(), c.Namespace+"/"+c.Name, true); retry || err != nil {
		t.Fatalf("retry with the PV made elsewhere: %v, %v", retry, err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.creates) != 0 {
		t.Errorf("CreateVolume called %d times for a claim another replica provisioned", len(g.creates))
	}
}

// An infeasible request (InvalidArgument) is not sent again before
// --retry-interval-max, unless the claim's class is replaced (the
// library's slowSet).
func TestStandaloneDelaysInfeasibleClaims(t *testing.T) {
	g := newGuarded(t)
	class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast", UID: "class-1"}, Provisioner: devcsi.DefaultName}
	if err := g.classes.Add(class); err != nil {
		t.Fatal(err)
	}
	s := newStandaloneOf(g)
	now := time.Now()
	s.now = func() time.Time { return now }
	creates := func() int {
		g.mu.Lock()
		defer g.mu.Unlock()
		return len(g.creates)
	}
	if err := g.classes.Add(&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "steady", UID: "class-s"}, Provisioner: devcsi.DefaultName}); err != nil {
		t.Fatal(err)
	}
	b := annotatedClaim("7", devcsi.DefaultName)
	b.Spec.StorageClassName = new("steady")
	a, b := g.addClaim(t, annotatedClaim("6", devcsi.DefaultName)), g.addClaim(t, b)
	for _, c := range []*corev1.PersistentVolumeClaim{a, b} {
		g.drv.Faults().FailNext("CreateVolume", 1, codes.InvalidArgument, "no such disk type")
		if retry, err := s.sync(t.Context(), claimKey(c), false); !retry || err != nil {
			t.Fatalf("infeasible attempt: %v, %v", retry, err)
		}
	}
	if retry, err := s.sync(t.Context(), claimKey(a), true); !retry || err != nil || creates() != 2 {
		t.Fatalf("retry within the delay: %v, %v, %d CreateVolume calls, want 2", retry, err, creates())
	}
	// The class is replaced (a new UID): a is tried at once.
	class = class.DeepCopy()
	class.UID = "class-2"
	if err := g.classes.Update(class); err != nil {
		t.Fatal(err)
	}
	if retry, err := s.sync(t.Context(), claimKey(a), true); retry || err != nil || creates() != 3 {
		t.Fatalf("after the class changed: %v, %v, %d CreateVolume calls, want 3", retry, err, creates())
	}
	// b's class stays: its delay ends after retryMax.
	if retry, _ := s.sync(t.Context(), claimKey(b), true); !retry || creates() != 3 {
		t.Fatalf("b within the delay: retry %v, %d CreateVolume calls, want 3", retry, creates())
	}
	now = now.Add(s.retryMax)
	if retry, err := s.sync(t.Context(), claimKey(b), true); retry || err != nil || creates() != 4 {
		t.Fatalf("after retryMax: %v, %v, %d CreateVolume calls, want 4", retry, err, creates())
	}
}

// ResourceExhausted on the selected node reschedules a claim only with a
// driver that reports topology, as external-provisioner's
// supportsTopology: without it the next request would be the same. The
// selected node is then removed; without topology the attempt is retried.
func TestStandaloneReschedulesOnlyWithTopology(t *testing.T) {
	for _, topology := range []bool{true, false} {
		t.Run(fmt.Sprintf("topology=%v", topology), func(t *testing.T) {
			g := newGuarded(t)
			if err := g.classes.Add(&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, Provisioner: devcsi.DefaultName}); err != nil {
				t.Fatal(err)
			}
			d := g.s.p.drivers.byProvisioner(devcsi.DefaultName)
			st := *d.current()
			st.topology = topology
			d.state.Store(&st)
			s := newStandaloneOf(g)
			c := annotatedClaim("8", devcsi.DefaultName)
			c.Annotations[kube.AnnSelectedNode] = "node-a"
			c = g.addClaim(t, c)
			g.drv.Faults().FailNext("CreateVolume", 1, codes.ResourceExhausted, "node-a is full")
			retry, err := s.sync(t.Context(), claimKey(c), false)
			if err != nil || retry == topology {
				t.Fatalf("sync = %v, %v; want a retry %v", retry, err, !topology)
			}
			got, err := g.api.CoreV1().PersistentVolumeClaims(c.Namespace).Get(t.Context(), c.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if _, selected := got.Annotations[kube.AnnSelectedNode]; selected == topology {
				t.Errorf("selected-node present %v after ResourceExhausted, want %v", selected, !topology)
			}
		})
	}
}

// A driver that comes or becomes ready has standalone mode look at every
// claim again (onChange); a probe that changes nothing does not.
func TestRegistryTellsOfDriverChanges(t *testing.T) {
	_, ep := startDriver(t)
	cc, err := grpcutil.DialCSI(ep)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	reg := newRegistry(discard)
	reg.add(newDriver(ep, "", cc))
	changes := 0
	reg.setOnChange(func() { changes++ })
	reg.probeAll(t.Context())
	if changes != 1 {
		t.Fatalf("first probe: %d changes, want 1 (the driver became ready)", changes)
	}
	reg.probeAll(t.Context())
	if changes != 1 {
		t.Errorf("an unchanged probe told of %d more changes", changes-1)
	}
}
