package provisioner

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/metrics"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// libProvisions reads external-provisioner's provisioning metrics of
// class and source from the registry /metrics serves: made, failed, and
// the duration histogram's count.
func libProvisions(t *testing.T, class, source string) (made, failed, observed float64) {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if len(labels) != 2 || labels["class"] != class || labels["source"] != source {
				continue
			}
			switch f.GetName() {
			case "controller_persistentvolumeclaim_provision_total":
				made = m.GetCounter().GetValue()
			case "controller_persistentvolumeclaim_provision_failed_total":
				failed = m.GetCounter().GetValue()
			case "controller_persistentvolumeclaim_provision_duration_seconds":
				observed = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return made, failed, observed
}

// metricsClaim is a claim of class with the data source kind source.
func metricsClaim(name, class, source string) *corev1.PersistentVolumeClaim {
	c := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: name, UID: types.UID("uid-" + name)},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &class, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}}}}
	if source != "" {
		group := "populator.example.io"
		c.Spec.DataSource = &corev1.TypedLocalObjectReference{APIGroup: &group, Kind: source, Name: "src"}
		c.Spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: &group, Kind: source, Name: "src"}
	}
	return c
}

// Each Provision attempt is counted as sig-storage-lib-external-provisioner
// counts external-provisioner's (updateProvisionStats), labelled with the
// claim's spec.storageClassName and spec.dataSource.kind: a failed attempt
// in controller_persistentvolumeclaim_provision_failed_total, the attempt
// that made the PV in controller_persistentvolumeclaim_provision_total and
// its duration; a claim left to its populator not at all.
func TestProvisionAttemptsAreCountedAsExternalProvisioner(t *testing.T) {
	const class = "metrics-provision"
	g := newGuarded(t)
	if _, err := g.api.StorageV1().StorageClasses().Create(t.Context(), &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: class},
		Provisioner: devcsi.DefaultName}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	want := func(when, source string, made, failed, observed float64) {
		t.Helper()
		if m, f, o := libProvisions(t, class, source); m != made || f != failed || o != observed {
			t.Fatalf("%s: provision_total %v, provision_failed_total %v, duration count %v; want %v, %v, %v", when, m, f, o, made, failed, observed)
		}
	}
	provision := func(name string, want provisionerv1.Outcome) {
		t.Helper()
		resp, err := g.s.Provision(t.Context(), &provisionerv1.ProvisionRequest{ClaimNamespace: "app", ClaimName: name})
		if err != nil || resp.GetOutcome() != want {
			t.Fatalf("Provision %s: %v, %v; want %v", name, resp, err, want)
		}
	}

	g.addClaim(t, metricsClaim("data", class, ""))
	g.drv.Faults().FailNext("CreateVolume", 1, codes.InvalidArgument, "no such tier")
	provision("data", provisionerv1.Outcome_OUTCOME_NO_CHANGE)
	want("after a refused CreateVolume", "", 0, 1, 0)
	g.drv.Faults().FailNext("CreateVolume", 1, codes.DeadlineExceeded, "slow")
	provision("data", provisionerv1.Outcome_OUTCOME_IN_BACKGROUND)
	want("after a timeout", "", 0, 2, 0)
	provision("data", provisionerv1.Outcome_OUTCOME_FINISHED)
	want("once the PV is made", "", 1, 2, 1)

	// A populator's claim: FINISHED without a volume, as upstream's
	// ShouldProvision says no; nothing is counted.
	g.addClaim(t, metricsClaim("populated", class, "Hello"))
	provision("populated", provisionerv1.Outcome_OUTCOME_FINISHED)
	want("a populator's claim", "Hello", 0, 0, 0)
}

// In standalone mode, a claim whose infeasible attempt delays the next is
// not counted while it waits (the library returns before counting), and a
// claim whose class cannot be read is counted failed (shouldProvision's
// error).
func TestStandaloneCountsAsExternalProvisioner(t *testing.T) {
	const class = "metrics-standalone"
	g := newGuarded(t)
	if err := g.classes.Add(&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: class, UID: "c1"}, Provisioner: devcsi.DefaultName}); err != nil {
		t.Fatal(err)
	}
	s := newStandaloneOf(g)
	s.retryMax = time.Hour
	c := annotatedClaim("m1", devcsi.DefaultName)
	c.Spec.StorageClassName = new(class)
	c = g.addClaim(t, c)
	g.drv.Faults().FailNext("CreateVolume", 1, codes.InvalidArgument, "no such tier")
	for range 3 {
		if _, err := s.sync(t.Context(), claimKey(c), true); err != nil {
			t.Fatal(err)
		}
	}
	if m, f, o := libProvisions(t, class, ""); m != 0 || f != 1 || o != 0 {
		t.Fatalf("one infeasible attempt, two delayed syncs: %v made, %v failed, %v observed; want 0, 1, 0", m, f, o)
	}

	missing := annotatedClaim("m2", devcsi.DefaultName)
	missing.Spec.StorageClassName = new("metrics-no-such-class")
	missing = g.addClaim(t, missing)
	if _, err := s.sync(t.Context(), claimKey(missing), false); err == nil {
		t.Fatal("a claim of a missing class synced without an error")
	}
	if _, f, _ := libProvisions(t, "metrics-no-such-class", ""); f != 1 {
		t.Fatalf("a missing class: %v failed, want 1", f)
	}
}
