package devcsi

import (
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
)

// TestSegmentsText: the accessibility requirements as the "volume
// created" line logs them, keys sorted, empty and nil as [].
func TestSegmentsText(t *testing.T) {
	for _, tc := range []struct {
		in   []*csi.Topology
		want string
	}{
		{nil, "[]"},
		{[]*csi.Topology{}, "[]"},
		{[]*csi.Topology{{}}, "[{}]"},
		{[]*csi.Topology{{Segments: map[string]string{TopologyKey: "n1"}}}, "[{" + TopologyKey + "=n1}]"},
		{[]*csi.Topology{{Segments: map[string]string{"b": "2", "a": "1"}}, {Segments: map[string]string{"c": "3"}}}, "[{a=1,b=2} {c=3}]"},
	} {
		if got := segmentsText(tc.in); got != tc.want {
			t.Errorf("segmentsText(%v) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
