package devcsi

import (
	"context"
	"os"
	"path/filepath"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func csiSnapshot(sn *snapshot) *csi.Snapshot {
	return &csi.Snapshot{
		SnapshotId:     sn.ID,
		SourceVolumeId: sn.SourceVolumeID,
		SizeBytes:      sn.SizeBytes,
		CreationTime:   timestamppb.New(sn.CreatedAt),
		ReadyToUse:     true,
	}
}

func (s *controllerServer) CreateSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	d := s.d
	if !validName(req.GetName()) {
		return nil, status.Error(codes.InvalidArgument, "name is required")
	}
	if req.GetSourceVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "source_volume_id is required")
	}
	release, err := d.acquire(true)
	if err != nil {
		return nil, err
	}
	defer release()
	if sn := d.st.snapshotByName(req.GetName()); sn != nil {
		if sn.SourceVolumeID != req.GetSourceVolumeId() {
			return nil, status.Errorf(codes.AlreadyExists, "snapshot %q exists (%s) of another volume, %s", req.GetName(), sn.ID, sn.SourceVolumeID)
		}
		return &csi.CreateSnapshotResponse{Snapshot: csiSnapshot(sn)}, nil
	}
	v := d.st.Volumes[req.GetSourceVolumeId()]
	if v == nil {
		return nil, status.Errorf(codes.NotFound, "source volume %q does not exist", req.GetSourceVolumeId())
	}
	sn := &snapshot{
		ID: snapshotID(req.GetName()), Name: req.GetName(), SourceVolumeID: v.ID, SizeBytes: v.CapacityBytes,
		Parameters: req.GetParameters(), CreatedAt: time.Now().UTC(),
	}
	dir := filepath.Join(d.root, snapshotsDir, sn.ID)
	if err := os.RemoveAll(dir); err != nil {
		return nil, status.Errorf(codes.Internal, "snapshot directory: %v", err)
	}
	if err := copyTree(d.VolumePath(v.ID), dir); err != nil {
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	d.st.Snapshots[sn.ID] = sn
	if err := d.st.saveSnapshot(d.root, sn.ID); err != nil {
		delete(d.st.Snapshots, sn.ID)
		_ = os.RemoveAll(dir)
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	d.log.Info("snapshot created", "snapshot", sn.ID, "name", sn.Name, "volume", v.ID)
	return &csi.CreateSnapshotResponse{Snapshot: csiSnapshot(sn)}, nil
}

func (s *controllerServer) DeleteSnapshot(ctx context.Context, req *csi.DeleteSnapshotRequest) (*csi.DeleteSnapshotResponse, error) {
	d := s.d
	id := req.GetSnapshotId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "snapshot_id is required")
	}
	release, err := d.acquire(true)
	if err != nil {
		return nil, err
	}
	defer release()
	sn := d.st.Snapshots[id]
	if sn == nil {
		return &csi.DeleteSnapshotResponse{}, nil
	}
	delete(d.st.Snapshots, id)
	if err := d.st.saveSnapshot(d.root, id); err != nil {
		d.st.Snapshots[id] = sn
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	if err := os.RemoveAll(filepath.Join(d.root, snapshotsDir, id)); err != nil {
		d.log.Warn("snapshot deleted but its directory was not removed", "snapshot", id, "error", err)
	}
	d.log.Info("snapshot deleted", "snapshot", id, "name", sn.Name)
	return &csi.DeleteSnapshotResponse{}, nil
}

func (s *controllerServer) ListSnapshots(ctx context.Context, req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	d := s.d
	release, err := d.acquire(false)
	if err != nil {
		return nil, err
	}
	defer release()
	var ids []string
	for _, id := range d.st.sortedSnapshotIDs() {
		sn := d.st.Snapshots[id]
		if (req.GetSnapshotId() == "" || id == req.GetSnapshotId()) &&
			(req.GetSourceVolumeId() == "" || sn.SourceVolumeID == req.GetSourceVolumeId()) {
			ids = append(ids, id)
		}
	}
	ids, next, err := page(ids, req.GetStartingToken(), req.GetMaxEntries(), snapshotIDPattern.MatchString)
	if err != nil {
		return nil, err
	}
	resp := &csi.ListSnapshotsResponse{NextToken: next}
	for _, id := range ids {
		resp.Entries = append(resp.Entries, &csi.ListSnapshotsResponse_Entry{Snapshot: csiSnapshot(d.st.Snapshots[id])})
	}
	return resp, nil
}

func (s *controllerServer) GetSnapshot(ctx context.Context, req *csi.GetSnapshotRequest) (*csi.GetSnapshotResponse, error) {
	if req.GetSnapshotId() == "" {
		return nil, status.Error(codes.InvalidArgument, "snapshot_id is required")
	}
	release, err := s.d.acquire(false)
	if err != nil {
		return nil, err
	}
	defer release()
	sn := s.d.st.Snapshots[req.GetSnapshotId()]
	if sn == nil {
		return nil, status.Errorf(codes.NotFound, "snapshot %q does not exist", req.GetSnapshotId())
	}
	return &csi.GetSnapshotResponse{Snapshot: csiSnapshot(sn)}, nil
}
