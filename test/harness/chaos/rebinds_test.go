package chaos

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func pvWith(name string, phase corev1.PersistentVolumePhase, ref *corev1.ObjectReference, ann map[string]string) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann},
		Spec:   corev1.PersistentVolumeSpec{ClaimRef: ref, PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain},
		Status: corev1.PersistentVolumeStatus{Phase: phase}}
}

func claimRef(name, uid string) *corev1.ObjectReference {
	return &corev1.ObjectReference{Namespace: Namespace, Name: name, UID: types.UID(uid)}
}

// TestFlipsTellsRebindsFromFlips: a claimRef moving to another claim UID
// is a rebind, and the Released->Bound that follows it is not a flip; the
// same move without a new UID is a flip; a claimRef cleared in between
// (a Recycle) is neither.
func TestFlipsTellsRebindsFromFlips(t *testing.T) {
	f := &Flips{phase: map[string]corev1.PersistentVolumePhase{}, ref: map[string]corev1.ObjectReference{}, flips: map[string]int{}, rebound: map[string]bool{}}
	ann := map[string]string{annRebindReleased: rebindSameClaimName}
	// Rebound: Bound(a) -> Released(a) -> Released(b) -> Bound(b).
	f.see(pvWith("r", corev1.VolumeBound, claimRef("c", "a"), ann))
	f.see(pvWith("r", corev1.VolumeReleased, claimRef("c", "a"), ann))
	f.see(pvWith("r", corev1.VolumeReleased, claimRef("c", "b"), ann))
	f.see(pvWith("r", corev1.VolumeBound, claimRef("c", "b"), ann))
	// Flipped: Released(a) -> Bound(a).
	f.see(pvWith("f", corev1.VolumeReleased, claimRef("d", "a2"), nil))
	f.see(pvWith("f", corev1.VolumeBound, claimRef("d", "a2"), nil))
	// Recycled: Released(a) -> Available (no claimRef) -> Bound(b).
	f.see(pvWith("y", corev1.VolumeReleased, claimRef("e", "a3"), nil))
	f.see(pvWith("y", corev1.VolumeAvailable, nil, nil))
	f.see(pvWith("y", corev1.VolumeBound, claimRef("e2", "b3"), nil))
	// Rebound again later, then flipped back: the second flip counts.
	f.see(pvWith("r", corev1.VolumeReleased, claimRef("c", "b"), ann))
	f.see(pvWith("r", corev1.VolumeBound, claimRef("c", "b"), ann))

	rebinds := f.Rebinds()
	if len(rebinds) != 1 {
		t.Fatalf("rebinds %+v, want one", rebinds)
	}
	if r := rebinds[0]; r.Volume != "r" || r.From.UID != "a" || r.To.UID != "b" || r.Phase != corev1.VolumeReleased || !r.HasPolicy || r.Policy != rebindSameClaimName {
		t.Errorf("rebind %+v", r)
	}
	flipped, total, _ := f.Result()
	if total != 2 || strings.Join(flipped, ",") != "f x1,r x1" {
		t.Errorf("flips %v (%d), want f x1, r x1", flipped, total)
	}
}

// TestRebindRules: each rule of docs/rebind.md, broken on its own, is
// reported; a rebind that keeps them all is not.
func TestRebindRules(t *testing.T) {
	dir := t.TempDir()
	kept := filepath.Join(dir, "kept")
	if err := os.WriteFile(kept, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	at := time.Now()
	good := Rebind{Volume: "v", From: *claimRef("c", "old"), To: *claimRef("c", "new"), Phase: corev1.VolumeReleased,
		Class: RetainClass, Reclaim: corev1.PersistentVolumeReclaimRetain, At: at}
	policies := ClassPolicies(true)
	for name, tc := range map[string]struct {
		change  func(*Rebind)
		deleted bool
		journal time.Duration // before the rebind; 0: none
		marker  string
		want    string
	}{
		"kept every rule":        {deleted: true, marker: kept},
		"another name":           {change: func(r *Rebind) { r.To.Name = "other" }, deleted: true, want: "another claim's namespace/name"},
		"another namespace":      {change: func(r *Rebind) { r.To.Namespace = "other" }, deleted: true, want: "another claim's namespace/name"},
		"class without policy":   {change: func(r *Rebind) { r.Class = "plain" }, deleted: true, want: `rebind policy is ""`},
		"volume says Never":      {change: func(r *Rebind) { r.Policy, r.HasPolicy = "Never", true }, deleted: true, want: `rebind policy is "Never"`},
		"policy off for the run": {change: func(r *Rebind) { r.Class = DynamicClass }, deleted: true, want: ""},
		"Delete volume":          {change: func(r *Rebind) { r.Reclaim = corev1.PersistentVolumeReclaimDelete }, deleted: true, want: "reclaim policy Delete"},
		"Recycle volume":         {change: func(r *Rebind) { r.Reclaim = corev1.PersistentVolumeReclaimRecycle }, deleted: true, want: "reclaim policy Recycle"},
		"taken from a Bound one": {change: func(r *Rebind) { r.Phase = corev1.VolumeBound }, deleted: true, want: `phase "Bound" before the rebind`},
		"old claim not deleted":  {want: "never deleted"},
		"reclaim journaled":      {deleted: true, journal: time.Second, want: "a reclaim of it was journaled"},
		"data gone":              {deleted: true, marker: filepath.Join(dir, "gone"), want: "data of the claim it was released from is gone"},
	} {
		t.Run(name, func(t *testing.T) {
			r := good
			if tc.change != nil {
				tc.change(&r)
			}
			b := NewBook()
			if tc.deleted {
				b.deleted["old"] = Namespace + "/c"
			}
			if tc.marker != "" {
				b.markers["old"] = marker{claim: Namespace + "/c", volume: "v", path: tc.marker}
			}
			j := &Journaled{first: map[string]time.Time{}}
			if tc.journal > 0 {
				j.first["v"] = at.Add(-tc.journal)
			}
			cp := policies
			if name == "policy off for the run" {
				cp = ClassPolicies(false)
				tc.want = `rebind policy is ""`
			}
			why := strings.Join(rebindBroken(r, b, j, cp), "; ")
			switch {
			case tc.want == "" && why != "":
				t.Errorf("broken: %s", why)
			case tc.want != "" && !strings.Contains(why, tc.want):
				t.Errorf("broken: %q, want %q", why, tc.want)
			}
		})
	}
}

// TestJournaledNamesTheVolume: a reclaim record's key names the volume.
func TestJournaledNamesTheVolume(t *testing.T) {
	j := &Journaled{first: map[string]time.Time{}}
	j.see(reclaimJournalKey + "pvc-1")
	if _, ok := j.First("pvc-1"); !ok {
		t.Errorf("pvc-1 not noted: %v", j.first)
	}
}

// TestStaticPolicy: off, no PV carries the policy; on, Retain PVs carry
// SameClaimName but one in four (Never), and half the Recycle ones carry
// it too (the binder must refuse those).
func TestStaticPolicy(t *testing.T) {
	counts := map[string]int{}
	for i := range 16 {
		if p := staticPolicy(false, i); p != "" {
			t.Fatalf("off: PV %d has %q", i, p)
		}
		kind := "recycle"
		if i%2 == 1 {
			kind = "retain"
		}
		counts[kind+"/"+staticPolicy(true, i)]++
	}
	want := map[string]int{"retain/SameClaimName": 6, "retain/Never": 2, "recycle/SameClaimName": 4, "recycle/": 4}
	for k, n := range want {
		if counts[k] != n {
			t.Errorf("%s: %d, want %d (all %v)", k, counts[k], n, counts)
		}
	}
}
