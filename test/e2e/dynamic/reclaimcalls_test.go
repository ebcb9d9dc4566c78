package dynamic

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"

	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
	"github.com/volplane/volplane/test/harness/e2e"
)

// reclaimCalls counts the Reclaim calls the reclaimer served, by volume
// and by whether they succeeded. It counts them from the line the
// reclaimer's gRPC call log writes once per finished call, whatever its
// level: at debug level (this harness's) that line carries the request,
// so the volume it names.
type reclaimCalls struct {
	mu     sync.Mutex
	ok     map[string]int // volume → calls answered OK
	failed map[string]int // volume → calls answered with an error
}

// wrap returns h counting every Reclaim call it logs.
func (c *reclaimCalls) wrap(h slog.Handler) slog.Handler {
	return countingHandler{Handler: h, calls: c}
}

// of returns the volume's successful and failed calls so far.
func (c *reclaimCalls) of(volume string) (ok, failed int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ok[volume], c.failed[volume]
}

func (c *reclaimCalls) add(volume string, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ok == nil {
		c.ok, c.failed = map[string]int{}, map[string]int{}
	}
	if ok {
		c.ok[volume]++
	} else {
		c.failed[volume]++
	}
}

// countingHandler passes every record on to Handler, and counts in calls
// those that end a Reclaim call.
type countingHandler struct {
	slog.Handler
	calls *reclaimCalls
}

// Enabled is true at debug level, where the call log adds the request.
func (h countingHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h countingHandler) Handle(ctx context.Context, r slog.Record) error {
	var method, code, request string
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "method":
			method = a.Value.String()
		case "code":
			code = a.Value.String()
		case "request":
			request = a.Value.String()
		}
		return true
	})
	if method == reclaimerv1.ReclaimerService_Reclaim_FullMethodName && request != "" {
		var req struct {
			VolumeName string `json:"volumeName"`
		}
		if json.Unmarshal([]byte(request), &req) == nil {
			h.calls.add(req.VolumeName, code == "OK")
		}
	}
	if !h.Handler.Enabled(ctx, r.Level) {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h countingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return countingHandler{Handler: h.Handler.WithAttrs(as), calls: h.calls}
}

func (h countingHandler) WithGroup(name string) slog.Handler {
	return countingHandler{Handler: h.Handler.WithGroup(name), calls: h.calls}
}

// Issue 40 item 4: the binder hands each released volume to the reclaimer
// once. Its later changes (Released written, the finalizer removed, the PV
// deleted: each a watch event and a sync of the volume) hand it over no
// more; only a failed call is made again.
func TestOneReclaimCallPerReleasedVolume(t *testing.T) {
	const n = 8
	ns := e2e.Namespace(t, cluster.client)
	sc := class(t)
	for i := range n {
		createClaim(t, ns, fmt.Sprintf("data-%d", i), "1Gi", sc.Name)
	}
	var pvs []*corev1.PersistentVolume
	for i := range n {
		c, pv := bound(t, ns, fmt.Sprintf("data-%d", i))
		deleteClaim(t, c)
		pvs = append(pvs, pv)
	}
	for _, pv := range pvs {
		deleted(t, pv)
		ok, failed := cluster.reclaims.of(pv.Name)
		if ok != 1 {
			t.Errorf("volume %s: %d Reclaim calls answered OK (and %d failed), want 1", pv.Name, ok, failed)
		}
		if failed != 0 {
			t.Logf("volume %s: %d Reclaim calls failed and were made again", pv.Name, failed)
		}
	}
}
