package devcsi

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// MutableParameterKeys are the mutable parameters (a
// VolumeAttributesClass's) the driver takes, in CreateVolume and
// ControllerModifyVolume: positive integers it keeps on the volume and
// reports nowhere else, as a driver would keep a volume's performance
// tier. Any other key is InvalidArgument.
var MutableParameterKeys = []string{"iops", "throughput"}

// checkMutable refuses mutable parameters the driver does not take, and
// any at all when it does not modify volumes (NoModifyVolume).
func (d *Driver) checkMutable(params map[string]string) error {
	if len(params) == 0 {
		return nil
	}
	if d.noModifyVolume {
		return status.Error(codes.InvalidArgument, "mutable_parameters are not supported (no MODIFY_VOLUME)")
	}
	for _, k := range slices.Sorted(maps.Keys(params)) {
		if !slices.Contains(MutableParameterKeys, k) {
			return status.Errorf(codes.InvalidArgument, "mutable parameter %q is not supported (%s are)", k, strings.Join(MutableParameterKeys, ", "))
		}
		if n, err := strconv.ParseInt(params[k], 10, 64); err != nil || n <= 0 {
			return status.Errorf(codes.InvalidArgument, "mutable parameter %s=%q: want a positive integer", k, params[k])
		}
	}
	return nil
}

// ControllerModifyVolume applies the request's mutable parameters to the
// volume: each replaces the volume's of the same key (none: nothing
// changes).
func (s *controllerServer) ControllerModifyVolume(ctx context.Context, req *csi.ControllerModifyVolumeRequest) (*csi.ControllerModifyVolumeResponse, error) {
	d := s.d
	if d.noModifyVolume {
		return nil, status.Error(codes.Unimplemented, "ControllerModifyVolume is not supported (no MODIFY_VOLUME)")
	}
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	}
	if err := d.checkMutable(req.GetMutableParameters()); err != nil {
		return nil, err
	}
	release, err := d.acquire(true)
	if err != nil {
		return nil, err
	}
	defer release()
	v := d.st.Volumes[req.GetVolumeId()]
	if v == nil {
		return nil, status.Errorf(codes.NotFound, "volume %q does not exist", req.GetVolumeId())
	}
	next := maps.Clone(v.MutableParameters)
	if next == nil {
		next = map[string]string{}
	}
	maps.Copy(next, req.GetMutableParameters())
	if maps.Equal(v.MutableParameters, next) || len(next) == 0 {
		return &csi.ControllerModifyVolumeResponse{}, nil
	}
	old := v.MutableParameters
	v.MutableParameters = next
	if err := d.st.saveVolume(d.root, v.ID); err != nil {
		v.MutableParameters = old
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	d.log.Info("volume modified", "volume", v.ID, "mutableParameters", fmt.Sprint(v.MutableParameters))
	return &csi.ControllerModifyVolumeResponse{}, nil
}
