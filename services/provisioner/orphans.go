package provisioner

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/pkg/auth"
	"github.com/volplane/volplane/pkg/guard"
	"github.com/volplane/volplane/pkg/paging"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// VolumeContextCreationTime is the volume_context key (RFC 3339) from
// which the orphan report takes a volume's age. CSI has no creation time;
// volplane's dev driver reports this key, and a driver that does not gets
// no age in the report.
const VolumeContextCreationTime = "volplane.io/creation-time"

// DefaultOrphanScanPeriod is how often the orphan gauge is refreshed.
const DefaultOrphanScanPeriod = 10 * time.Minute

// Label values of volplane_provisioner_orphans' kind.
const (
	orphanKindVolume = "volume"
	orphanKindPV     = "persistent_volume"
)

var (
	orphanGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "volplane_provisioner_orphans",
		Help: "Orphans found by the last scan, by driver and kind: volume (a backing volume with neither a PersistentVolume nor a journal record) or persistent_volume (a PersistentVolume whose backing volume the driver does not list). Volumes that may belong to a provisioning in flight are not counted.",
	}, []string{"driver", "kind"})
)

// driverScan is what one scan learnt about one driver.
type driverScan struct {
	report  *provisionerv1.DriverOrphans
	orphans []*provisionerv1.Orphan
	// Why each listed volume that is not an orphan is not: the PV naming
	// it, or its journaled deletion. DeleteOrphan quotes it.
	explained map[string]string
	listed    map[string]bool
}

// scanOrphans compares what the drivers list with the PersistentVolumes
// and the journal. only limits it to one driver (CSI name); "" is all.
//
// The reads are ordered so that a volume being provisioned right now is
// never reported. A provisioning journals its record before CreateVolume,
// and removes it only after its PV exists; a PV with policy Delete goes
// only after its volume. So a volume that exists has a journal record or
// a PV at every instant, and:
//  1. PVs (first list), then
//  2. the drivers' volumes, then
//  3. the journal, then
//  4. PVs again.
//
// A volume listed in 2 whose record is gone in 3 had its PV created
// before 3, so 4 sees it. (Reading the journal before the volumes would
// miss a provisioning that starts in between; reading PVs only before the
// journal would miss a PV created after that read, once its record is
// removed.) A PV is reported as missing its volume only if it was in 1,
// before the volumes were listed, and is still in 4, and no deletion of it
// is journaled.
//
// A provisioning's volume ID is known only from CreateVolume's answer, and
// the journal keeps the request, not the answer: while provisionings of a
// driver are in flight, any of its volumes without a PV may be theirs.
// Such volumes are reported with Uncertain set, are not counted in the
// gauge, and DeleteOrphan refuses them.
func (p *provisioner) scanOrphans(ctx context.Context, only string) ([]*driverScan, error) {
	before, err := p.listVolumes(ctx)
	if err != nil {
		return nil, err
	}
	type listing struct {
		d    *driver
		scan *driverScan
		vols []*csi.Volume
	}
	var ls []*listing
	for _, d := range p.drivers.all() {
		if only != "" && d.name() != only {
			continue
		}
		l := &listing{d: d, scan: &driverScan{report: &provisionerv1.DriverOrphans{DriverName: d.name()}, explained: map[string]string{}, listed: map[string]bool{}}}
		ls = append(ls, l)
		switch {
		case !d.ready():
			l.scan.report.Message = fmt.Sprintf("the driver is not ready (%s): not checked", d.current().info.GetMessage())
			continue
		case !d.has(csi.ControllerServiceCapability_RPC_LIST_VOLUMES):
			l.scan.report.Message = "the driver lacks the LIST_VOLUMES controller capability: its volumes cannot be listed, so its orphans are unknown"
			continue
		}
		if l.vols, err = p.driverVolumes(ctx, d); err != nil {
			l.scan.report.Message = fmt.Sprintf("ListVolumes: %v", err)
			l.vols = nil
			continue
		}
		l.scan.report.Checked = true
		l.scan.report.VolumesListed = int32(len(l.vols))
	}

	provisions, err := p.journal.List(ctx, kindProvision)
	if err != nil {
		return nil, err
	}
	deletes, err := p.deletions(ctx)
	if err != nil {
		return nil, err
	}
	after, err := p.listVolumes(ctx)
	if err != nil {
		return nil, err
	}

	inFlight := map[string]int32{} // by provisioner name
	for _, r := range provisions {
		var op provisionOp
		if json.Unmarshal(r.Value, &op) == nil {
			inFlight[op.Provisioner]++
		}
	}
	deleting := map[string]string{} // driver/handle -> PV
	deletingPV := map[string]bool{} // PV names
	for _, d := range deletes {
		c := d.volume.Spec.CSI
		deleting[c.Driver+"/"+c.VolumeHandle] = d.volume.Name
		deletingPV[d.volume.Name] = true
	}
	stillThere := map[string]bool{}
	for _, pv := range after {
		stillThere[pv.Name] = true
	}

	var out []*driverScan
	for _, l := range ls {
		s, name := l.scan, l.d.name()
		out = append(out, s)
		if !s.report.Checked {
			continue
		}
		s.report.ProvisionsInFlight = inFlight[l.d.provisionerName()]
		for _, pv := range append(before, after...) {
			if c := pv.Spec.CSI; c != nil && c.Driver == name {
				s.explained[c.VolumeHandle] = "it is the backing volume of PersistentVolume " + pv.Name
			}
		}
		for k, pv := range deleting {
			if h, ok := strings.CutPrefix(k, name+"/"); ok {
				s.explained[h] = "its deletion (of PersistentVolume " + pv + ") is journaled"
			}
		}
		for _, v := range l.vols {
			id := v.GetVolumeId()
			s.listed[id] = true
			if s.explained[id] != "" {
				continue
			}
			o := &provisionerv1.Orphan{Kind: provisionerv1.OrphanKind_ORPHAN_KIND_VOLUME, DriverName: name, VolumeId: id,
				CapacityBytes: v.GetCapacityBytes(), CreateTime: creationTime(v)}
			if n := s.report.ProvisionsInFlight; n > 0 {
				o.Uncertain = fmt.Sprintf("%d provisioning operation(s) of this driver are in flight, and a provisioning's volume ID is known only once its PersistentVolume exists: this volume may be one of them", n)
			}
			s.orphans = append(s.orphans, o)
		}
		for _, pv := range before {
			c := pv.Spec.CSI
			if c == nil || c.Driver != name || s.listed[c.VolumeHandle] || !stillThere[pv.Name] || deletingPV[pv.Name] {
				continue
			}
			o := &provisionerv1.Orphan{Kind: provisionerv1.OrphanKind_ORPHAN_KIND_PERSISTENT_VOLUME, DriverName: name, VolumeId: c.VolumeHandle,
				PersistentVolumeName: pv.Name, CreateTime: timestamp(pv.CreationTimestamp.Time)}
			if q, ok := pv.Spec.Capacity[corev1.ResourceStorage]; ok {
				o.CapacityBytes = q.Value()
			}
			s.orphans = append(s.orphans, o)
		}
		sort.Slice(s.orphans, func(i, j int) bool {
			a, b := s.orphans[i], s.orphans[j]
			if a.Kind != b.Kind {
				return a.Kind < b.Kind
			}
			return a.VolumeId < b.VolumeId
		})
		count := map[string]float64{orphanKindVolume: 0, orphanKindPV: 0}
		for _, o := range s.orphans {
			switch {
			case o.Kind == provisionerv1.OrphanKind_ORPHAN_KIND_PERSISTENT_VOLUME:
				count[orphanKindPV]++
			case o.Uncertain == "":
				count[orphanKindVolume]++
			}
		}
		for k, n := range count {
			orphanGauge.WithLabelValues(name, k).Set(n)
		}
	}
	return out, nil
}

// listVolumes lists every PersistentVolume from the API server, a page at
// a time.
func (p *provisioner) listVolumes(ctx context.Context) ([]corev1.PersistentVolume, error) {
	var out []corev1.PersistentVolume
	opts := metav1.ListOptions{Limit: 500}
	for {
		l, err := p.client.CoreV1().PersistentVolumes().List(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("list PersistentVolumes: %w", err)
		}
		out = append(out, l.Items...)
		if opts.Continue = l.Continue; opts.Continue == "" {
			return out, nil
		}
	}
}

// driverVolumes lists every volume of d, a page at a time.
func (p *provisioner) driverVolumes(ctx context.Context, d *driver) ([]*csi.Volume, error) {
	var out []*csi.Volume
	token := ""
	for {
		cctx, cancel := context.WithTimeout(ctx, p.timeout)
		resp, err := d.controller.ListVolumes(cctx, &csi.ListVolumesRequest{MaxEntries: 500, StartingToken: token})
		cancel()
		if err != nil {
			return nil, err
		}
		for _, e := range resp.GetEntries() {
			out = append(out, e.GetVolume())
		}
		if token = resp.GetNextToken(); token == "" {
			return out, nil
		}
	}
}

func creationTime(v *csi.Volume) *timestamppb.Timestamp {
	s := v.GetVolumeContext()[VolumeContextCreationTime]
	if s == "" {
		return nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return nil
	}
	return timestamp(t)
}

// orphanLoop refreshes the gauge every period until ctx ends.
func (p *provisioner) orphanLoop(ctx context.Context, period time.Duration, probed <-chan struct{}) {
	if period < 0 {
		return
	}
	select {
	case <-probed:
	case <-ctx.Done():
		return
	}
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		if _, err := p.scanOrphans(ctx, ""); err != nil && ctx.Err() == nil {
			p.log.Warn("orphan scan", "error", err)
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
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
	scans, err := s.p.scanOrphans(ctx, req.GetDriverName())
	if err != nil {
		return nil, toStatus(err)
	}
	out := &provisionerv1.ListOrphansResponse{}
	for _, sc := range scans {
		out.Drivers = append(out.Drivers, sc.report)
		for _, o := range sc.orphans {
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
	scans, err := s.p.scanOrphans(ctx, name)
	if err != nil {
		return nil, toStatus(err)
	}
	sc := scans[0]
	if !sc.report.Checked {
		return nil, status.Errorf(codes.FailedPrecondition, "driver %q cannot be checked for orphans: %s", name, sc.report.Message)
	}
	var orphan *provisionerv1.Orphan
	for _, o := range sc.orphans {
		if o.Kind == provisionerv1.OrphanKind_ORPHAN_KIND_VOLUME && o.VolumeId == id {
			orphan = o
		}
	}
	switch {
	case sc.explained[id] != "":
		return nil, status.Errorf(codes.FailedPrecondition, "volume %q of driver %q is not an orphan: %s", id, name, sc.explained[id])
	case !sc.listed[id] || orphan == nil:
		return nil, status.Errorf(codes.NotFound, "driver %q does not list a volume %q", name, id)
	case orphan.Uncertain != "":
		return nil, status.Errorf(codes.FailedPrecondition, "volume %q of driver %q may not be an orphan: %s; try again once they end (GET /v1/provisioner/operations)", id, name, orphan.Uncertain)
	}
	// Last, right before the call: no provisioning of this driver began
	// since the scan read the journal.
	if n, err := s.p.provisionsInFlight(ctx, d); err != nil {
		return nil, toStatus(err)
	} else if n > 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %q of driver %q may not be an orphan: %d provisioning operation(s) of this driver began meanwhile; try again once they end", id, name, n)
	}
	cctx, cancel := context.WithTimeout(ctx, s.p.timeout)
	_, err = d.controller.DeleteVolume(cctx, &csi.DeleteVolumeRequest{VolumeId: id})
	cancel()
	if err != nil && status.Code(err) != codes.NotFound {
		st := status.Convert(err)
		return nil, status.Errorf(st.Code(), "DeleteVolume %s: %s", id, st.Message())
	}
	user, _ := auth.FromIncomingContext(ctx)
	s.p.log.Info("deleted orphaned backing volume", "driver", name, "handle", id, "bytes", orphan.CapacityBytes, "user", user.Name)
	if _, err := s.p.scanOrphans(ctx, name); err != nil { // refresh the gauge
		s.p.log.Debug("orphan scan after a deletion", "error", err)
	}
	return &provisionerv1.DeleteOrphanResponse{Orphan: orphan}, nil
}

// provisionsInFlight counts the journaled provisionings of d.
func (p *provisioner) provisionsInFlight(ctx context.Context, d *driver) (int, error) {
	recs, err := p.journal.List(ctx, kindProvision)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, r := range recs {
		var op provisionOp
		if json.Unmarshal(r.Value, &op) == nil && op.Provisioner == d.provisionerName() {
			n++
		}
	}
	return n, nil
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
