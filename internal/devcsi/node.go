package devcsi

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

type nodeServer struct {
	csi.UnimplementedNodeServer
	d *Driver
}

var _ csi.NodeServer = (*nodeServer)(nil)

// No STAGE_UNSTAGE_VOLUME: a directory needs no per-node preparation, so
// NodeStageVolume and NodeUnstageVolume answer Unimplemented.
var nodeCapabilities = []csi.NodeServiceCapability_RPC_Type{
	csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
	csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
}

func (s *nodeServer) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	resp := &csi.NodeGetCapabilitiesResponse{}
	for _, t := range nodeCapabilities {
		resp.Capabilities = append(resp.Capabilities, &csi.NodeServiceCapability{
			Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: t}},
		})
	}
	return resp, nil
}

func (s *nodeServer) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{
		NodeId:             s.d.nodeID,
		MaxVolumesPerNode:  s.d.maxVolumesPerNode,
		AccessibleTopology: &csi.Topology{Segments: map[string]string{TopologyKey: s.d.nodeID}},
	}, nil
}

// inPlace reports whether a recorded publication is still there (a reboot
// drops bind mounts, say); d.mu must be held.
func (d *Driver) inPlace(p *publication) bool {
	switch p.Mode {
	case PublishBind:
		ok, err := isMountPoint(p.TargetPath)
		return err == nil && ok
	case PublishSymlink:
		link, err := os.Readlink(p.TargetPath)
		return err == nil && link == d.VolumePath(p.VolumeID)
	}
	return false
}

// place makes the volume appear at the target path; d.mu must be held.
func (d *Driver) place(p *publication) error {
	src := d.VolumePath(p.VolumeID)
	switch p.Mode {
	case PublishBind:
		if err := os.MkdirAll(p.TargetPath, 0o750); err != nil {
			return fmt.Errorf("create target: %w", err)
		}
		return bindMount(src, p.TargetPath, p.Readonly)
	case PublishSymlink:
		if err := os.MkdirAll(filepath.Dir(p.TargetPath), 0o750); err != nil {
			return fmt.Errorf("create target's parent: %w", err)
		}
		// A CO may have made the target as an empty directory: replace it.
		if fi, err := os.Lstat(p.TargetPath); err == nil {
			if fi.Mode().Type() == fs.ModeSymlink || fi.IsDir() {
				if err := os.Remove(p.TargetPath); err != nil {
					return fmt.Errorf("target %s exists and is not an empty directory: %w", p.TargetPath, err)
				}
			} else {
				return fmt.Errorf("target %s exists and is not a directory", p.TargetPath)
			}
		}
		return os.Symlink(src, p.TargetPath)
	}
	return fmt.Errorf("unknown publish mode %q", p.Mode)
}

// remove undoes place and deletes the target path, as the spec asks; d.mu
// must be held. A target already gone is fine.
func (d *Driver) remove(p *publication) error {
	if p.Mode == PublishBind {
		if ok, err := isMountPoint(p.TargetPath); err != nil {
			return err
		} else if ok {
			if err := unmount(p.TargetPath); err != nil {
				return err
			}
		}
	}
	if err := os.Remove(p.TargetPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove target: %w", err)
	}
	return nil
}

func (s *nodeServer) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	d := s.d
	id, target := req.GetVolumeId(), req.GetTargetPath()
	switch {
	case id == "":
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	case target == "":
		return nil, status.Error(codes.InvalidArgument, "target_path is required")
	case !filepath.IsAbs(target):
		return nil, status.Errorf(codes.InvalidArgument, "target_path %q is not absolute", target)
	case req.GetVolumeCapability() == nil:
		return nil, status.Error(codes.InvalidArgument, "volume_capability is required")
	}
	if err := checkCapability(req.GetVolumeCapability()); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	target = filepath.Clean(target)
	mode := req.GetVolumeCapability().GetAccessMode().GetMode()

	d.mu.Lock()
	defer d.mu.Unlock()
	if d.st.Volumes[id] == nil {
		return nil, status.Errorf(codes.NotFound, "volume %q does not exist", id)
	}
	if p := d.st.Publications[target]; p != nil {
		switch {
		case p.VolumeID != id:
			return nil, status.Errorf(codes.AlreadyExists, "target %s holds another volume, %s", target, p.VolumeID)
		case p.Readonly != req.GetReadonly() || p.AccessMode != int32(mode):
			return nil, status.Errorf(codes.AlreadyExists, "volume %s is published at %s with another readonly flag or access mode", id, target)
		case d.inPlace(p):
			return &csi.NodePublishVolumeResponse{}, nil
		}
		// Recorded but gone (a reboot): publish it again below.
	}
	for other, p := range d.st.Publications {
		if p.VolumeID != id || other == target {
			continue
		}
		if mode == csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER ||
			p.AccessMode == int32(csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER) {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s is published at %s for a single writer", id, other)
		}
	}
	p := &publication{VolumeID: id, TargetPath: target, Readonly: req.GetReadonly(), Mode: d.publishMode, AccessMode: int32(mode)}
	// Record first: a crash between the two leaves a record of a
	// publication that is not in place (repaired by publishing again), never
	// a mount nobody knows about.
	d.st.Publications[target] = p
	if err := d.st.savePublication(d.root, target); err != nil {
		delete(d.st.Publications, target)
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	if err := d.place(p); err != nil {
		delete(d.st.Publications, target)
		if serr := d.st.savePublication(d.root, target); serr != nil {
			d.log.Warn("could not drop the record of a failed publication", "target", target, "error", serr)
		}
		return nil, status.Errorf(codes.Internal, "publish volume %s at %s: %v", id, target, err)
	}
	d.log.Info("volume published", "volume", id, "target", target, "readonly", p.Readonly, "mode", string(p.Mode))
	return &csi.NodePublishVolumeResponse{}, nil
}

func (s *nodeServer) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	d := s.d
	id, target := req.GetVolumeId(), req.GetTargetPath()
	switch {
	case id == "":
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	case target == "":
		return nil, status.Error(codes.InvalidArgument, "target_path is required")
	}
	target = filepath.Clean(target)
	d.mu.Lock()
	defer d.mu.Unlock()
	p := d.st.Publications[target]
	if p == nil {
		if d.st.Volumes[id] == nil {
			return nil, status.Errorf(codes.NotFound, "volume %q does not exist", id)
		}
		return &csi.NodeUnpublishVolumeResponse{}, nil // not published there: done
	}
	if p.VolumeID != id {
		return nil, status.Errorf(codes.FailedPrecondition, "target %s holds volume %s, not %s", target, p.VolumeID, id)
	}
	if err := d.remove(p); err != nil {
		return nil, status.Errorf(codes.Internal, "unpublish volume %s from %s: %v", id, target, err)
	}
	delete(d.st.Publications, target)
	if err := d.st.savePublication(d.root, target); err != nil {
		d.st.Publications[target] = p
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	d.log.Info("volume unpublished", "volume", id, "target", target)
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

func (s *nodeServer) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	d := s.d
	id, path := req.GetVolumeId(), req.GetVolumePath()
	switch {
	case id == "":
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	case path == "":
		return nil, status.Error(codes.InvalidArgument, "volume_path is required")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	v := d.st.Volumes[id]
	if v == nil {
		return nil, status.Errorf(codes.NotFound, "volume %q does not exist", id)
	}
	if p := d.st.Publications[filepath.Clean(path)]; p == nil || p.VolumeID != id {
		return nil, status.Errorf(codes.NotFound, "volume %s is not published at %s", id, path)
	}
	used, err := dirUsage(d.VolumePath(id))
	if err != nil {
		return nil, status.Errorf(codes.Internal, "measure volume %s: %v", id, err)
	}
	return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{{
		Unit:      csi.VolumeUsage_BYTES,
		Total:     v.CapacityBytes,
		Used:      used,
		Available: max(v.CapacityBytes-used, 0),
	}}}, nil
}
