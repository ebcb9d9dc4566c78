package bench

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/volplane/volplane/pkg/grpcutil"
)

// runDelete measures a deletion burst: N claims are provisioned (their
// class's reclaim policy is Delete) and, once every one is Bound, all are
// deleted at once by Clients goroutines; the run ends when every one of
// their PersistentVolumes is gone and the dev CSI driver holds no volume.
// The provisioning is not measured (a line on the log says how it went).
func runDelete(ctx context.Context, o *Options) error {
	t, err := start(ctx, o, o.system(), o.N)
	if err != nil {
		return err
	}
	defer t.stop()
	t.noProfiles = true
	prov, err := t.measure(ctx, load{n: o.N, clients: o.Clients})
	if err != nil {
		return fmt.Errorf("provision the claims to delete: %w", err)
	}
	t.noProfiles = false
	fmt.Fprintf(o.Log, "provisioned %d volumes: %s\n", o.N, prov.shortLine())
	r, err := t.measureDelete(ctx, o.N)
	if err != nil {
		return err
	}
	r.Print(o.Out)
	return nil
}

// measureDelete deletes the n claims of the run, all Bound to provisioned
// volumes, and waits until each one's PersistentVolume is gone (timing it
// from the claim's delete to the volume's Deleted event) and then until
// the dev CSI driver lists no volume. Counters and CPU times are read
// before the first delete and after the last write.
func (t *trial) measureDelete(ctx context.Context, n int) (*Result, error) {
	conn, err := grpcutil.DialCSI("unix://" + t.csiSock)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	driver := csi.NewControllerClient(conn)
	if left, err := driverVolumes(ctx, driver); err != nil {
		return nil, err
	} else if left != n {
		return nil, fmt.Errorf("the dev CSI driver holds %d volumes before the deletion, want the %d provisioned", left, n)
	}
	tr, err := newGoneTracker(ctx, t.newClient("volplane-bench-tracker"), n)
	if err != nil {
		return nil, err
	}
	defer tr.stop()
	procs := t.procList()
	before, err := t.metrics.snapshot(ctx)
	if err != nil {
		return nil, err
	}
	cpu := sample(procs)
	fmt.Fprintf(t.o.Log, "deleting %d claims and waiting until their volumes are gone...\n", n)
	profiles := t.startProfiles(ctx, load{n: n, clients: t.o.Clients}, n)
	start := time.Now()
	done := make(chan error, 1)
	var deleted atomic.Int64
	go func() {
		done <- parallel(ctx, n, t.o.Clients, func(i int) error {
			tr.sending(i)
			err := t.client.CoreV1().PersistentVolumeClaims(benchNamespace).Delete(ctx, claimName(i), metav1.DeleteOptions{})
			if err == nil {
				deleted.Add(1)
			}
			return err
		})
	}()
	prog := newProgress(n, start)
	prog.done, prog.sent = "volumes gone", "claims deleted"
	window, err := t.waitBurst(ctx, tr, burst{n: n, start: start, done: done, sent: deleted.Load, prog: prog,
		sending: "delete claims", stuck: "only %d of %d volumes gone within %s of the last delete (log: %s)", watch: "volume"})
	if err != nil {
		return nil, err
	}
	empty, err := waitDriverEmpty(ctx, driver, time.Minute)
	if err != nil {
		return nil, err
	}
	lat, _, last := tr.latencies()
	after, err := t.quiesce(ctx)
	if err != nil {
		return nil, err
	}
	cpuAfter := sample(procs)
	if err := profiles(); err != nil {
		fmt.Fprintf(t.o.Log, "profile: %v\n", err)
	}
	r := &Result{
		System: t.o.name(t.sys), Placement: t.o.placement(), Dynamic: true, Deletion: true, Claims: n, CreateWindow: window, Latency: summarize(lat),
		Setup: t.setup, Procs: usage(procs, cpu, cpuAfter), Requests: after.since(before),
		ClusterVolumes: t.setup.Existing.Volumes, ClusterClaims: t.setup.Existing.Claims,
	}
	r.Requests.Watches = r.Requests.Watches.minus(t.baseWatches)
	end := last
	if empty.After(end) {
		end = empty
	}
	r.Elapsed = end.Sub(start)
	r.PerSecond = float64(n) / r.Elapsed.Seconds()
	return r, nil
}

func claimName(i int) string { return fmt.Sprintf("claim-%d", i) }

// newGoneTracker times the deletion of the run's n volumes: from the
// moment claim i's delete is sent (sending) to the watch event that shows
// the volume bound to it Deleted. Which volume is whose is read from
// their claimRefs before the first delete.
func newGoneTracker(ctx context.Context, client kubernetes.Interface, n int) (*tracker, error) {
	list, err := client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	owner := map[string]string{} // volume → claim name
	for _, v := range list.Items {
		if ref := v.Spec.ClaimRef; ref != nil && ref.Namespace == benchNamespace && strings.HasPrefix(ref.Name, "claim-") {
			owner[v.Name] = ref.Name
		}
	}
	if len(owner) != n {
		return nil, fmt.Errorf("%d volumes are bound to the run's claims, want %d", len(owner), n)
	}
	w, err := watchtools.NewRetryWatcherWithContext(ctx, list.ResourceVersion, &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return client.CoreV1().PersistentVolumes().Watch(ctx, opts)
		},
	})
	if err != nil {
		return nil, err
	}
	t := &tracker{w: w, sent: make([]time.Time, n), latency: make([]time.Duration, n), all: make(chan struct{}), closed: make(chan struct{})}
	go func() {
		defer close(t.closed)
		for ev := range w.ResultChan() {
			if ev.Type != watch.Deleted {
				continue
			}
			if v, ok := ev.Object.(*corev1.PersistentVolume); ok && owner[v.Name] != "" {
				t.seen(owner[v.Name], time.Now())
			}
		}
	}()
	return t, nil
}

// driverVolumes counts the volumes the dev CSI driver holds.
func driverVolumes(ctx context.Context, driver csi.ControllerClient) (int, error) {
	count, token := 0, ""
	for {
		resp, err := driver.ListVolumes(ctx, &csi.ListVolumesRequest{StartingToken: token})
		if err != nil {
			return 0, fmt.Errorf("dev CSI driver ListVolumes: %w", err)
		}
		count += len(resp.GetEntries())
		if token = resp.GetNextToken(); token == "" {
			return count, nil
		}
	}
}

// waitDriverEmpty polls the dev CSI driver until it holds no volume and
// returns when it first saw none.
func waitDriverEmpty(ctx context.Context, driver csi.ControllerClient, limit time.Duration) (time.Time, error) {
	deadline := time.Now().Add(limit)
	for {
		left, err := driverVolumes(ctx, driver)
		if err != nil {
			return time.Time{}, err
		}
		if left == 0 {
			return time.Now(), nil
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("every PersistentVolume is gone but the dev CSI driver still holds %d volumes after %s: backing volumes leaked", left, limit)
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
