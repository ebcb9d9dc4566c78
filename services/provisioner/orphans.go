package provisioner

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"

	"github.com/volplane/volplane/pkg/auth"
	"github.com/volplane/volplane/pkg/guard"
	"github.com/volplane/volplane/pkg/paging"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	"github.com/volplane/volplane/services/provisioner/orphans"
)

// orphanDrivers is what the orphan scan asks of the drivers served.
type orphanDrivers struct{ p *provisioner }

var _ orphans.Drivers = orphanDrivers{}

func orphanDriver(d *driver) orphans.Driver {
	return orphans.Driver{Name: d.name(), ProvisionerName: d.provisionerName(), Ready: d.ready(), Message: d.current().info.GetMessage(),
		ListVolumes: d.has(csi.ControllerServiceCapability_RPC_LIST_VOLUMES)}
}

func (o orphanDrivers) All() []orphans.Driver {
	var out []orphans.Driver
	for _, d := range o.p.drivers.all() {
		out = append(out, orphanDriver(d))
	}
	return out
}

func (o orphanDrivers) Driver(name string) (orphans.Driver, bool) {
	d := o.p.drivers.byDriver(name)
	if d == nil {
		return orphans.Driver{}, false
	}
	return orphanDriver(d), true
}

func (o orphanDrivers) ListVolumes(ctx context.Context, driver string, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	d := o.p.drivers.byDriver(driver)
	if d == nil {
		return nil, fmt.Errorf("CSI driver %q is %w", driver, errNotServed)
	}
	ctx, cancel := context.WithTimeout(ctx, o.p.timeoutFor(d))
	defer cancel()
	return d.controller.ListVolumes(ctx, req)
}

func (o orphanDrivers) DeleteVolume(ctx context.Context, driver, volumeID string) error {
	d := o.p.drivers.byDriver(driver)
	if d == nil {
		return fmt.Errorf("CSI driver %q is %w", driver, errNotServed)
	}
	ctx, cancel := context.WithTimeout(ctx, o.p.timeoutFor(d))
	defer cancel()
	_, err := d.controller.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: volumeID})
	return err
}

// orphanJournal is what the orphan scan reads of the journal.
type orphanJournal struct{ p *provisioner }

var _ orphans.Journal = orphanJournal{}

func (o orphanJournal) ProvisionsInFlight(ctx context.Context) (map[string]int32, error) {
	recs, err := o.p.journal.List(ctx, kindProvision)
	if err != nil {
		return nil, err
	}
	out := map[string]int32{}
	for _, r := range recs {
		var op provisionOp
		if json.Unmarshal(r.Value, &op) == nil {
			out[op.Provisioner]++
		}
	}
	return out, nil
}

func (o orphanJournal) Deleting(ctx context.Context) ([]*corev1.PersistentVolume, error) {
	ds, err := o.p.deletions(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]*corev1.PersistentVolume, 0, len(ds))
	for _, d := range ds {
		out = append(out, d.volume)
	}
	return out, nil
}

// newOrphanScanner is the orphan scan over p's drivers and journal.
func newOrphanScanner(p *provisioner) *orphans.Scanner {
	return orphans.New(p.log, p.client, orphanDrivers{p}, orphanJournal{p})
}

// ListOrphans reports a page of the orphans of every driver served (or
// one), by driver, kind and volume ID. Each page is a scan of its own.
func (s *server) ListOrphans(ctx context.Context, req *provisionerv1.ListOrphansRequest) (*provisionerv1.ListOrphansResponse, error) {
	if _, ok := provisionerv1.OrphanKind_name[int32(req.GetKind())]; !ok {
		return nil, status.Errorf(codes.InvalidArgument, "kind %d is unknown: use ORPHAN_KIND_VOLUME or ORPHAN_KIND_PERSISTENT_VOLUME, or none for both", req.GetKind())
	}
	if err := guard.CheckText("driver_name", req.GetDriverName()); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	page, err := newPage[*provisionerv1.Orphan]("provisioner.orphans", req.GetPageSize(), req.GetPageToken(),
		"driver", req.GetDriverName(), "kind", req.GetKind().String())
	if err != nil {
		return nil, err
	}
	if n := req.GetDriverName(); n != "" && s.p.drivers.byDriver(n) == nil {
		return nil, status.Errorf(codes.NotFound, "driver %q is not served by this provisioner (GET /v1/drivers lists those that are)", n)
	}
	scans, err := s.orphans.Scan(ctx, req.GetDriverName())
	if err != nil {
		return nil, toStatus(err)
	}
	out := &provisionerv1.ListOrphansResponse{}
	for _, sc := range scans {
		out.Drivers = append(out.Drivers, sc.Report)
		for _, o := range sc.Orphans {
			if req.GetKind() == provisionerv1.OrphanKind_ORPHAN_KIND_UNSPECIFIED || o.GetKind() == req.GetKind() {
				page.Offer(orphanKey(o), o)
			}
		}
	}
	out.Orphans, out.NextPageToken = page.Page()
	return out, nil
}

// orphanKey orders orphans by driver, kind, then volume ID.
func orphanKey(o *provisionerv1.Orphan) string {
	return paging.Key(o.GetDriverName(), fmt.Sprintf("%02d", o.GetKind()), o.GetVolumeId(), o.GetPersistentVolumeName())
}

// DeleteOrphan deletes one orphaned backing volume after checking, with a
// fresh scan (PVs, the driver's volumes, the journal, PVs again) and the
// journal read once more right before DeleteVolume, that it still is one.
// The deletion is not journaled: an orphan whose deletion is interrupted
// is still an orphan, reported again.
func (s *server) DeleteOrphan(ctx context.Context, req *provisionerv1.DeleteOrphanRequest) (*provisionerv1.DeleteOrphanResponse, error) {
	name, id := req.GetDriverName(), req.GetVolumeId()
	if name == "" || id == "" {
		return nil, status.Error(codes.InvalidArgument, "driver_name and volume_id are required (GET /v1/orphans lists them)")
	}
	if err := s.checkOrphanText(name, id); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	d := s.p.drivers.byDriver(name)
	if d == nil {
		return nil, status.Errorf(codes.NotFound, "driver %q is not served by this provisioner (GET /v1/drivers lists those that are)", name)
	}
	scans, err := s.orphans.Scan(ctx, name)
	if err != nil {
		return nil, toStatus(err)
	}
	sc := scans[0]
	if !sc.Report.Checked {
		return nil, status.Errorf(codes.FailedPrecondition, "driver %q cannot be checked for orphans: %s", name, sc.Report.Message)
	}
	var orphan *provisionerv1.Orphan
	for _, o := range sc.Orphans {
		if o.Kind == provisionerv1.OrphanKind_ORPHAN_KIND_VOLUME && o.VolumeId == id {
			orphan = o
		}
	}
	switch {
	case sc.Explained[id] != "":
		return nil, status.Errorf(codes.FailedPrecondition, "volume %q of driver %q is not an orphan: %s", id, name, sc.Explained[id])
	case !sc.Listed[id] || orphan == nil:
		return nil, status.Errorf(codes.NotFound, "driver %q does not list a volume %q", name, id)
	case orphan.Uncertain != "":
		return nil, status.Errorf(codes.FailedPrecondition, "volume %q of driver %q may not be an orphan: %s; try again once they end (GET /v1/provisioner/operations)", id, name, orphan.Uncertain)
	}
	// Last, right before the call: no provisioning of this driver began
	// since the scan read the journal.
	if err := s.orphans.Delete(ctx, orphanDriver(d), orphan); err != nil {
		if _, ok := status.FromError(err); ok {
			return nil, err
		}
		return nil, toStatus(err)
	}
	user, _ := auth.FromIncomingContext(ctx)
	s.p.log.Info("deleted orphaned backing volume", "driver", name, "handle", id, "bytes", orphan.CapacityBytes, "user", user.Name)
	if _, err := s.orphans.Scan(ctx, name); err != nil { // refresh the gauge
		s.p.log.Debug("orphan scan after a deletion", "error", err)
	}
	return &provisionerv1.DeleteOrphanResponse{Orphan: orphan}, nil
}

func (s *server) checkOrphanText(name, id string) error {
	if len(name) > 253 || len(id) > 1024 {
		return fmt.Errorf("driver_name (at most 253 bytes) or volume_id (at most 1024) is too long")
	}
	for _, v := range []string{name, id} {
		if !utf8.ValidString(v) || strings.ContainsFunc(v, unicode.IsControl) {
			return fmt.Errorf("driver_name and volume_id must be printable UTF-8")
		}
	}
	return nil
}
