package kube

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
)

// APIProbe asks the API server's /readyz at a fixed interval, so that a
// service's readiness can say when the API server is out of reach. /readyz
// is open to every authenticated client (system:public-info-viewer).
type APIProbe struct {
	client kubernetes.Interface
	mu     sync.Mutex
	lastOK time.Time
	err    error
}

// NewAPIProbe returns a probe of client's API server; it counts as answered
// at creation.
func NewAPIProbe(client kubernetes.Interface) *APIProbe {
	return &APIProbe{client: client, lastOK: time.Now()}
}

// Run probes every interval until ctx ends. A client without a REST client
// (a fake clientset) always answers.
func (p *APIProbe) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		err := p.probe(ctx, interval)
		if ctx.Err() != nil {
			return
		}
		p.mu.Lock()
		p.err = err
		if err == nil {
			p.lastOK = time.Now()
		}
		p.mu.Unlock()
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

func (p *APIProbe) probe(ctx context.Context, timeout time.Duration) error {
	rc := p.client.Discovery().RESTClient()
	if rc == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, max(timeout, 2*time.Second))
	defer cancel()
	return rc.Get().AbsPath("/readyz").Do(ctx).Error()
}

// Check is Healthy as an error, for a readiness check: nil when the API
// server answered within the last grace, else what went wrong.
func (p *APIProbe) Check(grace time.Duration) error {
	ok, err := p.Healthy(grace)
	switch {
	case ok:
		return nil
	case err != nil:
		return fmt.Errorf("no answer for over %s: %w", grace, err)
	default:
		return fmt.Errorf("no answer for over %s", grace)
	}
}

// Healthy reports whether the API server answered within the last grace,
// and the last error when it did not.
func (p *APIProbe) Healthy(grace time.Duration) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if time.Since(p.lastOK) > grace {
		return false, p.err
	}
	return true, nil
}
