package kube

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/volplane/volplane/pkg/logging"
)

// DefaultProbeTimeout is how long one probe of the API server may take
// before it counts as failed: an API server that answers slowly under load
// is slow, not gone.
const DefaultProbeTimeout = 15 * time.Second

// APIProbe asks the API server's /readyz at a fixed interval, so that a
// service's readiness can say when the API server is out of reach. /readyz
// is open to every authenticated client (system:public-info-viewer).
//
// A slow answer is an answer: one request at a time, each allowed Timeout,
// and a request counts as failed only when it ends in an error (no
// connection, an HTTP error status, or no answer within Timeout). Healthy
// measures how long the probe has been failing, not how long ago it last
// succeeded, so that an API server that takes seconds to answer under load
// is never reported as gone, while one that refuses connections is within
// the grace, and one that hangs within Timeout plus the grace.
type APIProbe struct {
	// Timeout bounds one request; zero means DefaultProbeTimeout. Set it
	// before Run.
	Timeout time.Duration
	// Outage, when set, is told each probe's outcome, so that the log
	// says once when the API server stops answering ("API server
	// unreachable") and once when it answers again (NewAPIOutage). Set it
	// before Run.
	Outage *logging.Outage

	client  kubernetes.Interface
	mu      sync.Mutex
	failing time.Time // when the probe began failing; zero while it answers
	err     error     // the last failure
}

// NewAPIOutage is the Outage an APIProbe reports to, on log: client-go
// retries an unreachable API server quietly (its messages are at klog's
// V(2)), so this is where an operator sees the outage.
func NewAPIOutage(log *slog.Logger) *logging.Outage {
	return logging.NewOutage(log, "API server", "probe", "/readyz")
}

// NewAPIProbe returns a probe of client's API server; it counts as
// answering at creation.
func NewAPIProbe(client kubernetes.Interface) *APIProbe {
	return &APIProbe{client: client}
}

// Run probes every interval (one request at a time) until ctx ends. A
// client without a REST client (a fake clientset) always answers.
func (p *APIProbe) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		err := p.probe(ctx)
		if ctx.Err() != nil {
			return
		}
		p.record(err, time.Now())
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

func (p *APIProbe) probe(ctx context.Context) error {
	rc := p.client.Discovery().RESTClient()
	if rc == nil {
		return nil
	}
	timeout := p.Timeout
	if timeout <= 0 {
		timeout = DefaultProbeTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return rc.Get().AbsPath("/readyz").Do(ctx).Error()
}

// record notes the outcome of a probe that ended at now.
func (p *APIProbe) record(err error, now time.Time) {
	if p.Outage != nil {
		if err == nil {
			p.Outage.Recovered()
		} else {
			p.Outage.Failed(err)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case err == nil:
		p.failing, p.err = time.Time{}, nil
	case p.failing.IsZero():
		p.failing, p.err = now, err
	default:
		p.err = err
	}
}

// Check is Healthy as an error, for a readiness check: nil while the API
// server answers, else what went wrong once it has been failing for
// longer than grace.
func (p *APIProbe) Check(grace time.Duration) error {
	ok, err := p.Healthy(grace)
	switch {
	case ok:
		return nil
	case err != nil:
		return fmt.Errorf("failing for over %s: %w", grace, err)
	default:
		return fmt.Errorf("failing for over %s", grace)
	}
}

// Healthy reports whether the API server answers: false once the probe
// has been failing for longer than grace, with the last error.
func (p *APIProbe) Healthy(grace time.Duration) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.failing.IsZero() && time.Since(p.failing) > grace {
		return false, p.err
	}
	return true, nil
}
