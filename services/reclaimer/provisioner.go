package reclaimer

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/volplane/volplane/pkg/paging"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// provisioner is what the reclaimer needs of volplane's provisioner
// service: the drivers it serves, and DeleteVolume.
type provisioner interface {
	ListDrivers(ctx context.Context, in *provisionerv1.ListDriversRequest, opts ...grpc.CallOption) (*provisionerv1.ListDriversResponse, error)
	DeleteVolume(ctx context.Context, in *provisionerv1.DeleteVolumeRequest, opts ...grpc.CallOption) (*provisionerv1.DeleteVolumeResponse, error)
}

var _ provisioner = provisionerv1.ProvisionerServiceClient(nil)

// Timeouts of the provisioner's calls. DeleteVolume may take long: the
// provisioner answers IN_BACKGROUND when its driver does.
const (
	listDriversTimeout  = 5 * time.Second
	deleteVolumeTimeout = 2 * time.Minute
	// driversRetry is the least time between two ListDrivers calls while
	// the provisioner fails, or a volume names a driver not in the list.
	driversRetry = 2 * time.Second
)

// drivers caches the provisioner's served drivers, read again every period
// and sooner when a volume names one not in the list (a driver just added).
type drivers struct {
	p      provisioner // nil: nothing is served
	period time.Duration
	log    *slog.Logger
	now    func() time.Time

	mu      sync.Mutex
	cur     served
	fetched time.Time // of cur
	tried   time.Time // last ListDrivers call
}

func newDrivers(p provisioner, period time.Duration, log *slog.Logger) *drivers {
	d := &drivers{p: p, period: period, log: log, now: time.Now}
	if p == nil {
		d.cur = served{known: true}
	} else {
		d.cur = served{err: errors.New("the provisioner has not answered ListDrivers yet")}
	}
	return d
}

// get returns the served drivers, reading them first when the list is
// stale or lacks one of names (a CSI driver or provisioner name).
func (d *drivers) get(ctx context.Context, names ...string) served {
	if d.p == nil {
		return d.cur
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.now()
	refresh := !d.cur.known || now.Sub(d.fetched) >= d.period
	for _, n := range names {
		if n != "" && !d.cur.drivers[n] && !d.cur.provisioners[n] {
			refresh = true
		}
	}
	if !refresh || now.Sub(d.tried) < driversRetry {
		return d.cur
	}
	d.tried = now
	ctx, cancel := context.WithTimeout(ctx, listDriversTimeout)
	defer cancel()
	s := served{known: true, drivers: map[string]bool{}, provisioners: map[string]bool{}}
	req := &provisionerv1.ListDriversRequest{PageSize: paging.MaxSize}
	for {
		resp, err := d.p.ListDrivers(ctx, req)
		if err != nil {
			d.log.Warn("cannot read the provisioner's drivers", "err", err)
			if !d.cur.known {
				d.cur.err = err
			}
			return d.cur
		}
		for _, drv := range resp.GetDrivers() {
			if drv.GetDriverName() != "" {
				s.drivers[drv.GetDriverName()] = true
			}
			if drv.GetProvisionerName() != "" {
				s.provisioners[drv.GetProvisionerName()] = true
			}
		}
		if req.PageToken = resp.GetNextPageToken(); req.PageToken == "" {
			break
		}
	}
	d.cur, d.fetched = s, now
	return s
}
