package orphans

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// VolumeContextCreationTime is the volume_context key (RFC 3339) from
// which the orphan report takes a volume's age. CSI has no creation time;
// volplane's dev driver reports this key, and a driver that does not gets
// no age in the report.
const VolumeContextCreationTime = "volplane.io/creation-time"

// DefaultScanPeriod is how often the orphan gauge is refreshed.
const DefaultScanPeriod = 10 * time.Minute

// Label values of volplane_provisioner_orphans' kind.
const (
	kindVolume = "volume"
	kindPV     = "persistent_volume"
)

// Gauge is volplane_provisioner_orphans, which the provisioner registers.
var Gauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "volplane_provisioner_orphans",
	Help: "Orphans found by the last scan, by driver and kind: volume (a backing volume with neither a PersistentVolume nor a journal record) or persistent_volume (a PersistentVolume whose backing volume the driver does not list). Volumes that may belong to a provisioning in flight are not counted.",
}, []string{"driver", "kind"})

// Driver is what a scan knows of one CSI driver.
type Driver struct {
	// Name is its CSI name, ProvisionerName the StorageClass provisioner
	// it serves.
	Name, ProvisionerName string
	// Ready: its last probe succeeded; Message says why not.
	Ready   bool
	Message string
	// ListVolumes: it has the LIST_VOLUMES capability.
	ListVolumes bool
}

// Drivers are the drivers the provisioner serves, and their controller
// calls (each bounded by the provisioner's timeout).
type Drivers interface {
	All() []Driver
	Driver(name string) (Driver, bool)
	ListVolumes(ctx context.Context, driver string, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error)
	DeleteVolume(ctx context.Context, driver, volumeID string) error
}

// Journal is what a scan reads of the provisioner's operation journal.
type Journal interface {
	// ProvisionsInFlight counts the journaled provisionings by
	// provisioner name.
	ProvisionsInFlight(ctx context.Context) (map[string]int32, error)
	// Deleting are the PersistentVolumes whose deletion is journaled.
	Deleting(ctx context.Context) ([]*corev1.PersistentVolume, error)
}

// Scanner finds and deletes orphans: backing volumes that no
// PersistentVolume names and no journal record explains, and
// PersistentVolumes whose volume the driver does not list.
type Scanner struct {
	log     *slog.Logger
	client  kubernetes.Interface
	drivers Drivers
	journal Journal
}

// New is a Scanner reading PersistentVolumes through client.
func New(log *slog.Logger, client kubernetes.Interface, drivers Drivers, journal Journal) *Scanner {
	return &Scanner{log: log, client: client, drivers: drivers, journal: journal}
}

// Scan is what one scan learnt about one driver.
type Scan struct {
	Report  *provisionerv1.DriverOrphans
	Orphans []*provisionerv1.Orphan
	// Explained says why each listed volume that is not an orphan is
	// not: the PV naming it, or its journaled deletion. Delete quotes it.
	Explained map[string]string
	Listed    map[string]bool
}

// Scan compares what the drivers list with the PersistentVolumes
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
// gauge, and the provisioner's DeleteOrphan refuses them.
func (s *Scanner) Scan(ctx context.Context, only string) ([]*Scan, error) {
	var r reads
	var err error
	if r.before, err = s.listVolumes(ctx); err != nil { // 1
		return nil, err
	}
	ls := s.listDrivers(ctx, only)                                       // 2
	if r.inFlight, err = s.journal.ProvisionsInFlight(ctx); err != nil { // 3
		return nil, err
	}
	deletes, err := s.journal.Deleting(ctx)
	if err != nil {
		return nil, err
	}
	after, err := s.listVolumes(ctx) // 4
	if err != nil {
		return nil, err
	}
	r.index(deletes, after)
	var out []*Scan
	for _, l := range ls {
		out = append(out, l.scan)
		if l.scan.Report.Checked {
			r.judge(l)
			setGauge(l.scan)
		}
	}
	return out, nil
}

// listing is one driver's volumes, as a scan listed them.
type listing struct {
	d    Driver
	scan *Scan
	vols []*csi.Volume
}

// listDrivers lists the volumes of every driver (or only one), saying in
// its report why a driver could not be checked.
func (s *Scanner) listDrivers(ctx context.Context, only string) []*listing {
	var ls []*listing
	for _, d := range s.drivers.All() {
		if only != "" && d.Name != only {
			continue
		}
		l := &listing{d: d, scan: &Scan{Report: &provisionerv1.DriverOrphans{DriverName: d.Name}, Explained: map[string]string{}, Listed: map[string]bool{}}}
		ls = append(ls, l)
		switch {
		case !d.Ready:
			l.scan.Report.Message = fmt.Sprintf("the driver is not ready (%s): not checked", d.Message)
			continue
		case !d.ListVolumes:
			l.scan.Report.Message = "the driver lacks the LIST_VOLUMES controller capability: its volumes cannot be listed, so its orphans are unknown"
			continue
		}
		vols, err := s.driverVolumes(ctx, d.Name)
		if err != nil {
			l.scan.Report.Message = fmt.Sprintf("ListVolumes: %v", err)
			continue
		}
		l.vols = vols
		l.scan.Report.Checked = true
		l.scan.Report.VolumesListed = int32(len(l.vols))
	}
	return ls
}

// reads are the journal and PersistentVolumes a scan read around the
// drivers' listings.
type reads struct {
	before     []corev1.PersistentVolume
	inFlight   map[string]int32  // provisionings by provisioner name
	deleting   map[string]string // driver/handle -> PV
	deletingPV map[string]bool   // PV names
	stillThere map[string]bool   // PV names in the second list
	after      []corev1.PersistentVolume
}

func (r *reads) index(deletes []*corev1.PersistentVolume, after []corev1.PersistentVolume) {
	r.deleting, r.deletingPV, r.stillThere, r.after = map[string]string{}, map[string]bool{}, map[string]bool{}, after
	for _, v := range deletes {
		c := v.Spec.CSI
		r.deleting[c.Driver+"/"+c.VolumeHandle] = v.Name
		r.deletingPV[v.Name] = true
	}
	for _, pv := range after {
		r.stillThere[pv.Name] = true
	}
}

// judge fills the scan of a checked driver: what explains each listed
// volume, and the orphans, sorted by kind and volume ID.
func (r *reads) judge(l *listing) {
	s, name := l.scan, l.d.Name
	s.Report.ProvisionsInFlight = r.inFlight[l.d.ProvisionerName]
	for _, pv := range append(r.before, r.after...) {
		if c := pv.Spec.CSI; c != nil && c.Driver == name {
			s.Explained[c.VolumeHandle] = "it is the backing volume of PersistentVolume " + pv.Name
		}
	}
	for k, pv := range r.deleting {
		if h, ok := strings.CutPrefix(k, name+"/"); ok {
			s.Explained[h] = "its deletion (of PersistentVolume " + pv + ") is journaled"
		}
	}
	r.volumeOrphans(l)
	r.volumeLessPVs(l)
	sort.Slice(s.Orphans, func(i, j int) bool {
		a, b := s.Orphans[i], s.Orphans[j]
		if a.Kind != b.Kind {
			return a.Kind < b.Kind
		}
		return a.VolumeId < b.VolumeId
	})
}

// volumeOrphans are the listed volumes nothing explains.
func (r *reads) volumeOrphans(l *listing) {
	s := l.scan
	for _, v := range l.vols {
		id := v.GetVolumeId()
		s.Listed[id] = true
		if s.Explained[id] != "" {
			continue
		}
		o := &provisionerv1.Orphan{Kind: provisionerv1.OrphanKind_ORPHAN_KIND_VOLUME, DriverName: l.d.Name, VolumeId: id,
			CapacityBytes: v.GetCapacityBytes(), CreateTime: creationTime(v)}
		if n := s.Report.ProvisionsInFlight; n > 0 {
			o.Uncertain = fmt.Sprintf("%d provisioning operation(s) of this driver are in flight, and a provisioning's volume ID is known only once its PersistentVolume exists: this volume may be one of them", n)
		}
		s.Orphans = append(s.Orphans, o)
	}
}

// volumeLessPVs are the PersistentVolumes of the driver, in both lists,
// whose volume it did not list and whose deletion is not journaled.
func (r *reads) volumeLessPVs(l *listing) {
	s := l.scan
	for _, pv := range r.before {
		c := pv.Spec.CSI
		if c == nil || c.Driver != l.d.Name || s.Listed[c.VolumeHandle] || !r.stillThere[pv.Name] || r.deletingPV[pv.Name] {
			continue
		}
		o := &provisionerv1.Orphan{Kind: provisionerv1.OrphanKind_ORPHAN_KIND_PERSISTENT_VOLUME, DriverName: l.d.Name, VolumeId: c.VolumeHandle,
			PersistentVolumeName: pv.Name, CreateTime: timestamp(pv.CreationTimestamp.Time)}
		if q, ok := pv.Spec.Capacity[corev1.ResourceStorage]; ok {
			o.CapacityBytes = q.Value()
		}
		s.Orphans = append(s.Orphans, o)
	}
}

// setGauge counts a checked driver's orphans (uncertain volumes not).
func setGauge(s *Scan) {
	count := map[string]float64{kindVolume: 0, kindPV: 0}
	for _, o := range s.Orphans {
		switch {
		case o.Kind == provisionerv1.OrphanKind_ORPHAN_KIND_PERSISTENT_VOLUME:
			count[kindPV]++
		case o.Uncertain == "":
			count[kindVolume]++
		}
	}
	for k, n := range count {
		Gauge.WithLabelValues(s.Report.DriverName, k).Set(n)
	}
}

// listVolumes lists every PersistentVolume from the API server, a page at
// a time.
func (s *Scanner) listVolumes(ctx context.Context) ([]corev1.PersistentVolume, error) {
	var out []corev1.PersistentVolume
	opts := metav1.ListOptions{Limit: 500}
	for {
		l, err := s.client.CoreV1().PersistentVolumes().List(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("list PersistentVolumes: %w", err)
		}
		out = append(out, l.Items...)
		if opts.Continue = l.Continue; opts.Continue == "" {
			return out, nil
		}
	}
}

// driverVolumes lists every volume of a driver, a page at a time.
func (s *Scanner) driverVolumes(ctx context.Context, driver string) ([]*csi.Volume, error) {
	var out []*csi.Volume
	token := ""
	for {
		resp, err := s.drivers.ListVolumes(ctx, driver, &csi.ListVolumesRequest{MaxEntries: 500, StartingToken: token})
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

func timestamp(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

// Loop refreshes the gauge every period, once probed is closed, until ctx
// ends; a negative period never.
func (s *Scanner) Loop(ctx context.Context, period time.Duration, probed <-chan struct{}) {
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
		if _, err := s.Scan(ctx, ""); err != nil && ctx.Err() == nil {
			s.log.Warn("orphan scan", "error", err)
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

// Delete deletes an orphan the caller has checked, right after checking
// that no provisioning of its driver began since the scan read the
// journal (FailedPrecondition if one did). It is not journaled: an orphan
// whose deletion is interrupted is still an orphan, reported again. A
// volume the driver no longer has is deleted already.
func (s *Scanner) Delete(ctx context.Context, d Driver, o *provisionerv1.Orphan) error {
	inFlight, err := s.journal.ProvisionsInFlight(ctx)
	if err != nil {
		return err
	}
	if n := inFlight[d.ProvisionerName]; n > 0 {
		return status.Errorf(codes.FailedPrecondition, "volume %q of driver %q may not be an orphan: %d provisioning operation(s) of this driver began meanwhile; try again once they end", o.VolumeId, d.Name, n)
	}
	if err := s.drivers.DeleteVolume(ctx, d.Name, o.VolumeId); err != nil && status.Code(err) != codes.NotFound {
		st := status.Convert(err)
		return status.Errorf(st.Code(), "DeleteVolume %s: %s", o.VolumeId, st.Message())
	}
	return nil
}
