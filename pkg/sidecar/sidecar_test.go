package sidecar

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
)

func TestRegistrationRoundTrip(t *testing.T) {
	now := time.Now().Truncate(time.Microsecond)
	r := Registration{Namespace: "kube-system", Pod: "ebs-csi-controller-7d9f-abcde", Driver: "ebs.csi.aws.com", Port: DefaultPort,
		CertSHA256: CertSHA256([]byte("der")), LeaderElection: true, Duration: LeaseDuration,
		Settings: Settings{VolumeNamePrefix: "ebs", ExtraCreateMetadata: true, DefaultFSType: "ext4", Timeout: 60 * time.Second, FeatureGates: map[string]bool{"Topology": true}}}
	got, err := FromLease(r.Lease(now))
	if err != nil {
		t.Fatal(err)
	}
	r.RenewTime = now
	if !reflect.DeepEqual(got, r) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, r)
	}
	if !got.Fresh(now.Add(29*time.Second)) || got.Fresh(now.Add(30*time.Second)) {
		t.Fatal("a registration holds for its duration and no longer")
	}
}

func TestNodeRegistrationRoundTrip(t *testing.T) {
	now := time.Now().Truncate(time.Microsecond)
	r := Registration{Namespace: "volplane-csi", Pod: "volplane-csi-node-x7k2p", Driver: "hostpath.csi.volplane.io", Port: DefaultPort,
		CertSHA256: CertSHA256([]byte("der")), Duration: LeaseDuration, Node: "node-a", Settings: Settings{NodeDeployment: true},
		NodeTopology: map[string]string{"topology.hostpath.csi.volplane.io/node": "node-a"}, NodeImmediateBinding: true}
	l := r.Lease(now)
	got, err := FromLease(l)
	if err != nil {
		t.Fatal(err)
	}
	r.RenewTime = now
	if !reflect.DeepEqual(got, r) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, r)
	}
	// A registration without a node (every sidecar before node
	// deployment) carries none of the node annotations.
	r.Node, r.Settings.NodeDeployment = "", false
	for k := range r.Lease(now).Annotations {
		if strings.HasPrefix(k, AnnotationNode) {
			t.Fatalf("a cluster-wide registration has annotation %s", k)
		}
	}
}

func TestFromLeaseRefusesForgeries(t *testing.T) {
	good := Registration{Namespace: "ns", Pod: "p", Driver: "d.example.com", Port: 7710, CertSHA256: CertSHA256(nil), Duration: LeaseDuration}
	for name, tc := range map[string]struct {
		mutate func(*coordinationv1.Lease)
		want   string
	}{
		"no label":         {func(l *coordinationv1.Lease) { delete(l.Labels, LabelRegistration) }, "not a volplane sidecar registration"},
		"other version":    {func(l *coordinationv1.Lease) { l.Labels[LabelRegistration] = "v9" }, `registration version "v9"`},
		"bad pod":          {func(l *coordinationv1.Lease) { l.Annotations[AnnotationPod] = "../x" }, "is not a pod name"},
		"name not pod's":   {func(l *coordinationv1.Lease) { l.Name = "volplane-csi-other" }, "but a registration of pod"},
		"no driver":        {func(l *coordinationv1.Lease) { delete(l.Annotations, AnnotationDriver) }, "is not a CSI driver name"},
		"port zero":        {func(l *coordinationv1.Lease) { l.Annotations[AnnotationPort] = "0" }, "is not a port"},
		"port text":        {func(l *coordinationv1.Lease) { l.Annotations[AnnotationPort] = "https" }, "is not a port"},
		"short hash":       {func(l *coordinationv1.Lease) { l.Annotations[AnnotationCertSHA256] = "abcd" }, "is not a lower-case hex SHA-256"},
		"upper hash":       {func(l *coordinationv1.Lease) { l.Annotations[AnnotationCertSHA256] = strings.ToUpper(CertSHA256(nil)) }, "lower-case"},
		"no renew time":    {func(l *coordinationv1.Lease) { l.Spec.RenewTime = nil }, "spec.renewTime"},
		"unknown setting":  {func(l *coordinationv1.Lease) { l.Annotations[AnnotationSettings] = `{"deleteEverything":true}` }, "unknown field"},
		"node, no setting": {func(l *coordinationv1.Lease) { l.Annotations[AnnotationNode] = "a" }, "the settings' nodeDeployment is false"},
		"setting, no node": {func(l *coordinationv1.Lease) { l.Annotations[AnnotationSettings] = `{"nodeDeployment":true}` }, "the settings' nodeDeployment is true"},
		"bad node": {func(l *coordinationv1.Lease) {
			l.Annotations[AnnotationNode], l.Annotations[AnnotationSettings] = "Node A", `{"nodeDeployment":true}`
		}, "is not a node name"},
		"topology text": {func(l *coordinationv1.Lease) {
			l.Annotations[AnnotationNode], l.Annotations[AnnotationSettings] = "a", `{"nodeDeployment":true}`
			l.Annotations[AnnotationNodeTopology] = "zone=a"
		}, AnnotationNodeTopology},
		"topology label": {func(l *coordinationv1.Lease) {
			l.Annotations[AnnotationNode], l.Annotations[AnnotationNodeTopology] = "a", `{"zone":"a b"}`
			l.Annotations[AnnotationSettings] = `{"nodeDeployment":true}`
		}, "is not a topology label"},
		"immediate text": {func(l *coordinationv1.Lease) {
			l.Annotations[AnnotationNode], l.Annotations[AnnotationNodeTopology], l.Annotations[AnnotationNodeImmediateBinding] = "a", "{}", "yes"
			l.Annotations[AnnotationSettings] = `{"nodeDeployment":true}`
		}, "is not true or false"},
		"zero duration": {func(l *coordinationv1.Lease) { zero := int32(0); l.Spec.LeaseDurationSeconds = &zero }, "leaseDurationSeconds"},
	} {
		t.Run(name, func(t *testing.T) {
			l := good.Lease(time.Now())
			tc.mutate(l)
			_, err := FromLease(l)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("FromLease = %v, want an error containing %q", err, tc.want)
			}
			if name == "no label" && !errors.Is(err, ErrNotRegistration) {
				t.Fatalf("want ErrNotRegistration, got %v", err)
			}
		})
	}
}

func TestRegistrationNameIsALeaseName(t *testing.T) {
	long := strings.Repeat("a", 250)
	if n := RegistrationName(long); len(n) > 253 || !strings.HasPrefix(n, "volplane-csi-") {
		t.Fatalf("RegistrationName(250 a's) = %q", n)
	}
}
