package reclaimer

import (
	"strings"
	"testing"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"

	"github.com/volplane/volplane/pkg/kube"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
)

// Whatever a ReclaimRequest holds, validateReclaim answers without
// panicking, and a volume it accepts is the one the request names.
func FuzzValidateReclaim(f *testing.F) {
	v, _ := kube.EncodeProto(releasedPV("pv-1", corev1.PersistentVolumeReclaimDelete))
	f.Add("pv-1", "uid-pv-1", v)
	f.Add("pv-1", "", v)
	f.Add("pv-1", "other", v)
	f.Add("", "", []byte(nil))
	f.Add("PV_1", "\xff", []byte{0xff, 0x00})
	f.Add(strings.Repeat("x", 254), "", v[:len(v)/3])
	f.Fuzz(func(t *testing.T, name, uid string, b []byte) {
		got, err := validateReclaim(&reclaimerv1.ReclaimRequest{VolumeName: name, VolumeUid: uid, Volume: b})
		if err != nil {
			return
		}
		if name == "" || len(name) > 253 || strings.ContainsAny(name, "/ ") || !utf8.ValidString(name+uid) {
			t.Fatalf("accepted volume_name %q, volume_uid %q", name, uid)
		}
		if got != nil && (got.Name != name || uid != "" && string(got.UID) != uid) {
			t.Fatalf("accepted volume %s (%s) for %s (%s)", got.Name, got.UID, name, uid)
		}
	})
}
