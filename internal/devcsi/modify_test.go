package devcsi_test

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/volplane/volplane/internal/devcsi"
)

// mutableOf reads the volume's mutable parameters from the driver's state.
func mutableOf(t *testing.T, root, id string) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(root, "state", "volumes", id+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		MutableParameters map[string]string `json:"mutableParameters"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	return v.MutableParameters
}

// A volume keeps the mutable parameters it was made with, and
// ControllerModifyVolume applies new ones; keys or values the driver does
// not take are InvalidArgument, in both calls.
func TestMutableParameters(t *testing.T) {
	root := t.TempDir()
	d := start(t, devcsi.Options{RootDir: root})
	req := createReq("vac", 1<<20)
	req.MutableParameters = map[string]string{"iops": "3000"}
	v := mustCreate(t, d, req)
	if got := mutableOf(t, root, v.GetVolumeId()); !maps.Equal(got, req.MutableParameters) {
		t.Fatalf("volume made with %v, want %v", got, req.MutableParameters)
	}
	again := createReq("vac", 1<<20)
	again.MutableParameters = map[string]string{"iops": "4000"}
	_, err := d.CreateVolume(t.Context(), again)
	wantCode(t, err, codes.AlreadyExists)

	for _, tc := range []struct {
		name    string
		id      string
		params  map[string]string
		want    codes.Code
		wantNow map[string]string
	}{
		{"no volume id", "", map[string]string{"iops": "1"}, codes.InvalidArgument, map[string]string{"iops": "3000"}},
		{"a volume that does not exist", "vol-none", map[string]string{"iops": "1"}, codes.NotFound, map[string]string{"iops": "3000"}},
		{"a key it does not take", v.GetVolumeId(), map[string]string{"XXX_FakeKey": "1"}, codes.InvalidArgument, map[string]string{"iops": "3000"}},
		{"a value that is no positive integer", v.GetVolumeId(), map[string]string{"iops": "-5"}, codes.InvalidArgument, map[string]string{"iops": "3000"}},
		{"nothing to change", v.GetVolumeId(), nil, codes.OK, map[string]string{"iops": "3000"}},
		{"another value", v.GetVolumeId(), map[string]string{"iops": "6000"}, codes.OK, map[string]string{"iops": "6000"}},
		{"one more key", v.GetVolumeId(), map[string]string{"throughput": "125"}, codes.OK, map[string]string{"iops": "6000", "throughput": "125"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := d.ControllerModifyVolume(t.Context(), &csi.ControllerModifyVolumeRequest{VolumeId: tc.id, MutableParameters: tc.params})
			wantCode(t, err, tc.want)
			if got := mutableOf(t, root, v.GetVolumeId()); !maps.Equal(got, tc.wantNow) {
				t.Fatalf("mutable parameters %v, want %v", got, tc.wantNow)
			}
		})
	}
}

// A driver without MODIFY_VOLUME says so, refuses mutable parameters and
// modifies nothing.
func TestNoModifyVolume(t *testing.T) {
	for _, off := range []bool{false, true} {
		d := start(t, devcsi.Options{NoModifyVolume: off})
		caps, err := d.ControllerGetCapabilities(t.Context(), &csi.ControllerGetCapabilitiesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var types []csi.ControllerServiceCapability_RPC_Type
		for _, c := range caps.GetCapabilities() {
			types = append(types, c.GetRpc().GetType())
		}
		if has := slices.Contains(types, csi.ControllerServiceCapability_RPC_MODIFY_VOLUME); has == off {
			t.Fatalf("NoModifyVolume %v: MODIFY_VOLUME advertised %v", off, has)
		}
		if !off {
			continue
		}
		req := createReq("vac", 1<<20)
		req.MutableParameters = map[string]string{"iops": "3000"}
		_, err = d.CreateVolume(t.Context(), req)
		wantCode(t, err, codes.InvalidArgument)
		v := mustCreate(t, d, createReq("plain", 1<<20))
		_, err = d.ControllerModifyVolume(t.Context(), &csi.ControllerModifyVolumeRequest{VolumeId: v.GetVolumeId(), MutableParameters: map[string]string{"iops": "1"}})
		wantCode(t, err, codes.Unimplemented)
	}
}
