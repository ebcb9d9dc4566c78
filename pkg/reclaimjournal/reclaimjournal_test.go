package reclaimjournal

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/pkg/kube"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
)

// deleting is the record of volume v1 while its backing volume is being
// deleted, with pv as the journaled copy.
func deleting(t *testing.T, pv *corev1.PersistentVolume) *reclaimerv1.Reclaim {
	t.Helper()
	b, err := kube.EncodeProto(pv)
	if err != nil {
		t.Fatal(err)
	}
	return &reclaimerv1.Reclaim{VolumeName: "v1", VolumeUid: "u1", State: reclaimerv1.State_STATE_RUNNING,
		Method: reclaimerv1.Method_METHOD_PROVISIONER, DeletingVolume: b}
}

func csiVolume(name string, uid types.UID) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name, UID: uid},
		Spec: corev1.PersistentVolumeSpec{PersistentVolumeSource: corev1.PersistentVolumeSource{
			CSI: &corev1.CSIPersistentVolumeSource{Driver: "d.example.com", VolumeHandle: "h1"}}}}
}

// Only a Delete through a provisioner that has asked, and is neither done
// nor failed finally, has a deletion in flight; a copy of another volume,
// or of one without a CSI source, is an error, never a deletion.
func TestDeleting(t *testing.T) {
	for name, tc := range map[string]struct {
		change func(*reclaimerv1.Reclaim)
		copy   *corev1.PersistentVolume
		want   string // "" none; "h1" the handle; else an error containing it
	}{
		"in flight":         {want: "h1"},
		"not asked yet":     {change: func(r *reclaimerv1.Reclaim) { r.DeletingVolume = nil }},
		"data removed":      {change: func(r *reclaimerv1.Reclaim) { r.DataRemoved = true }},
		"failed finally":    {change: func(r *reclaimerv1.Reclaim) { r.State = reclaimerv1.State_STATE_FAILED }},
		"refused meanwhile": {change: func(r *reclaimerv1.Reclaim) { r.State = reclaimerv1.State_STATE_PENDING }, want: "h1"},
		"a recycle":         {change: func(r *reclaimerv1.Reclaim) { r.Method = reclaimerv1.Method_METHOD_RECYCLER_POD }},
		"another volume":    {copy: csiVolume("v2", "u1"), want: "holds volume v2"},
		"another uid":       {copy: csiVolume("v1", "u9"), want: "(uid u9)"},
		"not a CSI volume":  {copy: &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "v1", UID: "u1"}}, want: "not a CSI volume"},
		"garbled copy":      {change: func(r *reclaimerv1.Reclaim) { r.DeletingVolume = []byte("garbage") }, want: "the volume being deleted"},
	} {
		t.Run(name, func(t *testing.T) {
			pv := tc.copy
			if pv == nil {
				pv = csiVolume("v1", "u1")
			}
			r := deleting(t, pv)
			if tc.change != nil {
				tc.change(r)
			}
			got, err := Deleting(r)
			switch {
			case tc.want == "h1" && (err != nil || got == nil || got.Spec.CSI.VolumeHandle != "h1"):
				t.Fatalf("got %v, %v; want the volume with handle h1", got, err)
			case tc.want == "" && (err != nil || got != nil):
				t.Fatalf("got %v, %v; want no deletion in flight", got, err)
			case tc.want != "" && tc.want != "h1" && (err == nil || !strings.Contains(err.Error(), tc.want) || got != nil):
				t.Fatalf("got %v, %v; want an error with %q", got, err, tc.want)
			}
		})
	}
}

// A record reads back as written, its owner the lock's holder; one that
// names another volume than its key is refused.
func TestEncodeDecode(t *testing.T) {
	b, err := Encode(&reclaimerv1.Reclaim{VolumeName: "v1", State: reclaimerv1.State_STATE_PENDING, Owner: "stale"})
	if err != nil {
		t.Fatal(err)
	}
	r, err := Decode(coord.Record{Kind: Kind, Name: "v1", Value: b, Holder: "r2"})
	if err != nil || r.State != reclaimerv1.State_STATE_PENDING || r.Owner != "r2" {
		t.Fatalf("decoded %v, %v", r, err)
	}
	if _, err := Decode(coord.Record{Kind: Kind, Name: "v2", Value: b}); err == nil || !strings.Contains(err.Error(), `names volume "v1"`) {
		t.Fatalf("a record under another name: %v", err)
	}
}
