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

// What the kubelet's CSI plugin reads these paths as, and who makes them
// (CSI spec, NodeStageVolume and NodePublishVolume):
//   - staging_target_path (the kubelet's .../plugins/kubernetes.io/csi/
//     <driver>/<hash of the handle>/globalmount) is made by the CO, which
//     also removes it after NodeUnstageVolume: the driver only mounts on
//     it and unmounts it (it makes it only if it is missing);
//   - target_path (.../pods/<uid>/volumes/kubernetes.io~csi/<pv>/mount):
//     the CO makes its parent, the driver makes it and, in
//     NodeUnpublishVolume, removes it.
var nodeCapabilities = []csi.NodeServiceCapability_RPC_Type{
	csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
	csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
	csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
}

// The volume context keys the kubelet adds to NodePublishVolume when the
// CSIDriver object asks for pod information (podInfoOnMount).
const (
	podNameKey      = "csi.storage.k8s.io/pod.name"
	podNamespaceKey = "csi.storage.k8s.io/pod.namespace"
)

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

// ownNode reports whether a record's node is this driver's (records of
// older drivers name none).
func (d *Driver) ownNode(node string) bool { return node == "" || node == d.nodeID }

// inPlace reports whether a recorded publication is still there (a reboot
// drops bind mounts, say); d's locks must be held.
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

// stagedInPlace reports whether a recorded staging is still there. A
// driver that publishes symbolic links stages nothing: the record is all.
func (d *Driver) stagedInPlace(s *staging) bool {
	if s.Mode != PublishBind {
		return true
	}
	ok, err := isMountPoint(s.StagingPath)
	return err == nil && ok
}

// checkUnused fails with FailedPrecondition while the volume is staged or
// published anywhere; d's locks must be held exclusively. Records of this
// node whose mounts are gone are dropped. A controller-only process does
// not see the node plugin's mounts (another mount namespace) and trusts
// every record; the node plugin drops its stale ones when it starts.
func (d *Driver) checkUnused(id string) error {
	for target, p := range d.st.Publications {
		if p.VolumeID != id {
			continue
		}
		if d.servesNode() && d.ownNode(p.Node) && !d.inPlace(p) {
			d.dropPublication(target, "its publication is gone")
			continue
		}
		return status.Errorf(codes.FailedPrecondition, "volume %s is published at %s on node %s; unpublish it first", id, target, p.Node)
	}
	for k, st := range d.st.Stagings {
		if st.VolumeID != id {
			continue
		}
		if d.servesNode() && d.ownNode(k.node) && !d.stagedInPlace(st) {
			d.dropStaging(k, "its staging is gone")
			continue
		}
		return status.Errorf(codes.FailedPrecondition, "volume %s is staged at %s on node %s; unstage it first", id, k.path, k.node)
	}
	return nil
}

// dropStale forgets the stagings and publications of this node that are
// no longer in place; d's locks must be held exclusively.
func (d *Driver) dropStale() {
	for target, p := range d.st.Publications {
		if d.ownNode(p.Node) && !d.inPlace(p) {
			d.dropPublication(target, "not in place at start")
		}
	}
	for k, st := range d.st.Stagings {
		if d.ownNode(k.node) && !d.stagedInPlace(st) {
			d.dropStaging(k, "not in place at start")
		}
	}
}

func (d *Driver) dropPublication(target, why string) {
	p := d.st.Publications[target]
	delete(d.st.Publications, target)
	if err := d.st.savePublication(d.root, target); err != nil {
		d.log.Warn("could not drop the record of a stale publication", "target", target, "error", err)
		return
	}
	d.log.Info("forgot a publication", "volume", p.VolumeID, "target", target, "why", why)
}

func (d *Driver) dropStaging(k placeKey, why string) {
	st := d.st.Stagings[k]
	delete(d.st.Stagings, k)
	if err := d.st.saveStaging(d.root, k); err != nil {
		d.log.Warn("could not drop the record of a stale staging", "stagingPath", k.path, "error", err)
		return
	}
	d.log.Info("forgot a staging", "volume", st.VolumeID, "stagingPath", k.path, "why", why)
}

// readerOnly reports whether an access mode only reads.
func readerOnly(m csi.VolumeCapability_AccessMode_Mode) bool {
	return m == csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY || m == csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
}

// notHere is the error for a volume this node plugin cannot stage: on
// another node, or unknown.
func (d *Driver) notHere(id string, v *volume, volumeContext map[string]string) error {
	node := volumeContext[NodeKey]
	if v != nil {
		node = v.Node
	}
	if node != "" && node != d.nodeID {
		return status.Errorf(codes.FailedPrecondition,
			"volume %s is on node %q (its topology %s=%s), not on this node %q: the dev driver's volumes are directories on their node, which only that node's plugin mounts",
			id, node, TopologyKey, node, d.nodeID)
	}
	return status.Errorf(codes.NotFound, "volume %q does not exist under %s on node %q", id, d.root, d.nodeID)
}

func (s *nodeServer) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	d := s.d
	id, path := req.GetVolumeId(), req.GetStagingTargetPath()
	switch {
	case id == "":
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	case path == "":
		return nil, status.Error(codes.InvalidArgument, "staging_target_path is required")
	case !filepath.IsAbs(path):
		return nil, status.Errorf(codes.InvalidArgument, "staging_target_path %q is not absolute", path)
	case req.GetVolumeCapability() == nil:
		return nil, status.Error(codes.InvalidArgument, "volume_capability is required")
	}
	if err := checkCapability(req.GetVolumeCapability()); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	path = filepath.Clean(path)
	mode := req.GetVolumeCapability().GetAccessMode().GetMode()

	release, err := d.acquire(true)
	if err != nil {
		return nil, err
	}
	defer release()
	v := d.st.Volumes[id]
	if v == nil || v.Node != d.nodeID {
		return nil, d.notHere(id, v, req.GetVolumeContext())
	}
	key := placeKey{d.nodeID, path}
	if st := d.st.Stagings[key]; st != nil {
		switch {
		case st.VolumeID != id:
			return nil, status.Errorf(codes.FailedPrecondition, "staging path %s holds another volume, %s", path, st.VolumeID)
		case st.AccessMode != int32(mode):
			return nil, status.Errorf(codes.AlreadyExists, "volume %s is staged at %s with another access mode", id, path)
		case d.stagedInPlace(st):
			return &csi.NodeStageVolumeResponse{}, nil
		}
		// Recorded but gone (a reboot): stage it again below.
	}
	for k, other := range d.st.Stagings {
		if other.VolumeID != id || k.node != d.nodeID || k.path == path {
			continue
		}
		if d.stagedInPlace(other) {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s is already staged on this node at %s", id, k.path)
		}
		d.dropStaging(k, "its staging is gone")
	}
	st := &staging{VolumeID: id, Node: d.nodeID, StagingPath: path, Readonly: readerOnly(mode), Mode: d.publishMode, AccessMode: int32(mode)}
	// Record first, as for publications: a crash between the two leaves a
	// record of a staging not in place, repaired by staging again.
	d.st.Stagings[key] = st
	if err := d.st.saveStaging(d.root, key); err != nil {
		delete(d.st.Stagings, key)
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	if err := d.stage(st); err != nil {
		delete(d.st.Stagings, key)
		if serr := d.st.saveStaging(d.root, key); serr != nil {
			d.log.Warn("could not drop the record of a failed staging", "stagingPath", path, "error", serr)
		}
		return nil, status.Errorf(codes.Internal, "stage volume %s at %s: %v", id, path, err)
	}
	d.log.Info("volume staged", "volume", id, "stagingPath", path, "readonly", st.Readonly, "mode", string(st.Mode))
	return &csi.NodeStageVolumeResponse{}, nil
}

// stage bind-mounts the volume's directory on the staging path (read-only
// for a reader-only access mode); d's locks must be held.
func (d *Driver) stage(st *staging) error {
	if st.Mode != PublishBind {
		return nil // publications link to the volume's directory itself
	}
	src := d.VolumePath(st.VolumeID)
	if fi, err := os.Stat(src); err != nil || !fi.IsDir() {
		return fmt.Errorf("the volume's directory %s is missing: %v", src, err)
	}
	if err := os.MkdirAll(st.StagingPath, 0o750); err != nil {
		return fmt.Errorf("create staging path: %w", err)
	}
	return bindMount(src, st.StagingPath, st.Readonly)
}

func (s *nodeServer) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	d := s.d
	id, path := req.GetVolumeId(), req.GetStagingTargetPath()
	switch {
	case id == "":
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	case path == "":
		return nil, status.Error(codes.InvalidArgument, "staging_target_path is required")
	}
	path = filepath.Clean(path)
	release, err := d.acquire(true)
	if err != nil {
		return nil, err
	}
	defer release()
	key := placeKey{d.nodeID, path}
	st := d.st.Stagings[key]
	if st == nil || st.VolumeID != id {
		if d.st.Volumes[id] == nil {
			return nil, status.Errorf(codes.NotFound, "volume %q does not exist", id)
		}
		return &csi.NodeUnstageVolumeResponse{}, nil // not staged there: done, as the spec asks
	}
	for target, p := range d.st.Publications {
		if p.VolumeID != id || p.StagingPath != path || !d.ownNode(p.Node) {
			continue
		}
		if d.inPlace(p) {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s is still published from %s at %s; unpublish it first", id, path, target)
		}
		d.dropPublication(target, "its publication is gone")
	}
	if st.Mode == PublishBind {
		if err := unmountAll(path); err != nil {
			return nil, status.Errorf(codes.Internal, "unstage volume %s from %s: %v", id, path, err)
		}
	}
	// The staging path stays: the CO made it and removes it.
	delete(d.st.Stagings, key)
	if err := d.st.saveStaging(d.root, key); err != nil {
		d.st.Stagings[key] = st
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	d.log.Info("volume unstaged", "volume", id, "stagingPath", path)
	return &csi.NodeUnstageVolumeResponse{}, nil
}

// place makes the volume appear at the target path, from src (its
// directory or its staging path); d's locks must be held.
func (d *Driver) place(p *publication, src string) error {
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
		return os.Symlink(d.VolumePath(p.VolumeID), p.TargetPath)
	}
	return fmt.Errorf("unknown publish mode %q", p.Mode)
}

// remove undoes place and deletes the target path, as the spec asks; d's
// locks must be held. A target already gone is fine.
func (d *Driver) remove(p *publication) error {
	if p.Mode == PublishBind {
		if err := unmountAll(p.TargetPath); err != nil {
			return err
		}
	}
	if err := os.Remove(p.TargetPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove target: %w", err)
	}
	return nil
}

func (s *nodeServer) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	d := s.d
	id := req.GetVolumeId()
	target, staging, err := checkPublish(req)
	if err != nil {
		return nil, err
	}
	mode := req.GetVolumeCapability().GetAccessMode().GetMode()
	release, err := d.acquire(true)
	if err != nil {
		return nil, err
	}
	defer release()
	if d.st.Volumes[id] == nil {
		return nil, status.Errorf(codes.NotFound, "volume %q does not exist", id)
	}
	src, err := d.publishSource(id, staging)
	if err != nil {
		return nil, err
	}
	if done, err := d.publishedAlready(id, target, req.GetReadonly(), mode); done || err != nil {
		if err != nil {
			return nil, err
		}
		return &csi.NodePublishVolumeResponse{}, nil
	}
	if err := d.singleWriterElsewhere(id, target, mode); err != nil {
		return nil, err
	}
	p := &publication{VolumeID: id, TargetPath: target, Readonly: req.GetReadonly(), Mode: d.publishMode, AccessMode: int32(mode),
		Node: d.nodeID, StagingPath: staging}
	if err := d.recordAndPlace(p, src); err != nil {
		return nil, err
	}
	attrs := []any{"volume", id, "target", target, "stagingPath", staging, "readonly", p.Readonly, "mode", string(p.Mode)}
	if pod := req.GetVolumeContext()[podNameKey]; pod != "" {
		attrs = append(attrs, "pod", req.GetVolumeContext()[podNamespaceKey]+"/"+pod)
	}
	d.log.Info("volume published", attrs...)
	return &csi.NodePublishVolumeResponse{}, nil
}

// checkPublish checks a NodePublishVolumeRequest before any state is
// read, and returns its target and staging paths, cleaned.
func checkPublish(req *csi.NodePublishVolumeRequest) (target, staging string, err error) {
	target, staging = req.GetTargetPath(), req.GetStagingTargetPath()
	switch {
	case req.GetVolumeId() == "":
		return "", "", status.Error(codes.InvalidArgument, "volume_id is required")
	case target == "":
		return "", "", status.Error(codes.InvalidArgument, "target_path is required")
	case !filepath.IsAbs(target):
		return "", "", status.Errorf(codes.InvalidArgument, "target_path %q is not absolute", target)
	case staging != "" && !filepath.IsAbs(staging):
		return "", "", status.Errorf(codes.InvalidArgument, "staging_target_path %q is not absolute", staging)
	case req.GetVolumeCapability() == nil:
		return "", "", status.Error(codes.InvalidArgument, "volume_capability is required")
	}
	if err := checkCapability(req.GetVolumeCapability()); err != nil {
		return "", "", status.Error(codes.InvalidArgument, err.Error())
	}
	if staging != "" {
		staging = filepath.Clean(staging)
	}
	return filepath.Clean(target), staging, nil
}

// publishSource is what a publication of volume id places at its target:
// the staging path when the CO staged the volume there with a bind mount
// (the kubelet always stages, as the driver has STAGE_UNSTAGE_VOLUME),
// else the volume's directory. Called with the state held.
func (d *Driver) publishSource(id, staging string) (string, error) {
	if staging == "" {
		return d.VolumePath(id), nil
	}
	st := d.st.Stagings[placeKey{d.nodeID, staging}]
	if st == nil || st.VolumeID != id || !d.stagedInPlace(st) {
		return "", status.Errorf(codes.FailedPrecondition, "volume %s is not staged at %s: call NodeStageVolume first", id, staging)
	}
	if st.Mode == PublishBind {
		return staging, nil
	}
	return d.VolumePath(id), nil
}

// publishedAlready says whether volume id is published at target as asked
// (NodePublishVolume is idempotent), or why target cannot take it; a
// publication recorded but gone (a reboot) is published again.
func (d *Driver) publishedAlready(id, target string, readonly bool, mode csi.VolumeCapability_AccessMode_Mode) (bool, error) {
	p := d.st.Publications[target]
	switch {
	case p == nil:
		return false, nil
	case p.VolumeID != id:
		return false, status.Errorf(codes.AlreadyExists, "target %s holds another volume, %s", target, p.VolumeID)
	case p.Readonly != readonly || p.AccessMode != int32(mode):
		return false, status.Errorf(codes.AlreadyExists, "volume %s is published at %s with another readonly flag or access mode", id, target)
	}
	return d.inPlace(p), nil
}

// singleWriterElsewhere refuses a second publication of a volume when
// either publication is for a single writer (SINGLE_NODE_SINGLE_WRITER).
func (d *Driver) singleWriterElsewhere(id, target string, mode csi.VolumeCapability_AccessMode_Mode) error {
	for other, p := range d.st.Publications {
		if p.VolumeID != id || other == target {
			continue
		}
		if mode == csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER ||
			p.AccessMode == int32(csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER) {
			return status.Errorf(codes.FailedPrecondition, "volume %s is published at %s for a single writer", id, other)
		}
	}
	return nil
}

// recordAndPlace records the publication, then places src at its target.
// Record first: a crash between the two leaves a record of a publication
// that is not in place (repaired by publishing again), never a mount
// nobody knows about. Called with the state held.
func (d *Driver) recordAndPlace(p *publication, src string) error {
	target := p.TargetPath
	d.st.Publications[target] = p
	if err := d.st.savePublication(d.root, target); err != nil {
		delete(d.st.Publications, target)
		return status.Errorf(codes.Internal, "%v", err)
	}
	if err := d.place(p, src); err != nil {
		delete(d.st.Publications, target)
		if serr := d.st.savePublication(d.root, target); serr != nil {
			d.log.Warn("could not drop the record of a failed publication", "target", target, "error", serr)
		}
		return status.Errorf(codes.Internal, "publish volume %s at %s: %v", p.VolumeID, target, err)
	}
	return nil
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
	release, err := d.acquire(true)
	if err != nil {
		return nil, err
	}
	defer release()
	p := d.st.Publications[target]
	if p == nil || p.VolumeID != id {
		if d.st.Volumes[id] == nil {
			return nil, status.Errorf(codes.NotFound, "volume %q does not exist", id)
		}
		// Not published there (another volume may be, which stays): done,
		// as the spec asks.
		return &csi.NodeUnpublishVolumeResponse{}, nil
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

// NodeGetVolumeStats measures the volume's directory: the bytes of its
// files (du's apparent size) against its capacity, never more available
// than its file system has free, and its files and directories against
// the file system's inodes. The path may be where the volume is published
// or staged.
func (s *nodeServer) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	d := s.d
	id, path := req.GetVolumeId(), req.GetVolumePath()
	switch {
	case id == "":
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	case path == "":
		return nil, status.Error(codes.InvalidArgument, "volume_path is required")
	}
	path = filepath.Clean(path)
	release, err := d.acquire(false)
	if err != nil {
		return nil, err
	}
	v := d.st.Volumes[id]
	p, st := d.st.Publications[path], d.st.Stagings[placeKey{d.nodeID, path}]
	there := (p != nil && p.VolumeID == id) || (st != nil && st.VolumeID == id)
	release() // measuring a big directory must not hold up every other call
	if v == nil {
		return nil, status.Errorf(codes.NotFound, "volume %q does not exist", id)
	}
	if !there {
		return nil, status.Errorf(codes.NotFound, "volume %s is neither published nor staged at %s", id, path)
	}
	dir := d.VolumePath(id)
	used, entries, err := dirUsage(dir)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "measure volume %s: %v", id, err)
	}
	fsys, err := statFS(dir)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "statfs %s: %v", dir, err)
	}
	return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{
		{
			Unit:      csi.VolumeUsage_BYTES,
			Total:     v.CapacityBytes,
			Used:      used,
			Available: min(max(v.CapacityBytes-used, 0), fsys.availBytes),
		},
		{
			Unit:      csi.VolumeUsage_INODES,
			Total:     fsys.inodes,
			Used:      entries,
			Available: fsys.freeInodes,
		},
	}}, nil
}
