package binder

import (
	"context"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/volplane/volplane/pkg/kube"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// servedTTL is how long the list of provisioner names the provisioner
// serves is trusted before it is asked again.
const servedTTL = 10 * time.Second

// provisionerClient adapts the provisioner's gRPC client to the binder's
// needs, caching which provisioner names it serves.
type provisionerClient struct {
	c   provisionerv1.ProvisionerServiceClient
	log *slog.Logger

	mu      sync.Mutex
	served  map[string]bool
	fetched time.Time
}

var _ provisioner = (*provisionerClient)(nil)

func newProvisionerClient(c provisionerv1.ProvisionerServiceClient, log *slog.Logger) *provisionerClient {
	return &provisionerClient{c: c, log: log}
}

// Serves asks the provisioner's ListDrivers at most every servedTTL; when
// the provisioner cannot be reached it keeps the last answer.
func (p *provisionerClient) Serves(ctx context.Context, name string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if time.Since(p.fetched) > servedTTL {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := p.c.ListDrivers(cctx, &provisionerv1.ListDriversRequest{})
		cancel()
		if err != nil {
			p.log.Warn("list the provisioner's drivers", "error", err)
		} else {
			p.served = map[string]bool{}
			for _, d := range resp.GetDrivers() {
				if d.GetProvisionerName() != "" {
					p.served[d.GetProvisionerName()] = true
				}
			}
			p.fetched = time.Now()
		}
	}
	return p.served[name]
}

func (p *provisionerClient) Provision(ctx context.Context, claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass) (provisionResult, error) {
	cb, err := kube.EncodeProto(claim)
	if err != nil {
		return provisionResult{}, err
	}
	sb, err := kube.EncodeProto(class)
	if err != nil {
		return provisionResult{}, err
	}
	resp, err := p.c.Provision(ctx, &provisionerv1.ProvisionRequest{
		ClaimNamespace: claim.Namespace, ClaimName: claim.Name, ClaimUid: string(claim.UID),
		Claim: cb, StorageClass: sb,
	})
	if err != nil {
		return provisionResult{}, err
	}
	res := provisionResult{outcome: resp.GetOutcome(), message: resp.GetMessage()}
	if len(resp.GetVolume()) > 0 {
		if res.volume, err = kube.DecodeVolume(resp.GetVolume()); err != nil {
			return provisionResult{}, err
		}
	}
	return res, nil
}
