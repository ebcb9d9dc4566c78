package provisioner

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-lib-utils/connection"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/metrics"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// startDriver runs the dev CSI driver on a unix socket for one test.
func startDriver(t *testing.T) (*devcsi.Driver, string) {
	t.Helper()
	return startDriverNamed(t, "")
}

// startDriverNamed starts a dev CSI driver named name (default
// devcsi.DefaultName).
func startDriverNamed(t *testing.T, name string) (*devcsi.Driver, string) {
	t.Helper()
	return startDriverWith(t, devcsi.Options{Name: name})
}

// startDriverWith is startDriverNamed with more of the driver's options;
// its root, node and logger are the test's.
func startDriverWith(t *testing.T, o devcsi.Options) (*devcsi.Driver, string) {
	t.Helper()
	o.RootDir, o.NodeID, o.Logger = t.TempDir(), "node-a", discard
	d, err := devcsi.New(o)
	if err != nil {
		t.Fatal(err)
	}
	ep := "unix://" + filepath.Join(t.TempDir(), "csi.sock")
	lis, err := grpcutil.Listen(ep)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = d.Run(ctx, lis) }()
	t.Cleanup(func() { cancel(); <-done })
	return d, ep
}

func TestProbeFindsTheDriversAbilities(t *testing.T) {
	_, ep := startDriver(t)
	reg := newRegistry(discard)
	for _, e := range []string{ep, "other.example.com=unix:///nonexistent/csi.sock"} {
		name, addr := parseEndpoint(e)
		cc, err := grpcutil.DialCSI(addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		reg.add(newDriver(addr, name, cc))
	}
	reg.probeAll(t.Context())
	s := &server{p: &provisioner{drivers: reg}}
	resp, err := s.ListDrivers(t.Context(), &provisionerv1.ListDriversRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Drivers) != 2 {
		t.Fatalf("drivers %v", resp.Drivers)
	}
	dev := resp.Drivers[0]
	if dev.DriverName != devcsi.DefaultName || dev.ProvisionerName != devcsi.DefaultName || !dev.Ready {
		t.Fatalf("dev driver %v", dev)
	}
	for _, c := range []string{"CONTROLLER_SERVICE", "VOLUME_ACCESSIBILITY_CONSTRAINTS", "CREATE_DELETE_VOLUME", "CLONE_VOLUME"} {
		if !strings.Contains(strings.Join(dev.Capabilities, " "), c) {
			t.Errorf("capabilities %v lack %s", dev.Capabilities, c)
		}
	}
	if d := reg.byProvisioner(devcsi.DefaultName); d == nil || !d.current().topology || !d.has(csi.ControllerServiceCapability_RPC_CLONE_VOLUME) {
		t.Errorf("registry does not know the dev driver's topology and clone abilities")
	}
	if bad := resp.Drivers[1]; bad.Ready || bad.ProvisionerName != "other.example.com" || !strings.Contains(bad.Message, "GetPluginInfo") {
		t.Fatalf("unreachable driver %v", bad)
	}
	if reg.byProvisioner("other.example.com") == nil {
		t.Error("a driver mapped by name is not found by that name before it answers")
	}
}

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		err        error
		reschedule bool
		want       provisionerv1.Outcome
	}{
		{nil, false, provisionerv1.Outcome_OUTCOME_FINISHED},
		{status.Error(codes.DeadlineExceeded, "x"), false, provisionerv1.Outcome_OUTCOME_IN_BACKGROUND},
		{status.Error(codes.Unavailable, "x"), false, provisionerv1.Outcome_OUTCOME_IN_BACKGROUND},
		{status.Error(codes.Aborted, "x"), false, provisionerv1.Outcome_OUTCOME_IN_BACKGROUND},
		{status.Error(codes.Canceled, "x"), false, provisionerv1.Outcome_OUTCOME_IN_BACKGROUND},
		{context.DeadlineExceeded, false, provisionerv1.Outcome_OUTCOME_IN_BACKGROUND},
		{errors.New("connection reset"), false, provisionerv1.Outcome_OUTCOME_IN_BACKGROUND},
		{status.Error(codes.ResourceExhausted, "x"), true, provisionerv1.Outcome_OUTCOME_RESCHEDULE},
		{status.Error(codes.ResourceExhausted, "x"), false, provisionerv1.Outcome_OUTCOME_NO_CHANGE},
		{status.Error(codes.InvalidArgument, "x"), true, provisionerv1.Outcome_OUTCOME_NO_CHANGE},
		{status.Error(codes.AlreadyExists, "x"), false, provisionerv1.Outcome_OUTCOME_NO_CHANGE},
		{status.Error(codes.OutOfRange, "x"), false, provisionerv1.Outcome_OUTCOME_NO_CHANGE},
	} {
		if got := classify(tc.err, tc.reschedule); got != tc.want {
			t.Errorf("classify(%v, reschedule=%v) = %v, want %v", tc.err, tc.reschedule, got, tc.want)
		}
	}
}

func claimOf(modes []corev1.PersistentVolumeAccessMode, block bool, size, limit string) *corev1.PersistentVolumeClaim {
	c := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "data", UID: "u-1", Annotations: map[string]string{"team": "blue"}},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: modes,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}}},
	}
	if limit != "" {
		c.Spec.Resources.Limits = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(limit)}
	}
	if block {
		m := corev1.PersistentVolumeBlock
		c.Spec.VolumeMode = &m
	}
	return c
}

func TestRequestParts(t *testing.T) {
	rwo := []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
	class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, Parameters: map[string]string{
		"type": "ssd", paramFSType: "xfs", paramProvisionerSecretName: "s", paramProvisionerSecretNamespace: "ns"}}

	t.Run("parameters drop csi keys and add metadata on request", func(t *testing.T) {
		c := claimOf(rwo, false, "1Gi", "")
		if got := driverParameters(class, c, "pvc-u-1", false); len(got) != 1 || got["type"] != "ssd" {
			t.Errorf("without metadata: %v", got)
		}
		got := driverParameters(class, c, "pvc-u-1", true)
		if got[paramPVCName] != "data" || got[paramPVCNamespace] != "ns" || got[paramPVName] != "pvc-u-1" || len(got) != 4 {
			t.Errorf("with metadata: %v", got)
		}
	})
	t.Run("fstype", func(t *testing.T) {
		if got := fsType(class, claimOf(rwo, false, "1Gi", ""), "ext4"); got != "xfs" {
			t.Errorf("class fstype: %q", got)
		}
		if got := fsType(&storagev1.StorageClass{}, claimOf(rwo, false, "1Gi", ""), "ext4"); got != "ext4" {
			t.Errorf("default fstype: %q", got)
		}
		if got := fsType(class, claimOf(rwo, true, "1Gi", ""), "ext4"); got != "" {
			t.Errorf("block volume fstype: %q", got)
		}
	})
	t.Run("unknown reserved keys are rejected", func(t *testing.T) {
		bad := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "x"}, Parameters: map[string]string{csiParameterPrefix + "provisioner-secret-nme": "s"}}
		if err := checkClassParameters(bad); err == nil || !strings.Contains(err.Error(), "provisioner-secret-nme") {
			t.Errorf("got %v", err)
		}
		if err := checkClassParameters(class); err != nil {
			t.Error(err)
		}
	})
	t.Run("capabilities", func(t *testing.T) {
		for _, tc := range []struct {
			modes []corev1.PersistentVolumeAccessMode
			block bool
			multi bool
			want  []csi.VolumeCapability_AccessMode_Mode
		}{
			{rwo, false, false, []csi.VolumeCapability_AccessMode_Mode{csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}},
			{rwo, false, true, []csi.VolumeCapability_AccessMode_Mode{csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER}},
			{[]corev1.PersistentVolumeAccessMode{corev1.ReadWriteOncePod}, false, true, []csi.VolumeCapability_AccessMode_Mode{csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER}},
			{[]corev1.PersistentVolumeAccessMode{corev1.ReadOnlyMany, corev1.ReadWriteMany}, true, false, []csi.VolumeCapability_AccessMode_Mode{csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY, csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER}},
		} {
			caps, err := volumeCapabilities(claimOf(tc.modes, tc.block, "1Gi", ""), "ext4", []string{"noatime"}, tc.multi)
			if err != nil || len(caps) != len(tc.want) {
				t.Fatalf("%v: %v %v", tc.modes, caps, err)
			}
			for i, c := range caps {
				if c.GetAccessMode().GetMode() != tc.want[i] {
					t.Errorf("%v: mode %v, want %v", tc.modes, c.GetAccessMode().GetMode(), tc.want[i])
				}
				if tc.block != (c.GetBlock() != nil) {
					t.Errorf("%v: block=%v but capability %v", tc.modes, tc.block, c)
				}
				if !tc.block && (c.GetMount().GetFsType() != "ext4" || c.GetMount().GetMountFlags()[0] != "noatime") {
					t.Errorf("mount capability %v", c)
				}
			}
		}
	})
	t.Run("capacity range", func(t *testing.T) {
		// As external-provisioner: the request, never a limit (drivers
		// that round up would fail), whatever limit the claim sets.
		for _, limit := range []string{"", "2Gi"} {
			r, err := capacityRange(claimOf(rwo, false, "1Gi", limit))
			if err != nil || r.RequiredBytes != 1<<30 || r.LimitBytes != 0 {
				t.Errorf("limit %q: %v %v", limit, r, err)
			}
		}
	})
}

// fakeNodes is a cluster's nodes for topology.
type fakeNodes map[string]map[string]string // node -> labels; every node has the driver with key "zone"

var _ nodes = fakeNodes{}

func (f fakeNodes) Node(name string) (*corev1.Node, error) {
	l, ok := f[name]
	if !ok {
		return nil, errors.New("not found")
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}}, nil
}
func (f fakeNodes) CSINode(name string) (*storagev1.CSINode, error) {
	if _, ok := f[name]; !ok {
		return nil, errors.New("not found")
	}
	return &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: storagev1.CSINodeSpec{
		Drivers: []storagev1.CSINodeDriver{{Name: "drv", TopologyKeys: []string{"zone"}}, {Name: devcsi.DefaultName, TopologyKeys: []string{devcsi.TopologyKey}}}}}, nil
}
func (f fakeNodes) CSINodes() ([]*storagev1.CSINode, error) {
	var out []*storagev1.CSINode
	for n := range f {
		cn, _ := f.CSINode(n)
		out = append(out, cn)
	}
	return out, nil
}

func (f fakeNodes) Nodes() ([]*corev1.Node, error) {
	var out []*corev1.Node
	for n := range f {
		node, _ := f.Node(n)
		out = append(out, node)
	}
	return out, nil
}

// The expectations are external-provisioner v6.3.0's
// (GenerateAccessibilityRequirements with --immediate-topology).
func TestAccessibilityRequirements(t *testing.T) {
	n := fakeNodes{"a": {"zone": "z1"}, "b": {"zone": "z2"}, "c": {"zone": "z2"}, "d": {}}
	allowed := []corev1.TopologySelectorTerm{{MatchLabelExpressions: []corev1.TopologySelectorLabelRequirement{{Key: "zone", Values: []string{"z3", "z2"}}}}}
	segs := func(ts []*csi.Topology) []string {
		var out []string
		for _, t := range ts {
			out = append(out, t.GetSegments()["zone"])
		}
		return out
	}
	for _, tc := range []struct {
		name      string
		allowed   []corev1.TopologySelectorTerm
		node      string
		strict    bool
		requisite []string
		preferred string // first preferred segment, when a node is selected
		err       string
	}{
		{name: "all nodes with the driver", requisite: []string{"z1", "z2"}},
		{name: "allowed topologies, sorted", allowed: allowed, requisite: []string{"z2", "z3"}},
		{name: "selected node: every segment, its own first", node: "b", requisite: []string{"z1", "z2"}, preferred: "z2"},
		{name: "selected node, strict", node: "b", strict: true, requisite: []string{"z2"}, preferred: "z2"},
		{name: "selected node within allowed", allowed: allowed, node: "c", requisite: []string{"z2", "z3"}, preferred: "z2"},
		{name: "selected node outside allowed", allowed: allowed, node: "a", err: "not in requisite"},
		{name: "selected node outside allowed, strict", allowed: allowed, node: "a", strict: true, err: "outside the allowedTopologies"},
		{name: "selected node without the label", node: "d", err: `no label "zone"`},
		{name: "unknown selected node", node: "zz", err: "failed to get selected CSINode zz"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "c"}, AllowedTopologies: tc.allowed}
			req, err := accessibilityRequirements(n, "drv", class, tc.node, "data", tc.strict)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %v %v, want error %q", req, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := segs(req.GetRequisite()); strings.Join(got, ",") != strings.Join(tc.requisite, ",") {
				t.Errorf("requisite %v, want %v", got, tc.requisite)
			}
			if len(req.GetPreferred()) != len(req.GetRequisite()) {
				t.Errorf("preferred %v", segs(req.GetPreferred()))
			}
			if tc.preferred != "" && segs(req.GetPreferred())[0] != tc.preferred {
				t.Errorf("preferred %v, want %s first", segs(req.GetPreferred()), tc.preferred)
			}
		})
	}
	t.Run("no node has the driver", func(t *testing.T) {
		_, err := accessibilityRequirements(fakeNodes{}, "drv", &storagev1.StorageClass{}, "", "data", false)
		if err == nil || !strings.Contains(err.Error(), "no available topology found") {
			t.Fatalf("got %v, want upstream's error", err)
		}
	})
}

// Immediate binding spreads claims as external-provisioner does: the
// claims of one StatefulSet member get the same first preference, and
// consecutive members the next segment.
func TestImmediateTopologySpreadsStatefulSetMembers(t *testing.T) {
	n := fakeNodes{"a": {"zone": "z1"}, "b": {"zone": "z2"}, "c": {"zone": "z3"}}
	first := func(claim string) string {
		req, err := accessibilityRequirements(n, "drv", &storagev1.StorageClass{}, "", claim, false)
		if err != nil {
			t.Fatal(err)
		}
		return req.GetPreferred()[0].GetSegments()["zone"]
	}
	if first("data-web-0") != first("logs-web-0") {
		t.Errorf("two claims of member web-0 prefer %s and %s", first("data-web-0"), first("logs-web-0"))
	}
	zones := map[string]bool{}
	for _, c := range []string{"data-web-0", "data-web-1", "data-web-2"} {
		zones[first(c)] = true
	}
	if len(zones) != 3 {
		t.Errorf("three members share %d zones, want 3", len(zones))
	}
	h0, i0 := claimNameHash("data-web-0")
	h1, i1 := claimNameHash("www-web-1")
	if h0 != h1 || i0 != 0 || i1 != 1 {
		t.Errorf("hash %d+%d and %d+%d: the StatefulSet name alone is hashed", h0, i0, h1, i1)
	}
}

func TestBuildVolume(t *testing.T) {
	policy := corev1.PersistentVolumeReclaimRetain
	class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, Provisioner: "p", MountOptions: []string{"noatime"}}
	claim := claimOf([]corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, false, "1Gi", "")
	vol := &csi.Volume{VolumeId: "id-1", CapacityBytes: 2 << 30, VolumeContext: map[string]string{"k": "v"},
		AccessibleTopology: []*csi.Topology{{Segments: map[string]string{"zone": "z1"}}}}
	spec := volumeSpec{name: "pvc-u-1", provisioner: "p", driver: "d", claim: claim, class: class, fsType: "ext4", topology: true,
		secrets: map[string]*secretRef{"provisioner": {"ns", "del"}, "node-publish": {"ns", "pub"}}}

	pv := buildVolume(spec, vol)
	if pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete || len(pv.Finalizers) != 1 || pv.Finalizers[0] != kube.FinalizerExternalProvisioner {
		t.Errorf("default policy Delete with the finalizer: %v %v", pv.Spec.PersistentVolumeReclaimPolicy, pv.Finalizers)
	}
	if q := pv.Spec.Capacity[corev1.ResourceStorage]; q.Value() != 2<<30 {
		t.Errorf("capacity %s, want the driver's 2Gi", q.String())
	}
	src := pv.Spec.CSI
	if src.Driver != "d" || src.VolumeHandle != "id-1" || src.FSType != "ext4" || src.VolumeAttributes["k"] != "v" || src.NodePublishSecretRef.Name != "pub" || src.NodeStageSecretRef != nil {
		t.Errorf("CSI source %+v", src)
	}
	if pv.Annotations[kube.AnnDynamicallyProvisioned] != "p" || pv.Annotations[annDeletionSecretName] != "del" || pv.Annotations[annDeletionSecretNamespace] != "ns" {
		t.Errorf("annotations %v", pv.Annotations)
	}
	if ref := pv.Spec.ClaimRef; ref == nil || ref.UID != claim.UID || ref.Name != "data" || ref.Namespace != "ns" {
		t.Errorf("claimRef %v", ref)
	}
	terms := pv.Spec.NodeAffinity.Required.NodeSelectorTerms
	if len(terms) != 1 || terms[0].MatchExpressions[0].Key != "zone" || terms[0].MatchExpressions[0].Values[0] != "z1" {
		t.Errorf("node affinity %v", terms)
	}
	if pv.Spec.MountOptions[0] != "noatime" || pv.Spec.StorageClassName != "fast" {
		t.Errorf("mount options %v, class %q", pv.Spec.MountOptions, pv.Spec.StorageClassName)
	}

	class.ReclaimPolicy = &policy
	if pv := buildVolume(spec, &csi.Volume{VolumeId: "id-2"}); len(pv.Finalizers) != 0 || pv.Spec.NodeAffinity != nil {
		t.Errorf("Retain: finalizers %v, affinity %v", pv.Finalizers, pv.Spec.NodeAffinity)
	} else if q := pv.Spec.Capacity[corev1.ResourceStorage]; q.String() != "1Gi" {
		t.Errorf("capacity without the driver's answer: %s, want the request", q.String())
	}
}

func TestRequestValidation(t *testing.T) {
	gold := "gold"
	none := ""
	nobody := "nobody"
	api := fake.NewClientset(
		&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "orphan", UID: "u2"}, Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &gold}},
		&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "classless", UID: "u3"}, Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &none}},
		&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c", UID: "u1"}, Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &nobody}},
		&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "nobody"}, Provisioner: "nobody.example.com"},
		&corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "hostpath"}, Spec: corev1.PersistentVolumeSpec{PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete},
			Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeReleased}},
	)
	s := newServer(&provisioner{client: api, drivers: newRegistry(discard), prefix: "pvc", journal: newMemJournal(), inflight: map[string]bool{}}, newObjectCache())
	ctx := t.Context()
	claim, _ := kube.EncodeProto(&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c", UID: "u1"}})
	other := "other"
	otherClaim, _ := kube.EncodeProto(&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c", UID: "u1"}, Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &other}})
	class, _ := kube.EncodeProto(&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: ""}, Provisioner: "nobody.example.com"})
	for name, tc := range map[string]struct {
		req  *provisionerv1.ProvisionRequest
		code codes.Code
		msg  string
	}{
		"empty":             {&provisionerv1.ProvisionRequest{}, codes.InvalidArgument, "claim_namespace is required"},
		"garbage claim":     {&provisionerv1.ProvisionRequest{ClaimNamespace: "ns", ClaimName: "c", ClaimUid: "u1", Claim: []byte{0xff, 0x01}}, codes.InvalidArgument, "claim: decode"},
		"claim without uid": {&provisionerv1.ProvisionRequest{ClaimNamespace: "ns", ClaimName: "c", Claim: claim}, codes.InvalidArgument, "claim_uid is required with claim"},
		"other claim":       {&provisionerv1.ProvisionRequest{ClaimNamespace: "ns", ClaimName: "d", ClaimUid: "u1", Claim: claim}, codes.InvalidArgument, "not the claim_namespace"},
		"forged class":      {&provisionerv1.ProvisionRequest{ClaimNamespace: "ns", ClaimName: "c", ClaimUid: "u1", Claim: otherClaim, StorageClass: class}, codes.FailedPrecondition, `"nobody.example.com" of StorageClass "nobody"`},
		"not served":        {&provisionerv1.ProvisionRequest{ClaimNamespace: "ns", ClaimName: "c", ClaimUid: "u1", Claim: claim, StorageClass: class}, codes.FailedPrecondition, "nobody.example.com"},
		"no such claim":     {&provisionerv1.ProvisionRequest{ClaimNamespace: "ns", ClaimName: "ghost"}, codes.NotFound, "claim ns/ghost not found"},
		"recreated claim":   {&provisionerv1.ProvisionRequest{ClaimNamespace: "ns", ClaimName: "orphan", ClaimUid: "old"}, codes.FailedPrecondition, "it was recreated"},
		"no such class":     {&provisionerv1.ProvisionRequest{ClaimNamespace: "ns", ClaimName: "orphan"}, codes.NotFound, "StorageClass gold not found"},
		"classless claim":   {&provisionerv1.ProvisionRequest{ClaimNamespace: "ns", ClaimName: "classless"}, codes.FailedPrecondition, "names no StorageClass"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := s.Provision(ctx, tc.req)
			if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.msg) {
				t.Errorf("got %v, want %v containing %q", err, tc.code, tc.msg)
			}
		})
	}
	hostPath, _ := kube.EncodeProto(&corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv"}})
	for name, tc := range map[string]struct {
		req  *provisionerv1.DeleteVolumeRequest
		code codes.Code
		msg  string
	}{
		"no name":              {&provisionerv1.DeleteVolumeRequest{}, codes.InvalidArgument, "volume_name is required"},
		"sent, not in the API": {&provisionerv1.DeleteVolumeRequest{VolumeName: "pv", Volume: hostPath}, codes.FailedPrecondition, "PersistentVolume pv does not exist"},
		"read from the API":    {&provisionerv1.DeleteVolumeRequest{VolumeName: "hostpath"}, codes.FailedPrecondition, "not a CSI volume"},
		"no such volume":       {&provisionerv1.DeleteVolumeRequest{VolumeName: "ghost"}, codes.FailedPrecondition, "PersistentVolume ghost does not exist and no deletion of it is journaled"},
		"invalid name":         {&provisionerv1.DeleteVolumeRequest{VolumeName: "a b"}, codes.InvalidArgument, `volume_name "a b" is not a valid name`},
		"mismatched names":     {&provisionerv1.DeleteVolumeRequest{VolumeName: "other", Volume: hostPath}, codes.InvalidArgument, "does not match"},
	} {
		t.Run("delete "+name, func(t *testing.T) {
			_, err := s.DeleteVolume(ctx, tc.req)
			if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.msg) {
				t.Errorf("got %v, want %v containing %q", err, tc.code, tc.msg)
			}
		})
	}
}

func TestOptionErrorsNameTheFlag(t *testing.T) {
	o := Options{CSIEndpoints: []string{"a=unix:///x", "a=unix:///y", " "}, VolumeNamePrefix: "Bad/Prefix", Timeout: -1, StaleAfter: -1}
	err := o.validate()
	for _, want := range []string{"--listen", "--etcd-endpoints", "--tls-ca-file", "mapped to two CSI endpoints", "has no address", "--volume-name-prefix", "--timeout", "--watcher-stale-after"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not mention %q", err, want)
		}
	}
}

func TestCSICallsAreTimedWithExternalProvisionersMetric(t *testing.T) {
	_, ep := startDriver(t)
	_, addr := parseEndpoint(ep)
	// Two drivers' managers, each with its own registry, served together.
	other := newCSIMetrics()
	other.SetDriverName("other.csi.example.com")
	cm := newCSIMetrics()
	cm.SetDriverName(devcsi.DefaultName)
	cc, err := grpcutil.DialCSI(addr, grpc.WithChainUnaryInterceptor(csiLogger(discard, addr),
		connection.ExtendedCSIMetricsManager{CSIMetricsManager: cm}.RecordMetricsClientInterceptor))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	if _, err := csi.NewIdentityClient(cc).Probe(t.Context(), &csi.ProbeRequest{}); err != nil {
		t.Fatal(err)
	}
	otherCC, err := grpcutil.DialCSI(addr, grpc.WithChainUnaryInterceptor(connection.ExtendedCSIMetricsManager{CSIMetricsManager: other}.RecordMetricsClientInterceptor))
	if err != nil {
		t.Fatal(err)
	}
	defer otherCC.Close()
	if _, err := csi.NewIdentityClient(otherCC).Probe(t.Context(), &csi.ProbeRequest{}); err != nil {
		t.Fatal(err)
	}
	families, err := metrics.Gatherer().Gather()
	if err != nil {
		t.Fatalf("/metrics cannot gather the drivers' registries together: %v", err)
	}
	for _, f := range families {
		if f.GetName() != "csi_sidecar_operations_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["driver_name"] == devcsi.DefaultName && labels["method_name"] == "/csi.v1.Identity/Probe" &&
				labels["grpc_status_code"] == "OK" && m.GetHistogram().GetSampleCount() > 0 {
				return
			}
		}
	}
	t.Fatal("no csi_sidecar_operations_seconds sample for the Probe call")
}
