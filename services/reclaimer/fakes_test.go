package reclaimer

import (
	"context"
	"fmt"
	"go.opentelemetry.io/otel/trace"
	"io"
	"log/slog"
	"os"
	"slices"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/pkg/kube"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// fakeCluster is an API server in memory: resourceVersions, UID
// preconditions, finalizers, and status written only through
// UpdateVolumeStatus.
type fakeCluster struct {
	mu      sync.Mutex
	rv      int
	pvs     map[string]*corev1.PersistentVolume
	pvcs    map[string]*corev1.PersistentVolumeClaim
	pods    map[string]*corev1.Pod
	nodes   map[string]*corev1.Node
	created []string // recycler pods created, in order
}

var _ cluster = (*fakeCluster)(nil)

func newFakeCluster() *fakeCluster {
	return &fakeCluster{pvs: map[string]*corev1.PersistentVolume{}, pvcs: map[string]*corev1.PersistentVolumeClaim{},
		pods: map[string]*corev1.Pod{}, nodes: map[string]*corev1.Node{}}
}

func (f *fakeCluster) nextRV() string { f.rv++; return strconv.Itoa(f.rv) }

func notFound(res, name string) error {
	return apierrors.NewNotFound(schema.GroupResource{Resource: res}, name)
}

func (f *fakeCluster) addPV(v *corev1.PersistentVolume) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v = v.DeepCopy()
	v.ResourceVersion = f.nextRV()
	f.pvs[v.Name] = v
}

func (f *fakeCluster) addPVC(c *corev1.PersistentVolumeClaim) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c = c.DeepCopy()
	c.ResourceVersion = f.nextRV()
	f.pvcs[c.Namespace+"/"+c.Name] = c
}

func (f *fakeCluster) deletePVC(ns, name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.pvcs, ns+"/"+name)
}

func (f *fakeCluster) addPod(p *corev1.Pod) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p = p.DeepCopy()
	p.ResourceVersion = f.nextRV()
	f.pods[p.Namespace+"/"+p.Name] = p
}

// setPodPhase does what a kubelet does when the pod ends.
func (f *fakeCluster) setPodPhase(ns, name string, phase corev1.PodPhase) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pods[ns+"/"+name].Status.Phase = phase
}

func (f *fakeCluster) pv(name string) *corev1.PersistentVolume {
	f.mu.Lock()
	defer f.mu.Unlock()
	if v := f.pvs[name]; v != nil {
		return v.DeepCopy()
	}
	return nil
}

func (f *fakeCluster) pod(ns, name string) *corev1.Pod {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p := f.pods[ns+"/"+name]; p != nil {
		return p.DeepCopy()
	}
	return nil
}

func (f *fakeCluster) GetVolume(_ context.Context, name string) (*corev1.PersistentVolume, error) {
	if v := f.pv(name); v != nil {
		return v, nil
	}
	return nil, notFound("persistentvolumes", name)
}

func (f *fakeCluster) update(v *corev1.PersistentVolume, status bool) (*corev1.PersistentVolume, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	cur := f.pvs[v.Name]
	switch {
	case cur == nil:
		return nil, notFound("persistentvolumes", v.Name)
	case cur.ResourceVersion != v.ResourceVersion:
		return nil, apierrors.NewConflict(schema.GroupResource{Resource: "persistentvolumes"}, v.Name, fmt.Errorf("resourceVersion %s is not %s", v.ResourceVersion, cur.ResourceVersion))
	}
	next := v.DeepCopy()
	if status {
		next.Spec, next.ObjectMeta = cur.Spec, cur.ObjectMeta
	} else {
		next.Status = cur.Status
		next.DeletionTimestamp = cur.DeletionTimestamp
	}
	next.ResourceVersion = f.nextRV()
	if next.DeletionTimestamp != nil && len(next.Finalizers) == 0 {
		delete(f.pvs, v.Name)
	} else {
		f.pvs[v.Name] = next
	}
	return next.DeepCopy(), nil
}

func (f *fakeCluster) UpdateVolume(_ context.Context, v *corev1.PersistentVolume) (*corev1.PersistentVolume, error) {
	return f.update(v, false)
}

func (f *fakeCluster) UpdateVolumeStatus(_ context.Context, v *corev1.PersistentVolume) (*corev1.PersistentVolume, error) {
	return f.update(v, true)
}

func (f *fakeCluster) DeleteVolume(_ context.Context, name string, uid types.UID) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	cur := f.pvs[name]
	switch {
	case cur == nil:
		return notFound("persistentvolumes", name)
	case cur.UID != uid:
		return apierrors.NewConflict(schema.GroupResource{Resource: "persistentvolumes"}, name, fmt.Errorf("uid precondition failed"))
	case len(cur.Finalizers) > 0:
		now := metav1.Now()
		cur.DeletionTimestamp = &now
		cur.ResourceVersion = f.nextRV()
	default:
		delete(f.pvs, name)
	}
	return nil
}

func (f *fakeCluster) GetClaim(_ context.Context, ns, name string) (*corev1.PersistentVolumeClaim, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c := f.pvcs[ns+"/"+name]; c != nil {
		return c.DeepCopy(), nil
	}
	return nil, notFound("persistentvolumeclaims", name)
}

func (f *fakeCluster) ClaimsNaming(_ context.Context, volume string) ([]corev1.PersistentVolumeClaim, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []corev1.PersistentVolumeClaim
	for _, c := range f.pvcs {
		if c.Spec.VolumeName == volume {
			out = append(out, *c.DeepCopy())
		}
	}
	return out, nil
}

func (f *fakeCluster) ListPods(_ context.Context, ns string) ([]corev1.Pod, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []corev1.Pod
	for _, p := range f.pods {
		if p.Namespace == ns {
			out = append(out, *p.DeepCopy())
		}
	}
	return out, nil
}

func (f *fakeCluster) GetPod(_ context.Context, ns, name string) (*corev1.Pod, error) {
	if p := f.pod(ns, name); p != nil {
		return p, nil
	}
	return nil, notFound("pods", name)
}

func (f *fakeCluster) CreatePod(_ context.Context, p *corev1.Pod) (*corev1.Pod, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	key := p.Namespace + "/" + p.Name
	if f.pods[key] != nil {
		return nil, apierrors.NewAlreadyExists(schema.GroupResource{Resource: "pods"}, p.Name)
	}
	p = p.DeepCopy()
	p.ResourceVersion = f.nextRV()
	p.UID = types.UID("pod-uid-" + p.ResourceVersion)
	p.CreationTimestamp = metav1.Now()
	p.Status.Phase = corev1.PodPending
	f.pods[key] = p
	f.created = append(f.created, key)
	return p.DeepCopy(), nil
}

func (f *fakeCluster) DeletePod(_ context.Context, ns, name string, uid types.UID) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	cur := f.pods[ns+"/"+name]
	switch {
	case cur == nil:
		return notFound("pods", name)
	case cur.UID != uid:
		return apierrors.NewConflict(schema.GroupResource{Resource: "pods"}, name, fmt.Errorf("uid precondition failed"))
	}
	delete(f.pods, ns+"/"+name)
	return nil
}

func (f *fakeCluster) GetNode(_ context.Context, name string) (*corev1.Node, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if n := f.nodes[name]; n != nil {
		return n.DeepCopy(), nil
	}
	return nil, notFound("nodes", name)
}

// fakeJournal is coord's journal in memory, shared by the replicas of a
// test: a lock per record, writes fenced on it.
type fakeJournal struct {
	mu      sync.Mutex
	records map[string][]byte
	locks   map[string]string
}

var _ journal = (*fakeJournal)(nil)

func newFakeJournal() *fakeJournal {
	return &fakeJournal{records: map[string][]byte{}, locks: map[string]string{}}
}

func (j *fakeJournal) Acquire(_ context.Context, kind, name, holder string) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	k := kind + "/" + name
	if h := j.locks[k]; h != "" && h != holder {
		return fmt.Errorf("op/%s: %w %q", k, coord.ErrReserved, h)
	}
	j.locks[k] = holder
	return nil
}

func (j *fakeJournal) AcquireGet(ctx context.Context, kind, name, holder string) (coord.Record, bool, error) {
	if err := j.Acquire(ctx, kind, name, holder); err != nil {
		return coord.Record{}, false, err
	}
	return j.Get(ctx, kind, name)
}

func (j *fakeJournal) Put(_ context.Context, kind, name, holder string, value []byte) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	k := kind + "/" + name
	if j.locks[k] != holder {
		return fmt.Errorf("journal %s: %w", k, coord.ErrNotOwner)
	}
	j.records[k] = slices.Clone(value)
	return nil
}

func (j *fakeJournal) Finish(_ context.Context, kind, name, holder string) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	k := kind + "/" + name
	if j.locks[k] != holder {
		return fmt.Errorf("finish %s: %w", k, coord.ErrNotOwner)
	}
	delete(j.records, k)
	delete(j.locks, k)
	return nil
}

func (j *fakeJournal) Unlock(_ context.Context, kind, name, holder string) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if k := kind + "/" + name; j.locks[k] == holder {
		delete(j.locks, k)
	}
	return nil
}

func (j *fakeJournal) Get(_ context.Context, kind, name string) (coord.Record, bool, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	k := kind + "/" + name
	v, ok := j.records[k]
	return coord.Record{Kind: kind, Name: name, Value: v, Holder: j.locks[k]}, ok, nil
}

func (j *fakeJournal) List(_ context.Context, kind string) ([]coord.Record, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []coord.Record
	for k, v := range j.records {
		if len(k) > len(kind) && k[:len(kind)+1] == kind+"/" {
			name := k[len(kind)+1:]
			out = append(out, coord.Record{Kind: kind, Name: name, Value: v, Holder: j.locks[k]})
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Name < out[b].Name })
	return out, nil
}

// expire drops every lock of holder, as etcd does when its lease expires.
func (j *fakeJournal) expire(holder string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for k, h := range j.locks {
		if h == holder {
			delete(j.locks, k)
		}
	}
}

func (j *fakeJournal) len() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.records)
}

// fakeProvisioner answers ListDrivers and DeleteVolume as told.
type fakeProvisioner struct {
	mu      sync.Mutex
	drivers []*provisionerv1.Driver
	listErr error
	resp    *provisionerv1.DeleteVolumeResponse
	err     error
	deletes []string
	// traces: the trace of each DeleteVolume call's context.
	traces []trace.TraceID
}

var _ provisioner = (*fakeProvisioner)(nil)

func (p *fakeProvisioner) ListDrivers(context.Context, *provisionerv1.ListDriversRequest, ...grpc.CallOption) (*provisionerv1.ListDriversResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.listErr != nil {
		return nil, p.listErr
	}
	return &provisionerv1.ListDriversResponse{Drivers: p.drivers}, nil
}

func (p *fakeProvisioner) DeleteVolume(ctx context.Context, req *provisionerv1.DeleteVolumeRequest, _ ...grpc.CallOption) (*provisionerv1.DeleteVolumeResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, err := kube.DecodeVolume(req.GetVolume()); err != nil || req.GetVolumeName() == "" {
		return nil, fmt.Errorf("bad request: %v", err)
	}
	p.deletes = append(p.deletes, req.GetVolumeName())
	p.traces = append(p.traces, trace.SpanContextFromContext(ctx).TraceID())
	return p.resp, p.err
}

func (p *fakeProvisioner) answer(resp *provisionerv1.DeleteVolumeResponse, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.resp, p.err = resp, err
}

func (p *fakeProvisioner) calls() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.deletes)
}

// replica is a controller on the fakes, driven step by step by the test
// (no workers run): handle is one worker's sync of one volume.
type replica struct {
	*controller
	events *record.FakeRecorder
	scrubs []string
}

func newReplica(t *testing.T, member string, kc *fakeCluster, j *fakeJournal, p *fakeProvisioner, cfg config) *replica {
	t.Helper()
	if cfg.mode == "" {
		cfg.mode = RecyclePod
	}
	if cfg.namespace == "" {
		cfg.namespace = "default"
	}
	if cfg.mode == RecycleNodeLocal && cfg.prefixes == nil {
		cfg.prefixes = []string{os.TempDir()} // where t.TempDir() makes the volumes
	}
	if cfg.image == "" && cfg.template == nil {
		cfg.image = DefaultRecyclerImage
	}
	if cfg.minTimeout == 0 {
		cfg.minTimeout, cfg.increment = DefaultRecyclerMinimumTimeout, DefaultRecyclerTimeoutIncrement
	}
	if cfg.ttl == 0 {
		cfg.ttl = time.Minute
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	var prov provisioner
	if p != nil {
		prov = p
	}
	events := record.NewFakeRecorder(100)
	// Backoffs stay under retrySlack: a step right after a failure is the
	// retry.
	c := newController(log, member, kc, j, newDrivers(prov, time.Minute, log), prov, events, cfg, time.Millisecond, retrySlack/2, make(chan struct{}))
	t.Cleanup(c.queue.ShutDown)
	r := &replica{controller: c, events: events}
	c.scrub = func(dir string) error {
		r.scrubs = append(r.scrubs, dir)
		return scrubDir(dir)
	}
	return r
}

// drain returns the Events recorded so far, as "Type Reason Message".
func (r *replica) drain() []string {
	var out []string
	for {
		select {
		case e := <-r.events.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

type pvOpt func(*corev1.PersistentVolume)

// releasedPV is a Released 1Gi hostPath volume of claim ns/data, bound by
// the controller.
func releasedPV(name string, policy corev1.PersistentVolumeReclaimPolicy, opts ...pvOpt) *corev1.PersistentVolume {
	v := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), Annotations: map[string]string{kube.AnnBoundByController: "yes"}},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: policy,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/tmp/volplane-unit/" + name}},
			ClaimRef:                      &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: "ns", Name: "data", UID: "claim-uid"},
		},
		Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeReleased},
	}
	for _, o := range opts {
		o(v)
	}
	return v
}

func withCSI(driver string) pvOpt {
	return func(v *corev1.PersistentVolume) {
		v.Spec.PersistentVolumeSource = corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: "h-" + v.Name}}
	}
}

func withProvisionedBy(p string) pvOpt {
	return func(v *corev1.PersistentVolume) { v.Annotations[kube.AnnDynamicallyProvisioned] = p }
}

func withNFS() pvOpt {
	return func(v *corev1.PersistentVolume) {
		v.Spec.PersistentVolumeSource = corev1.PersistentVolumeSource{NFS: &corev1.NFSVolumeSource{Server: "nfs.example", Path: "/exports/" + v.Name}}
	}
}

func withHostPath(dir string) pvOpt {
	return func(v *corev1.PersistentVolume) {
		v.Spec.PersistentVolumeSource = corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir}}
	}
}

func withLocal(dir, node string) pvOpt {
	return func(v *corev1.PersistentVolume) {
		v.Spec.PersistentVolumeSource = corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: dir}}
		v.Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
		}}}}
	}
}

func claim(ns, name, uid, volume string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)},
		Spec:       corev1.PersistentVolumeClaimSpec{VolumeName: volume},
	}
}

func podUsing(ns, name, claimName string, phase corev1.PodPhase) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name)},
		Spec: corev1.PodSpec{Volumes: []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claimName}}}}},
		Status: corev1.PodStatus{Phase: phase},
	}
}
