package guard

import (
	"context"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
)

func volume(phase corev1.PersistentVolumePhase, policy corev1.PersistentVolumeReclaimPolicy, ref *corev1.ObjectReference) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pv1", UID: "pv-uid"},
		Spec:       corev1.PersistentVolumeSpec{PersistentVolumeReclaimPolicy: policy, ClaimRef: ref},
		Status:     corev1.PersistentVolumeStatus{Phase: phase},
	}
}

func claim(ns, name, uid, volume string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)},
		Spec: corev1.PersistentVolumeClaimSpec{VolumeName: volume}}
}

func TestVolumeRefusesWhatItsStateForbids(t *testing.T) {
	del, rec, ret := corev1.PersistentVolumeReclaimDelete, corev1.PersistentVolumeReclaimRecycle, corev1.PersistentVolumeReclaimRetain
	for _, tc := range []struct {
		name  string
		phase corev1.PersistentVolumePhase
		pol   corev1.PersistentVolumeReclaimPolicy
		allow []corev1.PersistentVolumeReclaimPolicy
		want  string // "" allowed
	}{
		{"released delete", corev1.VolumeReleased, del, []corev1.PersistentVolumeReclaimPolicy{del}, ""},
		{"failed delete", corev1.VolumeFailed, del, []corev1.PersistentVolumeReclaimPolicy{del}, ""},
		{"released recycle in a reclaim", corev1.VolumeReleased, rec, []corev1.PersistentVolumeReclaimPolicy{del, rec}, ""},
		{"bound", corev1.VolumeBound, del, []corev1.PersistentVolumeReclaimPolicy{del}, `is Bound`},
		{"available", corev1.VolumeAvailable, del, []corev1.PersistentVolumeReclaimPolicy{del}, `is Available`},
		{"pending", corev1.VolumePending, del, []corev1.PersistentVolumeReclaimPolicy{del}, `is Pending`},
		{"no phase", "", del, []corev1.PersistentVolumeReclaimPolicy{del}, `no phase`},
		{"retain", corev1.VolumeReleased, ret, []corev1.PersistentVolumeReclaimPolicy{del, rec}, `reclaim policy "Retain"`},
		{"recycle is no deletion", corev1.VolumeReleased, rec, []corev1.PersistentVolumeReclaimPolicy{del}, `only Delete does`},
		{"no policy", corev1.VolumeReleased, "", []corev1.PersistentVolumeReclaimPolicy{del}, `reclaim policy ""`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Volume(volume(tc.phase, tc.pol, nil), tc.allow...)
			check(t, err, tc.want)
		})
	}
}

func check(t *testing.T, err error, want string) {
	t.Helper()
	if want == "" {
		if err != nil {
			t.Fatalf("refused: %v", err)
		}
		return
	}
	var r *Refusal
	if !errors.As(err, &r) || !strings.Contains(r.Reason, want) {
		t.Fatalf("got %v, want a refusal containing %q", err, want)
	}
}

func TestLiveClaimRefusesWhileAClaimPointsAtTheVolume(t *testing.T) {
	ref := &corev1.ObjectReference{Namespace: "ns", Name: "data", UID: "old"}
	noUID := &corev1.ObjectReference{Namespace: "ns", Name: "data"}
	deleting := claim("other", "going", "g", "pv1")
	now := metav1.Now()
	deleting.DeletionTimestamp = &now
	for _, tc := range []struct {
		name   string
		ref    *corev1.ObjectReference
		claims []*corev1.PersistentVolumeClaim
		want   string
	}{
		{"claim gone", ref, nil, ""},
		{"no claimRef", nil, nil, ""},
		{"claim of the claimRef lives", ref, []*corev1.PersistentVolumeClaim{claim("ns", "data", "old", "pv1")}, "ns/data (uid old) still exists"},
		{"claim of the claimRef lives, not naming the volume", ref, []*corev1.PersistentVolumeClaim{claim("ns", "data", "old", "")}, "still exists"},
		{"recreated claim of the same name, not asking for it", ref, []*corev1.PersistentVolumeClaim{claim("ns", "data", "new", "")}, ""},
		{"recreated claim of the same name asking for it", ref, []*corev1.PersistentVolumeClaim{claim("ns", "data", "new", "pv1")}, "ns/data (uid new) asks for this volume"},
		{"claimRef without UID names a live claim", noUID, []*corev1.PersistentVolumeClaim{claim("ns", "data", "x", "")}, "without a UID"},
		{"another claim asks for it", ref, []*corev1.PersistentVolumeClaim{claim("elsewhere", "mine", "m", "pv1")}, "elsewhere/mine (uid m) asks for this volume"},
		{"a claim being deleted asks for it", ref, []*corev1.PersistentVolumeClaim{deleting}, ""},
		{"a claim asks for another volume", ref, []*corev1.PersistentVolumeClaim{claim("x", "y", "z", "pv2")}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := fake.NewClientset()
			idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{ByVolumeName: IndexByVolumeName})
			for _, c := range tc.claims {
				if _, err := api.CoreV1().PersistentVolumeClaims(c.Namespace).Create(t.Context(), c, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
				if err := idx.Add(c); err != nil {
					t.Fatal(err)
				}
			}
			for name, c := range map[string]Claims{"indexed": APIClaims{Client: api, Index: idx}, "listed": APIClaims{Client: api}} {
				t.Run(name, func(t *testing.T) {
					check(t, LiveClaim(t.Context(), c, volume(corev1.VolumeReleased, corev1.PersistentVolumeReclaimDelete, tc.ref)), tc.want)
				})
			}
		})
	}
}

// Released allows what kube-controller-manager's isVolumeReleased allows:
// the claim of the claimRef is gone, was recreated (another UID) or is
// bound to another volume. Every other way of asking is refused.
func TestReleasedAsKubernetesHasIt(t *testing.T) {
	ref := &corev1.ObjectReference{Namespace: "ns", Name: "data", UID: "old"}
	for _, tc := range []struct {
		name   string
		ref    *corev1.ObjectReference
		claims []*corev1.PersistentVolumeClaim
		want   string
	}{
		{"claim gone", ref, nil, ""},
		{"claim recreated (another UID)", ref, []*corev1.PersistentVolumeClaim{claim("ns", "data", "new", "pv1")}, ""},
		{"claim bound to another volume", ref, []*corev1.PersistentVolumeClaim{claim("ns", "data", "old", "pv2")}, ""},
		{"claim bound to this volume", ref, []*corev1.PersistentVolumeClaim{claim("ns", "data", "old", "pv1")}, "ns/data (uid old) still exists and is not bound to another volume"},
		{"claim not bound yet", ref, []*corev1.PersistentVolumeClaim{claim("ns", "data", "old", "")}, "still exists and is not bound to another volume"},
		{"no claimRef", nil, nil, "no claimRef with a UID"},
		{"claimRef without a UID", &corev1.ObjectReference{Namespace: "ns", Name: "data"}, nil, "no claimRef with a UID"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := fake.NewClientset()
			for _, c := range tc.claims {
				if _, err := api.CoreV1().PersistentVolumeClaims(c.Namespace).Create(t.Context(), c, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			check(t, Released(t.Context(), APIClaims{Client: api}, volume(corev1.VolumeReleased, corev1.PersistentVolumeReclaimDelete, tc.ref)), tc.want)
		})
	}
	// A failure to read the API is an error, never a permission.
	v := volume(corev1.VolumeReleased, corev1.PersistentVolumeReclaimDelete, ref)
	var r *Refusal
	if err := Released(t.Context(), failing{getErr: errors.New("down")}, v); err == nil || errors.As(err, &r) {
		t.Errorf("Released with the API down: %v, want a read error", err)
	}
}

// A failure to read the API is an error, never a permission.
func TestLiveClaimFailsWhenTheAPIFails(t *testing.T) {
	v := volume(corev1.VolumeReleased, corev1.PersistentVolumeReclaimDelete, &corev1.ObjectReference{Namespace: "ns", Name: "data", UID: "u"})
	for name, c := range map[string]failing{"claim": {getErr: errors.New("down")}, "naming": {namingErr: errors.New("down")}} {
		err := LiveClaim(t.Context(), c, v)
		var r *Refusal
		if err == nil || errors.As(err, &r) {
			t.Errorf("%s: %v, want a read error", name, err)
		}
	}
}

type failing struct{ getErr, namingErr error }

func (f failing) GetClaim(context.Context, string, string) (*corev1.PersistentVolumeClaim, error) {
	if f.getErr != nil {
		return nil, f.getErr
	}
	return claim("ns", "data", "other", ""), nil
}

func (f failing) ClaimsNaming(context.Context, string) ([]corev1.PersistentVolumeClaim, error) {
	return nil, f.namingErr
}

// The index says which claims to read; the API server says what they are.
func TestClaimsNamingReadsTheIndexedClaimsFromTheAPI(t *testing.T) {
	api := fake.NewClientset(
		claim("a", "wants-pv1", "", "pv1"),
		claim("b", "moved", "", "pv2"), // the cache still says pv1
		claim("c", "other", "", "pv3"),
	)
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{ByVolumeName: IndexByVolumeName})
	for _, c := range []*corev1.PersistentVolumeClaim{
		claim("a", "wants-pv1", "", "pv1"),
		claim("b", "moved", "", "pv1"),
		claim("d", "deleted", "", "pv1"), // gone from the API
		claim("c", "other", "", "pv3"),
	} {
		if err := idx.Add(c); err != nil {
			t.Fatal(err)
		}
	}
	for name, k := range map[string]APIClaims{"indexed": {Client: api, Index: idx}, "listed": {Client: api}} {
		t.Run(name, func(t *testing.T) {
			got, err := k.ClaimsNaming(t.Context(), "pv1")
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || got[0].Namespace != "a" || got[0].Name != "wants-pv1" {
				t.Fatalf("claims naming pv1: %v", got)
			}
		})
	}
}

func TestCheckNameNamesTheField(t *testing.T) {
	for _, tc := range []struct {
		value string
		kind  NameKind
		want  string
	}{
		{"pvc-1234", VolumeName, ""},
		{"a.b-c", ClaimName, ""},
		{"default", Namespace, ""},
		{"", VolumeName, "f is required"},
		{"a.b", Namespace, "f \"a.b\" is not a valid name"},
		{"UPPER", VolumeName, "not a valid name"},
		{"../etc", VolumeName, "not a valid name"},
		{"a/b", ClaimName, "not a valid name"},
		{"bad\xff", VolumeName, "f is not valid UTF-8"},
		{strings.Repeat("a", 254), VolumeName, "not a valid name"},
		{strings.Repeat("a", 64), Namespace, "not a valid name"},
	} {
		err := CheckName("f", tc.value, tc.kind)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("CheckName(%q, %d) = %v, want %q", tc.value, tc.kind, err, tc.want)
		}
	}
	if err := CheckText("uid", "x\xc3"); err == nil || !strings.Contains(err.Error(), "uid is not valid UTF-8") {
		t.Errorf("CheckText: %v", err)
	}
}

func FuzzCheckName(f *testing.F) {
	for _, s := range []string{"pvc-1", "", "a.b", "UPPER", "../x", "bad\xff", strings.Repeat("a", 300), "ns", "-a", "a-", "ü"} {
		f.Add(s, 0)
		f.Add(s, 2)
	}
	f.Fuzz(func(t *testing.T, value string, kind int) {
		k := NameKind(kind % 3)
		if k < 0 {
			k = -k
		}
		err := CheckName("f", value, k)
		if err == nil {
			// Whatever passes is a name the API server accepts: short,
			// lower case, no path separator, valid UTF-8.
			if value == "" || len(value) > 253 || strings.ContainsAny(value, "/ \\%") || strings.ToLower(value) != value || strings.Contains(value, "..") {
				t.Fatalf("accepted %q as kind %d", value, k)
			}
		} else if !strings.HasPrefix(err.Error(), "f ") {
			t.Fatalf("error %q does not name the field", err)
		}
	})
}
