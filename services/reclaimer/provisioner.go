package reclaimer

import (
	"context"
	"log/slog"
	"time"

	"google.golang.org/grpc"

	"github.com/volplane/volplane/pkg/served"
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

// newDrivers is the cache of the provisioner's served drivers the
// reclaimer decides Delete with: read again every period, and at once
// (waiting for it) when a volume names a driver not in the list, a driver
// just added. p nil serves nothing.
func newDrivers(p provisioner, period time.Duration, log *slog.Logger) *served.Cache {
	var l served.Lister
	if p != nil {
		l = p
	}
	return served.New(l, served.Options{Period: period, WaitForMissing: true, Timeout: listDriversTimeout, Retry: driversRetry}, log)
}
