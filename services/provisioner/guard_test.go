package provisioner

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
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/reclaimjournal"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
)

// memJournal is coord's journal in memory: a lock per record, writes
// fenced on it.
type memJournal struct {
	mu      sync.Mutex
	records map[string][]byte
	locks   map[string]string
}

var _ journal = (*memJournal)(nil)

func newMemJournal() *memJournal {
	return &memJournal{records: map[string][]byte{}, locks: map[string]string{}}
}

func (j *memJournal) Acquire(_ context.Context, kind, name, holder string) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if h := j.locks[kind+"/"+name]; h != "" && h != holder {
		return fmt.Errorf("%s/%s: %w %q", kind, name, coord.ErrReserved, h)
	}
	j.locks[kind+"/"+name] = holder
	return nil
}

func (j *memJournal) AcquireGet(ctx context.Context, kind, name, holder string) (coord.Record, bool, error) {
	if err := j.Acquire(ctx, kind, name, holder); err != nil {
		return coord.Record{}, false, err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	v, ok := j.records[kind+"/"+name]
	return coord.Record{Kind: kind, Name: name, Value: v, Holder: holder}, ok, nil
}

func (j *memJournal) Unlock(_ context.Context, kind, name, holder string) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.locks[kind+"/"+name] == holder {
		delete(j.locks, kind+"/"+name)
	}
	return nil
}

func (j *memJournal) Put(_ context.Context, kind, name, holder string, value []byte) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.locks[kind+"/"+name] != holder {
		return fmt.Errorf("%s/%s: %w", kind, name, coord.ErrNotOwner)
	}
	j.records[kind+"/"+name] = slices.Clone(value)
	return nil
}

func (j *memJournal) Finish(_ context.Context, kind, name, holder string) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.locks[kind+"/"+name] != holder {
		return fmt.Errorf("%s/%s: %w", kind, name, coord.ErrNotOwner)
	}
	delete(j.records, kind+"/"+name)
	delete(j.locks, kind+"/"+name)
	return nil
}

func (j *memJournal) List(_ context.Context, kind string) ([]coord.Record, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []coord.Record
	for k, v := range j.records {
		if n, ok := strings.CutPrefix(k, kind+"/"); ok {
			out = append(out, coord.Record{Kind: kind, Name: n, Value: v, Holder: j.locks[k]})
		}
	}
	return out, nil
}

func (j *memJournal) Get(_ context.Context, kind, name string) (coord.Record, bool, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	v, ok := j.records[kind+"/"+name]
	if !ok {
		return coord.Record{}, false, nil
	}
	return coord.Record{Kind: kind, Name: name, Value: v, Holder: j.locks[kind+"/"+name]}, true, nil
}

// guarded is a provisioner over the dev CSI driver and a fake API server,
// with the CSI requests it sends recorded.
type guarded struct {
	s       *server
	api     *fake.Clientset
	drv     *devcsi.Driver
	csi     csi.ControllerClient
	journal *memJournal
	claims  cache.Indexer
	classes cache.Indexer

	mu      sync.Mutex
	creates []*csi.CreateVolumeRequest
}

func newGuarded(t *testing.T) *guarded {
	t.Helper()
	d, ep := startDriver(t)
	// The cache as the informers leave it once listed: current.
	objs := newObjectCache()
	objs.listed()
	g := &guarded{api: fake.NewClientset(), drv: d, journal: newMemJournal(), claims: objs.claims, classes: objs.classes}
	capture := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if q, ok := req.(*csi.CreateVolumeRequest); ok {
			g.mu.Lock()
			g.creates = append(g.creates, proto.Clone(q).(*csi.CreateVolumeRequest))
			g.mu.Unlock()
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	cc, err := grpcutil.DialCSI(ep, grpc.WithChainUnaryInterceptor(capture))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	reg := newRegistry(discard)
	reg.add(newDriver(ep, "", cc))
	reg.probeAll(t.Context())
	g.csi = csi.NewControllerClient(cc)
	p := &provisioner{log: discard, member: "me", client: g.api, journal: g.journal, drivers: reg, nodes: fakeNodes{"node-a": {devcsi.TopologyKey: "node-a"}},
		sources: sources{client: g.api}, events: func(string) record.EventRecorder { return record.NewFakeRecorder(100) },
		prefix: "pvc", defaultFSType: "ext4", timeout: 10 * time.Second, now: time.Now, inflight: map[string]bool{}}
	g.s = newServer(p, objs)
	return g
}

// addClaim puts a claim into the API server and the informer cache.
func (g *guarded) addClaim(t *testing.T, c *corev1.PersistentVolumeClaim) *corev1.PersistentVolumeClaim {
	t.Helper()
	c, err := g.api.CoreV1().PersistentVolumeClaims(c.Namespace).Create(t.Context(), c, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.claims.Add(c); err != nil {
		t.Fatal(err)
	}
	return c
}

// volume makes a backing volume holding a file, and returns its handle.
func (g *guarded) volume(t *testing.T, name string) string {
	t.Helper()
	resp, err := g.csi.CreateVolume(t.Context(), &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}}})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetVolume().GetVolumeId()
	if err := os.WriteFile(filepath.Join(g.drv.VolumePath(id), "data"), []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	return id
}

func (g *guarded) intact(id string) bool {
	b, err := os.ReadFile(filepath.Join(g.drv.VolumePath(id), "data"))
	return err == nil && string(b) == "precious"
}

func provisionedPV(name, handle string, phase corev1.PersistentVolumePhase, policy corev1.PersistentVolumeReclaimPolicy, ref *corev1.ObjectReference) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), Annotations: map[string]string{kube.AnnDynamicallyProvisioned: devcsi.DefaultName}},
		Spec: corev1.PersistentVolumeSpec{PersistentVolumeReclaimPolicy: policy, ClaimRef: ref,
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: devcsi.DefaultName, VolumeHandle: handle}}},
		Status: corev1.PersistentVolumeStatus{Phase: phase},
	}
}

// Every way a caller could get DeleteVolume to delete a backing volume
// that must stay: each is refused with FailedPrecondition and the data is
// intact; only a volume the API server says is released with policy
// Delete (or one gone whose reclaim record has its deletion in flight)
// goes.
func TestDeleteVolumeGuards(t *testing.T) {
	ref := &corev1.ObjectReference{Namespace: "ns", Name: "data", UID: "claim-uid"}
	del, retain := corev1.PersistentVolumeReclaimDelete, corev1.PersistentVolumeReclaimRetain
	now := metav1.Now()
	for _, tc := range []struct {
		name   string
		pv     func(handle string) *corev1.PersistentVolume // in the API server; nil: none
		claims []*corev1.PersistentVolumeClaim
		sent   func(handle string) *corev1.PersistentVolume
		record func(*reclaimerv1.Reclaim) // non-nil: the volume's reclaim journals its deletion, as record changes it
		refuse string                     // "" deletes
	}{
		{name: "bound, name only", pv: func(h string) *corev1.PersistentVolume { return provisionedPV("v", h, corev1.VolumeBound, del, ref) },
			claims: []*corev1.PersistentVolumeClaim{{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "data", UID: "claim-uid"}, Spec: corev1.PersistentVolumeClaimSpec{VolumeName: "v"}}},
			refuse: `volume "v" is Bound`},
		{name: "bound, forged as released", pv: func(h string) *corev1.PersistentVolume { return provisionedPV("v", h, corev1.VolumeBound, del, ref) },
			sent: func(h string) *corev1.PersistentVolume { return provisionedPV("v", h, corev1.VolumeReleased, del, nil) }, refuse: `is Bound`},
		{name: "forged with another UID", pv: func(h string) *corev1.PersistentVolume { return provisionedPV("v", h, corev1.VolumeReleased, del, ref) },
			sent: func(h string) *corev1.PersistentVolume {
				v := provisionedPV("v", h, corev1.VolumeReleased, del, nil)
				v.UID = "forged"
				return v
			}, refuse: "it was recreated"},
		{name: "retain", pv: func(h string) *corev1.PersistentVolume {
			return provisionedPV("v", h, corev1.VolumeReleased, retain, ref)
		}, refuse: `reclaim policy "Retain"`},
		{name: "recycle", pv: func(h string) *corev1.PersistentVolume {
			return provisionedPV("v", h, corev1.VolumeFailed, corev1.PersistentVolumeReclaimRecycle, ref)
		}, refuse: `reclaim policy "Recycle"`},
		{name: "available", pv: func(h string) *corev1.PersistentVolume {
			return provisionedPV("v", h, corev1.VolumeAvailable, del, nil)
		}, refuse: "is Available"},
		{name: "live claim by claimRef", pv: func(h string) *corev1.PersistentVolume { return provisionedPV("v", h, corev1.VolumeReleased, del, ref) },
			claims: []*corev1.PersistentVolumeClaim{{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "data", UID: "claim-uid"}}}, refuse: "claim ns/data (uid claim-uid) still exists"},
		{name: "live claim by spec.volumeName", pv: func(h string) *corev1.PersistentVolume { return provisionedPV("v", h, corev1.VolumeReleased, del, ref) },
			claims: []*corev1.PersistentVolumeClaim{{ObjectMeta: metav1.ObjectMeta{Namespace: "other", Name: "mine", UID: "m"}, Spec: corev1.PersistentVolumeClaimSpec{VolumeName: "v"}}},
			refuse: "claim other/mine (uid m) asks for this volume"},
		{name: "claim recreated with the same name, asking for it", pv: func(h string) *corev1.PersistentVolume { return provisionedPV("v", h, corev1.VolumeReleased, del, ref) },
			claims: []*corev1.PersistentVolumeClaim{{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "data", UID: "new"}, Spec: corev1.PersistentVolumeClaimSpec{VolumeName: "v"}}},
			refuse: "claim ns/data (uid new) asks for this volume"},
		{name: "gone, no journal record", sent: func(h string) *corev1.PersistentVolume { return provisionedPV("v", h, corev1.VolumeReleased, del, nil) },
			refuse: "does not exist and no deletion of it is journaled"},
		{name: "gone, its deletion journaled but failed finally", sent: func(h string) *corev1.PersistentVolume { return provisionedPV("v", h, corev1.VolumeReleased, del, nil) },
			record: func(r *reclaimerv1.Reclaim) { r.State = reclaimerv1.State_STATE_FAILED },
			refuse: "does not exist and no deletion of it is journaled"},
		{name: "gone, its deletion journaled, of another uid", sent: func(h string) *corev1.PersistentVolume {
			v := provisionedPV("v", h, corev1.VolumeReleased, del, nil)
			v.UID = "forged"
			return v
		}, record: func(*reclaimerv1.Reclaim) {}, refuse: "the volume was recreated"},
		{name: "gone, its deletion journaled", record: func(*reclaimerv1.Reclaim) {}},
		{name: "released", pv: func(h string) *corev1.PersistentVolume { return provisionedPV("v", h, corev1.VolumeFailed, del, ref) }},
		{name: "claim recreated with the same name, not asking for it", pv: func(h string) *corev1.PersistentVolume { return provisionedPV("v", h, corev1.VolumeReleased, del, ref) },
			claims: []*corev1.PersistentVolumeClaim{{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "data", UID: "new"}}}},
		{name: "the PV object deleted first", pv: func(h string) *corev1.PersistentVolume {
			v := provisionedPV("v", h, corev1.VolumeReleased, del, ref)
			v.Finalizers, v.DeletionTimestamp = []string{kube.FinalizerExternalProvisioner}, &now
			return v
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGuarded(t)
			handle := g.volume(t, "backing")
			for _, c := range tc.claims {
				g.addClaim(t, c)
			}
			if tc.pv != nil {
				if _, err := g.api.CoreV1().PersistentVolumes().Create(t.Context(), tc.pv(handle), metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			if tc.record != nil {
				// The reclaimer's record, with the volume as it was when
				// the deletion began.
				r := deletingRecord(t, "v", devcsi.DefaultName, handle)
				tc.record(r)
				b, err := reclaimjournal.Encode(r)
				if err != nil {
					t.Fatal(err)
				}
				if err := g.journal.Put(t.Context(), reclaimjournal.Kind, "v", "", b); err != nil {
					t.Fatal(err)
				}
			}
			req := &provisionerv1.DeleteVolumeRequest{VolumeName: "v"}
			if tc.sent != nil {
				// The forgery names another volume's handle: never used.
				req.Volume, _ = kube.EncodeProto(tc.sent(g.volume(t, "victim")))
			}
			resp, err := g.s.DeleteVolume(t.Context(), req)
			if tc.refuse != "" {
				if status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), tc.refuse) {
					t.Fatalf("got %v %v, want FailedPrecondition with %q", resp, err, tc.refuse)
				}
				if !g.intact(handle) {
					t.Fatal("the backing volume's data is gone")
				}
			} else if err != nil || resp.Outcome != provisionerv1.Outcome_OUTCOME_FINISHED || g.intact(handle) {
				t.Fatalf("got %v %v (data left: %v), want the backing volume deleted", resp, err, g.intact(handle))
			}
		})
	}
}

// A replica without an etcd session deletes nothing, by either path (the
// volume as the API server has it, or the journaled copy of one that is
// gone): the caller is told to try again, and the data stays.
func TestDeleteVolumeNeedsAnEtcdSession(t *testing.T) {
	ref := &corev1.ObjectReference{Namespace: "ns", Name: "data", UID: "claim-uid"}
	for _, gone := range []bool{false, true} {
		g := newGuarded(t)
		handle := g.volume(t, "backing")
		if gone {
			b, err := reclaimjournal.Encode(deletingRecord(t, "v", devcsi.DefaultName, handle))
			if err != nil {
				t.Fatal(err)
			}
			if err := g.journal.Put(t.Context(), reclaimjournal.Kind, "v", "", b); err != nil {
				t.Fatal(err)
			}
		} else if _, err := g.api.CoreV1().PersistentVolumes().Create(t.Context(),
			provisionedPV("v", handle, corev1.VolumeReleased, corev1.PersistentVolumeReclaimDelete, ref), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		live := false
		g.s.p.session = func() bool { return live }
		resp, err := g.s.DeleteVolume(t.Context(), &provisionerv1.DeleteVolumeRequest{VolumeName: "v"})
		if err != nil || resp.Outcome != provisionerv1.Outcome_OUTCOME_IN_BACKGROUND || !strings.Contains(resp.Message, "no etcd session") || !g.intact(handle) {
			t.Fatalf("gone %v, without a session: %v %v (data intact: %v)", gone, resp, err, g.intact(handle))
		}
		live = true
		if resp, err := g.s.DeleteVolume(t.Context(), &provisionerv1.DeleteVolumeRequest{VolumeName: "v"}); err != nil ||
			resp.Outcome != provisionerv1.Outcome_OUTCOME_FINISHED || g.intact(handle) {
			t.Fatalf("gone %v, with the session back: %v %v", gone, resp, err)
		}
	}
}

// A forged claim or class in Provision changes nothing the driver gets,
// and reads no secret the real class does not name. A claim and class
// whose UID and resourceVersion the cache holds are taken from the cache,
// without a read.
func TestProvisionNeverUsesSentObjects(t *testing.T) {
	fast := "fast"
	real := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "data", UID: "u1", ResourceVersion: "7"},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &fast, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}}},
	}
	class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast", UID: "c1", ResourceVersion: "3"}, Provisioner: devcsi.DefaultName,
		Parameters: map[string]string{"tier": "gold"}}
	forge := func(rv string) ([]byte, []byte) {
		c := real.DeepCopy()
		c.ResourceVersion = rv
		c.Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse("1Ti")
		c.Annotations = map[string]string{kube.AnnSelectedNode: "elsewhere"}
		sc := class.DeepCopy()
		sc.ResourceVersion = rv
		sc.Parameters = map[string]string{"tier": "platinum", paramProvisionerSecretName: "admin", paramProvisionerSecretNamespace: "kube-system"}
		cb, _ := kube.EncodeProto(c)
		sb, _ := kube.EncodeProto(sc)
		return cb, sb
	}
	for name, tc := range map[string]struct {
		rv    string // of the forged objects
		reads int    // claim and class reads from the API server
	}{
		"forged with the real UID and resourceVersion": {rv: "7", reads: 1}, // the class's RV is 3: read
		"forged with another resourceVersion":          {rv: "99", reads: 2},
	} {
		t.Run(name, func(t *testing.T) {
			g := newGuarded(t)
			g.addClaim(t, real)
			if _, err := g.api.StorageV1().StorageClasses().Create(t.Context(), class, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			if err := g.classes.Add(class); err != nil {
				t.Fatal(err)
			}
			g.api.ClearActions()
			cb, sb := forge(tc.rv)
			resp, err := g.s.Provision(t.Context(), &provisionerv1.ProvisionRequest{ClaimNamespace: "app", ClaimName: "data", ClaimUid: "u1", Claim: cb, StorageClass: sb})
			if err != nil || resp.Outcome != provisionerv1.Outcome_OUTCOME_FINISHED {
				t.Fatalf("%v %v", resp, err)
			}
			g.mu.Lock()
			defer g.mu.Unlock()
			if len(g.creates) != 1 {
				t.Fatalf("CreateVolume calls: %d", len(g.creates))
			}
			got := g.creates[0]
			if got.CapacityRange.GetRequiredBytes() != 1<<20 || got.Parameters["tier"] != "gold" || len(got.Secrets) != 0 ||
				// The real class has no allowedTopologies: the only node's
				// segment, never the forged class's topologies.
				len(got.GetAccessibilityRequirements().GetRequisite()) != 1 ||
				got.GetAccessibilityRequirements().GetRequisite()[0].GetSegments()[devcsi.TopologyKey] != "node-a" {
				t.Errorf("CreateVolume got the forged request: %v", got)
			}
			reads := 0
			for _, a := range g.api.Actions() {
				if a.GetVerb() == "get" && a.GetResource().Resource == "secrets" {
					t.Errorf("a secret was read: %v", a)
				}
				if a.GetVerb() == "get" && (a.GetResource().Resource == "persistentvolumeclaims" || a.GetResource().Resource == "storageclasses") {
					reads++
				}
			}
			// Plus the two re-checks of the claim, right before CreateVolume
			// and before the PV, which never trust a cache.
			if reads != tc.reads+2 {
				t.Errorf("%d reads of the claim and class, want %d and the 2 re-checks", reads, tc.reads)
			}
		})
	}
}

// A claim hint of another namespace, a class hint of another class, or a
// claim bound elsewhere: the request is refused or the hint ignored.
func TestProvisionRefusals(t *testing.T) {
	g := newGuarded(t)
	fast := "fast"
	g.addClaim(t, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "bound", UID: "b1"},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &fast, VolumeName: "static-pv"}})
	other, _ := kube.EncodeProto(&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "victim", Name: "data", UID: "u1"}})
	for name, tc := range map[string]struct {
		req  *provisionerv1.ProvisionRequest
		code codes.Code
		msg  string
	}{
		"claim of another namespace": {&provisionerv1.ProvisionRequest{ClaimNamespace: "app", ClaimName: "data", ClaimUid: "u1", Claim: other}, codes.InvalidArgument, `claim is "victim"/"data"`},
		"claim bound elsewhere":      {&provisionerv1.ProvisionRequest{ClaimNamespace: "app", ClaimName: "bound"}, codes.FailedPrecondition, "asks for volume static-pv"},
		"invalid namespace":          {&provisionerv1.ProvisionRequest{ClaimNamespace: "App_1", ClaimName: "x"}, codes.InvalidArgument, `claim_namespace "App_1" is not a valid name`},
		"invalid name":               {&provisionerv1.ProvisionRequest{ClaimNamespace: "app", ClaimName: "a/../b"}, codes.InvalidArgument, `claim_name "a/../b" is not a valid name`},
		"invalid UTF-8":              {&provisionerv1.ProvisionRequest{ClaimNamespace: "app", ClaimName: "x", ClaimUid: "\xff"}, codes.InvalidArgument, "claim_uid is not valid UTF-8"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := g.s.Provision(t.Context(), tc.req)
			if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.msg) {
				t.Errorf("got %v, want %v containing %q", err, tc.code, tc.msg)
			}
		})
	}
	if len(g.creates) != 0 {
		t.Errorf("CreateVolume was called %d times", len(g.creates))
	}
}
