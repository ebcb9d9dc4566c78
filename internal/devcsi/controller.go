package devcsi

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

type controllerServer struct {
	csi.UnimplementedControllerServer
	d *Driver
}

var _ csi.ControllerServer = (*controllerServer)(nil)

var controllerCapabilities = []csi.ControllerServiceCapability_RPC_Type{
	csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
	csi.ControllerServiceCapability_RPC_CLONE_VOLUME,
	csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
	csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
	csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
	csi.ControllerServiceCapability_RPC_GET_CAPACITY,
	csi.ControllerServiceCapability_RPC_GET_VOLUME,
	csi.ControllerServiceCapability_RPC_GET_SNAPSHOT,
	csi.ControllerServiceCapability_RPC_EXPAND_VOLUME,
	csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
	csi.ControllerServiceCapability_RPC_MODIFY_VOLUME, // unless NoModifyVolume
}

func (s *controllerServer) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	resp := &csi.ControllerGetCapabilitiesResponse{}
	for _, t := range controllerCapabilities {
		if t == csi.ControllerServiceCapability_RPC_MODIFY_VOLUME && s.d.noModifyVolume {
			continue
		}
		resp.Capabilities = append(resp.Capabilities, &csi.ControllerServiceCapability{
			Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: t}},
		})
	}
	return resp, nil
}

func (d *Driver) csiVolume(v *volume) *csi.Volume {
	cv := &csi.Volume{
		VolumeId:           v.ID,
		CapacityBytes:      v.CapacityBytes,
		AccessibleTopology: []*csi.Topology{{Segments: map[string]string{TopologyKey: v.Node}}},
	}
	cv.VolumeContext = map[string]string{NodeKey: v.Node}
	if !v.CreatedAt.IsZero() {
		cv.VolumeContext[CreationTimeKey] = v.CreatedAt.UTC().Format(time.RFC3339)
	}
	switch {
	case v.SourceVolumeID != "":
		cv.ContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
			Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: v.SourceVolumeID}}}
	case v.SourceSnapshotID != "":
		cv.ContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
			Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: v.SourceSnapshotID}}}
	}
	return cv
}

func (s *controllerServer) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	d := s.d
	srcVolume, srcSnapshot, err := d.checkCreate(req)
	if err != nil {
		return nil, err
	}
	release, err := d.acquire(true)
	if err != nil {
		return nil, err
	}
	defer release()
	if v := d.st.volumeByName(req.GetName()); v != nil {
		// Idempotency: the same request again gets the same volume.
		if why := sameRequest(v, req, srcVolume, srcSnapshot); why != "" {
			return nil, status.Errorf(codes.AlreadyExists, "volume %q exists (%s) but %s", req.GetName(), v.ID, why)
		}
		return &csi.CreateVolumeResponse{Volume: d.csiVolume(v)}, nil
	}
	minimum, srcDir, err := d.contentSource(srcVolume, srcSnapshot)
	if err != nil {
		return nil, err
	}
	size, err := d.size(req.GetCapacityRange(), minimum)
	if err != nil {
		return nil, err
	}
	node, err := d.pickNode(req.GetAccessibilityRequirements())
	if err != nil {
		return nil, err
	}
	if err := d.reserveOn(node, size); err != nil {
		return nil, err
	}
	v := &volume{
		ID: volumeID(req.GetName()), Name: req.GetName(), CapacityBytes: size, Node: node,
		Parameters: req.GetParameters(), MutableParameters: req.GetMutableParameters(), SourceVolumeID: srcVolume, SourceSnapshotID: srcSnapshot,
		CreatedAt: time.Now().UTC(),
	}
	if err := d.makeVolume(v, srcDir); err != nil {
		return nil, err
	}
	d.log.Info("volume created", "volume", v.ID, "name", v.Name, "bytes", v.CapacityBytes, "node", v.Node,
		"sourceVolume", srcVolume, "sourceSnapshot", srcSnapshot,
		"requisite", segmentsText(req.GetAccessibilityRequirements().GetRequisite()),
		"preferred", segmentsText(req.GetAccessibilityRequirements().GetPreferred()))
	return &csi.CreateVolumeResponse{Volume: d.csiVolume(v)}, nil
}

// checkCreate checks a CreateVolumeRequest before any state is read, and
// returns its content source: a volume's or a snapshot's ID, or neither.
func (d *Driver) checkCreate(req *csi.CreateVolumeRequest) (srcVolume, srcSnapshot string, err error) {
	if !validName(req.GetName()) {
		return "", "", status.Error(codes.InvalidArgument, "name is required")
	}
	if err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
		return "", "", err
	}
	if err := checkRange(req.GetCapacityRange()); err != nil {
		return "", "", err
	}
	if err := d.checkMutable(req.GetMutableParameters()); err != nil {
		return "", "", err
	}
	cs := req.GetVolumeContentSource()
	if cs == nil {
		return "", "", nil
	}
	switch t := cs.GetType().(type) {
	case *csi.VolumeContentSource_Volume:
		if srcVolume = t.Volume.GetVolumeId(); srcVolume == "" {
			return "", "", status.Error(codes.InvalidArgument, "volume_content_source.volume.volume_id is empty")
		}
	case *csi.VolumeContentSource_Snapshot:
		if srcSnapshot = t.Snapshot.GetSnapshotId(); srcSnapshot == "" {
			return "", "", status.Error(codes.InvalidArgument, "volume_content_source.snapshot.snapshot_id is empty")
		}
	default:
		return "", "", status.Error(codes.InvalidArgument, "volume_content_source has no volume or snapshot")
	}
	return srcVolume, srcSnapshot, nil
}

// sameRequest says why an existing volume of the request's name does not
// answer the request, or "" when it does (CreateVolume is idempotent).
func sameRequest(v *volume, req *csi.CreateVolumeRequest, srcVolume, srcSnapshot string) string {
	switch {
	case !inRange(v.CapacityBytes, req.GetCapacityRange()):
		return fmt.Sprintf("it has %d bytes, outside the requested range", v.CapacityBytes)
	case v.SourceVolumeID != srcVolume || v.SourceSnapshotID != srcSnapshot:
		return "it was made from a different content source"
	case !maps.Equal(v.Parameters, req.GetParameters()):
		return "it was made with different parameters"
	case !maps.Equal(v.MutableParameters, req.GetMutableParameters()):
		return "it was made with different mutable parameters"
	case !allowsNode(req.GetAccessibilityRequirements(), v.Node):
		return fmt.Sprintf("it is on node %q, which the accessibility requirements do not allow", v.Node)
	}
	return ""
}

// contentSource returns the smallest size a volume made from the source
// may have and the directory its data is copied from ("" for an empty
// volume). Called with the state held.
func (d *Driver) contentSource(srcVolume, srcSnapshot string) (minimum int64, dir string, err error) {
	switch {
	case srcVolume != "":
		src := d.st.Volumes[srcVolume]
		if src == nil {
			return 0, "", status.Errorf(codes.NotFound, "source volume %q does not exist", srcVolume)
		}
		return src.CapacityBytes, d.VolumePath(src.ID), nil
	case srcSnapshot != "":
		src := d.st.Snapshots[srcSnapshot]
		if src == nil {
			return 0, "", status.Errorf(codes.NotFound, "source snapshot %q does not exist", srcSnapshot)
		}
		return src.SizeBytes, filepath.Join(d.root, snapshotsDir, src.ID), nil
	}
	return 0, "", nil
}

// makeVolume makes v's directory, empty or a copy of srcDir, and saves
// v in the state; on failure neither is left. Called with the state held.
func (d *Driver) makeVolume(v *volume, srcDir string) error {
	dir := d.VolumePath(v.ID)
	if err := os.RemoveAll(dir); err != nil { // a leftover of an interrupted create
		return status.Errorf(codes.Internal, "volume directory: %v", err)
	}
	var err error
	if srcDir != "" {
		err = copyTree(srcDir, dir)
	} else {
		err = os.Mkdir(dir, 0o777)
	}
	if err != nil {
		return status.Errorf(codes.Internal, "create volume directory: %v", err)
	}
	d.st.Volumes[v.ID] = v
	if err := d.st.saveVolume(d.root, v.ID); err != nil {
		delete(d.st.Volumes, v.ID)
		_ = os.RemoveAll(dir)
		return status.Errorf(codes.Internal, "%v", err)
	}
	return nil
}

func (s *controllerServer) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	d := s.d
	id := req.GetVolumeId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	}
	release, err := d.acquire(true)
	if err != nil {
		return nil, err
	}
	defer release()
	v := d.st.Volumes[id]
	if v == nil {
		return &csi.DeleteVolumeResponse{}, nil // already gone
	}
	if err := d.checkUnused(id); err != nil {
		return nil, err
	}
	delete(d.st.Volumes, id)
	if err := d.st.saveVolume(d.root, id); err != nil {
		d.st.Volumes[id] = v
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	if err := os.RemoveAll(d.VolumePath(id)); err != nil {
		// The state no longer has it; the next start removes the rest.
		d.log.Warn("volume deleted but its directory was not removed", "volume", id, "error", err)
	}
	d.log.Info("volume deleted", "volume", id, "name", v.Name)
	return &csi.DeleteVolumeResponse{}, nil
}

func (s *controllerServer) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "volume_capabilities are required")
	}
	release, err := s.d.acquire(false)
	if err != nil {
		return nil, err
	}
	v := s.d.st.Volumes[req.GetVolumeId()]
	release()
	if v == nil {
		return nil, status.Errorf(codes.NotFound, "volume %q does not exist", req.GetVolumeId())
	}
	for _, c := range req.GetVolumeCapabilities() {
		if err := checkCapability(c); err != nil {
			return &csi.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil
		}
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}

// page cuts a sorted ID list for paging. The token is the last ID of the
// previous page, so deleting or adding entries between pages neither
// repeats nor skips the others; a token that is not an ID is Aborted, as
// the spec asks.
func page(ids []string, token string, maxEntries int32, valid func(string) bool) (out []string, next string, err error) {
	if maxEntries < 0 {
		return nil, "", status.Errorf(codes.InvalidArgument, "max_entries %d must not be negative", maxEntries)
	}
	if token != "" && !valid(token) {
		return nil, "", status.Errorf(codes.Aborted, "starting_token %q is not a token this driver gave out", token)
	}
	i := 0
	if token != "" {
		for i < len(ids) && ids[i] <= token {
			i++
		}
	}
	out = ids[i:]
	if maxEntries > 0 && len(out) > int(maxEntries) {
		out = out[:maxEntries]
		next = out[len(out)-1]
	}
	return out, next, nil
}

func (s *controllerServer) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	d := s.d
	release, err := d.acquire(false)
	if err != nil {
		return nil, err
	}
	defer release()
	ids, next, err := page(d.st.sortedVolumeIDs(), req.GetStartingToken(), req.GetMaxEntries(), volumeIDPattern.MatchString)
	if err != nil {
		return nil, err
	}
	resp := &csi.ListVolumesResponse{NextToken: next}
	for _, id := range ids {
		resp.Entries = append(resp.Entries, &csi.ListVolumesResponse_Entry{Volume: d.csiVolume(d.st.Volumes[id])})
	}
	return resp, nil
}

func (s *controllerServer) ControllerGetVolume(ctx context.Context, req *csi.ControllerGetVolumeRequest) (*csi.ControllerGetVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	}
	release, err := s.d.acquire(false)
	if err != nil {
		return nil, err
	}
	defer release()
	v := s.d.st.Volumes[req.GetVolumeId()]
	if v == nil {
		return nil, status.Errorf(codes.NotFound, "volume %q does not exist", req.GetVolumeId())
	}
	return &csi.ControllerGetVolumeResponse{Volume: s.d.csiVolume(v), Status: &csi.ControllerGetVolumeResponse_VolumeStatus{}}, nil
}

func (s *controllerServer) GetCapacity(ctx context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	d := s.d
	resp := &csi.GetCapacityResponse{}
	if d.maxSize > 0 {
		resp.MaximumVolumeSize = wrapperspb.Int64(d.maxSize)
	}
	for _, c := range req.GetVolumeCapabilities() {
		if checkCapability(c) != nil {
			return resp, nil // none for what this driver cannot make
		}
	}
	node := ""
	if t := req.GetAccessibleTopology(); t != nil {
		if node = t.GetSegments()[TopologyKey]; node == "" {
			return resp, nil // a topology this driver places nothing in
		}
	}
	release, err := d.acquire(false)
	if err != nil {
		return nil, err
	}
	left, limited := d.available(node)
	release()
	if !limited {
		free, err := freeBytes(d.root)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "free space of %s: %v", d.root, err)
		}
		left = free
	}
	resp.AvailableCapacity = left
	return resp, nil
}

func (s *controllerServer) ControllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	d := s.d
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	}
	if req.GetCapacityRange() == nil {
		return nil, status.Error(codes.InvalidArgument, "capacity_range is required")
	}
	if err := checkRange(req.GetCapacityRange()); err != nil {
		return nil, err
	}
	if c := req.GetVolumeCapability(); c != nil {
		if err := checkCapability(c); err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
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
	want, lim := req.GetCapacityRange().GetRequiredBytes(), req.GetCapacityRange().GetLimitBytes()
	if lim > 0 && v.CapacityBytes > lim {
		return nil, status.Errorf(codes.OutOfRange, "volume %s has %d bytes, above limit_bytes %d; volumes do not shrink", v.ID, v.CapacityBytes, lim)
	}
	if want <= v.CapacityBytes {
		return &csi.ControllerExpandVolumeResponse{CapacityBytes: v.CapacityBytes}, nil
	}
	if d.maxSize > 0 && want > d.maxSize {
		return nil, status.Errorf(codes.OutOfRange, "%d bytes is above this driver's largest volume, %d bytes", want, d.maxSize)
	}
	if err := d.reserveOn(v.Node, want-v.CapacityBytes); err != nil {
		return nil, err
	}
	old := v.CapacityBytes
	v.CapacityBytes = want
	if err := d.st.saveVolume(d.root, v.ID); err != nil {
		v.CapacityBytes = old
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	d.log.Info("volume expanded", "volume", v.ID, "from", old, "to", want)
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: want}, nil
}
