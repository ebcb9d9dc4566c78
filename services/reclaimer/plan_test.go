package reclaimer

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/served"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
)

func TestDecide(t *testing.T) {
	serving := served.Set{Known: true, Drivers: map[string]bool{"dev.csi.volplane.io": true}, Provisioners: map[string]bool{"dev.csi.volplane.io": true}}
	nothing := served.Set{Known: true}
	unknown := served.Set{Err: errors.New("provisioner unreachable")}
	// The provisioner's only driver is restarting: its endpoint is listed
	// without a name.
	restarting := served.Set{Known: true, Drivers: map[string]bool{}, Provisioners: map[string]bool{}, Unidentified: []string{"unix:///csi.sock"}}
	partly := served.Set{Known: true, Drivers: map[string]bool{"dev.csi.volplane.io": true}, Provisioners: map[string]bool{"dev.csi.volplane.io": true}, Unidentified: []string{"unix:///other.sock"}}
	here := node{name: "node-a", labels: map[string]string{corev1.LabelHostname: "node-a"}}
	const (
		none        = reclaimerv1.Method_METHOD_NONE
		viaProv     = reclaimerv1.Method_METHOD_PROVISIONER
		viaPod      = reclaimerv1.Method_METHOD_RECYCLER_POD
		onNode      = reclaimerv1.Method_METHOD_NODE_LOCAL
		unsupported = reclaimerv1.Method_METHOD_UNSUPPORTED
		undecided   = reclaimerv1.Method_METHOD_UNSPECIFIED
	)
	for _, tc := range []struct {
		name    string
		pv      *corev1.PersistentVolume
		served  served.Set
		mode    RecycleMode
		method  reclaimerv1.Method
		state   reclaimerv1.State
		reason  string
		message string
	}{
		{"retain", releasedPV("a", corev1.PersistentVolumeReclaimRetain), serving, RecyclePod, none, reclaimerv1.State_STATE_RETAINED, "", "stays Released"},
		{"delete served CSI driver", releasedPV("a", corev1.PersistentVolumeReclaimDelete, withCSI("dev.csi.volplane.io"), withProvisionedBy("dev.csi.volplane.io")), serving, RecyclePod, viaProv, reclaimerv1.State_STATE_PENDING, "", ""},
		{"delete served CSI driver, no annotation", releasedPV("a", corev1.PersistentVolumeReclaimDelete, withCSI("dev.csi.volplane.io")), serving, RecyclePod, viaProv, reclaimerv1.State_STATE_PENDING, "", ""},
		{"delete CSI driver not served", releasedPV("a", corev1.PersistentVolumeReclaimDelete, withCSI("ebs.csi.aws.com")), serving, RecyclePod, none, reclaimerv1.State_STATE_SKIPPED, "", `CSI driver "ebs.csi.aws.com" is not served`},
		{"delete provisioned by another provisioner", releasedPV("a", corev1.PersistentVolumeReclaimDelete, withCSI("dev.csi.volplane.io"), withProvisionedBy("example.com/other")), serving, RecyclePod, none, reclaimerv1.State_STATE_SKIPPED, "", `provisioned by "example.com/other"`},
		{"delete hostPath provisioned by another provisioner", releasedPV("a", corev1.PersistentVolumeReclaimDelete, withProvisionedBy("example.com/csi")), nothing, RecyclePod, none, reclaimerv1.State_STATE_SKIPPED, "", `provisioned by "example.com/csi"`},
		{"delete without a provisioner", releasedPV("a", corev1.PersistentVolumeReclaimDelete, withCSI("dev.csi.volplane.io")), nothing, RecyclePod, none, reclaimerv1.State_STATE_SKIPPED, "", "not served"},
		{"delete non-CSI volume of a served provisioner", releasedPV("a", corev1.PersistentVolumeReclaimDelete, withProvisionedBy("dev.csi.volplane.io")), serving, RecyclePod, viaProv, reclaimerv1.State_STATE_PENDING, "", ""},
		// kube-controller-manager finds its host_path plugin for a static
		// hostPath volume, whose deleter refuses paths outside /tmp and
		// would remove one under /tmp on its own node.
		{"delete static hostPath", releasedPV("static", corev1.PersistentVolumeReclaimDelete, withHostPath("/data/static")), serving, RecyclePod, unsupported, reclaimerv1.State_STATE_FAILED, kube.EventVolumeFailedDelete,
			"host_path deleter only supports /tmp/.+ but received provided /data/static"},
		{"delete static hostPath under /tmp", releasedPV("static", corev1.PersistentVolumeReclaimDelete), serving, RecyclePod, unsupported, reclaimerv1.State_STATE_FAILED, kube.EventVolumeFailedDelete,
			"volplane does not run kube-controller-manager's test-only host_path deleter: delete /tmp/volplane-unit/static on its node by hand"},
		{"delete static hostPath, provisioner unreachable", releasedPV("static", corev1.PersistentVolumeReclaimDelete, withHostPath("/data/static")), unknown, RecyclePod, unsupported, reclaimerv1.State_STATE_FAILED, kube.EventVolumeFailedDelete, "host_path deleter only supports"},
		{"delete static NFS", releasedPV("static", corev1.PersistentVolumeReclaimDelete, withNFS()), serving, RecyclePod, unsupported, reclaimerv1.State_STATE_FAILED, kube.EventVolumeFailedDelete,
			`error getting deleter volume plugin for volume "static": no deletable volume plugin matched`},
		{"delete static local", releasedPV("static", corev1.PersistentVolumeReclaimDelete, withLocal("/mnt/disks/a", "node-a")), serving, RecyclePod, unsupported, reclaimerv1.State_STATE_FAILED, kube.EventVolumeFailedDelete,
			`error getting deleter volume plugin for volume "static": no volume plugin matched`},
		{"delete CSI, its driver restarting", releasedPV("a", corev1.PersistentVolumeReclaimDelete, withCSI("dev.csi.volplane.io"), withProvisionedBy("dev.csi.volplane.io")), restarting, RecyclePod, undecided, reclaimerv1.State_STATE_PENDING, "",
			`waiting for the provisioner to identify the CSI driver at unix:///csi.sock: whether it serves "dev.csi.volplane.io" cannot be told yet`},
		{"delete CSI without annotation, its driver restarting", releasedPV("a", corev1.PersistentVolumeReclaimDelete, withCSI("dev.csi.volplane.io")), restarting, RecyclePod, undecided, reclaimerv1.State_STATE_PENDING, "", "waiting for the provisioner to identify"},
		{"delete served CSI driver, another restarting", releasedPV("a", corev1.PersistentVolumeReclaimDelete, withCSI("dev.csi.volplane.io"), withProvisionedBy("dev.csi.volplane.io")), partly, RecyclePod, viaProv, reclaimerv1.State_STATE_PENDING, "", ""},
		{"delete another provisioner's, a driver restarting", releasedPV("a", corev1.PersistentVolumeReclaimDelete, withCSI("ebs.csi.aws.com"), withProvisionedBy("ebs.csi.aws.com")), partly, RecyclePod, undecided, reclaimerv1.State_STATE_PENDING, "", "waiting for the provisioner to identify"},
		{"delete CSI, provisioner unreachable", releasedPV("a", corev1.PersistentVolumeReclaimDelete, withCSI("dev.csi.volplane.io")), unknown, RecyclePod, undecided, reclaimerv1.State_STATE_PENDING, "", "provisioner unreachable"},
		{"recycle hostPath by pod", releasedPV("a", corev1.PersistentVolumeReclaimRecycle), serving, RecyclePod, viaPod, reclaimerv1.State_STATE_PENDING, "", ""},
		{"recycle NFS by pod", releasedPV("a", corev1.PersistentVolumeReclaimRecycle, withNFS()), serving, RecyclePod, viaPod, reclaimerv1.State_STATE_PENDING, "", ""},
		{"recycle local by pod", releasedPV("a", corev1.PersistentVolumeReclaimRecycle, withLocal("/mnt/disks/a", "node-a")), serving, RecyclePod, unsupported, reclaimerv1.State_STATE_FAILED, kube.EventVolumeFailedRecycle, "No recycler plugin found for the volume!"},
		{"recycle CSI by pod", releasedPV("a", corev1.PersistentVolumeReclaimRecycle, withCSI("dev.csi.volplane.io")), serving, RecyclePod, unsupported, reclaimerv1.State_STATE_FAILED, kube.EventVolumeFailedRecycle, "No recycler plugin found"},
		{"recycle hostPath on node", releasedPV("a", corev1.PersistentVolumeReclaimRecycle), serving, RecycleNodeLocal, onNode, reclaimerv1.State_STATE_PENDING, "", "node-a"},
		{"recycle local of this node", releasedPV("a", corev1.PersistentVolumeReclaimRecycle, withLocal("/mnt/disks/a", "node-a")), serving, RecycleNodeLocal, onNode, reclaimerv1.State_STATE_PENDING, "", ""},
		{"recycle local of another node", releasedPV("a", corev1.PersistentVolumeReclaimRecycle, withLocal("/mnt/disks/a", "node-b")), serving, RecycleNodeLocal, none, reclaimerv1.State_STATE_SKIPPED, "", "another node"},
		{"recycle NFS on node", releasedPV("a", corev1.PersistentVolumeReclaimRecycle, withNFS()), serving, RecycleNodeLocal, none, reclaimerv1.State_STATE_SKIPPED, "", "--recycle-mode=pod"},
		{"unknown policy", releasedPV("a", "Shred"), serving, RecyclePod, unsupported, reclaimerv1.State_STATE_FAILED, kube.EventVolumeUnknownReclaim, "unrecognized"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := decide(tc.pv, tc.served, tc.mode, here)
			if p.method != tc.method || p.state != tc.state || p.reason != tc.reason || !strings.Contains(p.message, tc.message) {
				t.Errorf("decide = %+v, want method %s, state %s, reason %q, message with %q", p, tc.method, tc.state, tc.reason, tc.message)
			}
			if p.acts() != (tc.state != reclaimerv1.State_STATE_RETAINED && tc.state != reclaimerv1.State_STATE_SKIPPED) {
				t.Errorf("acts() = %v for state %s", p.acts(), p.state)
			}
		})
	}
}

func TestNodeMatches(t *testing.T) {
	n := node{name: "node-a", labels: map[string]string{corev1.LabelHostname: "node-a", "zone": "z1", "disks": "4"}}
	req := func(key string, op corev1.NodeSelectorOperator, vals ...string) corev1.NodeSelectorRequirement {
		return corev1.NodeSelectorRequirement{Key: key, Operator: op, Values: vals}
	}
	affinity := func(terms ...corev1.NodeSelectorTerm) *corev1.VolumeNodeAffinity {
		return &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: terms}}
	}
	for _, tc := range []struct {
		name    string
		a       *corev1.VolumeNodeAffinity
		want    bool
		wantErr bool
	}{
		{"no affinity", nil, true, false},
		{"hostname in", affinity(corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{req(corev1.LabelHostname, corev1.NodeSelectorOpIn, "node-b", "node-a")}}), true, false},
		{"hostname of another node", affinity(corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{req(corev1.LabelHostname, corev1.NodeSelectorOpIn, "node-b")}}), false, false},
		{"terms are ORed", affinity(
			corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{req("zone", corev1.NodeSelectorOpIn, "z2")}},
			corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{req("zone", corev1.NodeSelectorOpIn, "z1")}}), true, false},
		{"requirements are ANDed", affinity(corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{
			req("zone", corev1.NodeSelectorOpIn, "z1"), req("disks", corev1.NodeSelectorOpGt, "8")}}), false, false},
		{"exists, lt, not in", affinity(corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{
			req("zone", corev1.NodeSelectorOpExists), req("disks", corev1.NodeSelectorOpLt, "8"), req("zone", corev1.NodeSelectorOpNotIn, "z3"), req("gpu", corev1.NodeSelectorOpDoesNotExist)}}), true, false},
		{"metadata.name field", affinity(corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{req("metadata.name", corev1.NodeSelectorOpIn, "node-a")}}), true, false},
		{"empty term matches nothing", affinity(corev1.NodeSelectorTerm{}), false, false},
		{"bad operator", affinity(corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{req("zone", "Near", "z1")}}), false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := nodeMatches(tc.a, n)
			if got != tc.want || (err != nil) != tc.wantErr {
				t.Errorf("nodeMatches = %v, %v; want %v, error %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}
