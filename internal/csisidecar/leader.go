package csisidecar

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"

	"github.com/volplane/volplane/pkg/sidecar"
)

// leaderHealthTimeout is how long past a missed renewal the
// leader-election health check fails (csi-lib-utils' default).
const leaderHealthTimeout = 20 * time.Second

// ErrLostLeadership is Run's error when the leader lock is lost: the
// registration is deleted and the sidecar exits, as csi-provisioner does.
var ErrLostLeadership = errors.New("lost the leader lock")

// lockName is the leader lock csi-provisioner v6.3.0 takes for a driver:
// the driver name with "/" replaced, sanitized as csi-lib-utils does.
func lockName(driver string) string {
	return sanitizeName(strings.ReplaceAll(driver, "/", "-"))
}

var notNameChars = regexp.MustCompile("[^a-zA-Z0-9-]")

// sanitizeName is csi-lib-utils' rule for lock names and identities:
// every character but letters, digits and '-' becomes '-', and a
// trailing '-' gets an 'X'.
func sanitizeName(name string) string {
	name = notNameChars.ReplaceAllString(name, "-")
	if strings.HasSuffix(name, "-") {
		name += "X"
	}
	return name
}

// leaderNamespace is csi-lib-utils' namespace of the lock: the flag, else
// $POD_NAMESPACE, else the ServiceAccount's namespace file, else default.
func leaderNamespace(flag string) string {
	if flag != "" {
		return flag
	}
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	if b, err := os.ReadFile(saNamespaceFile); err == nil {
		if ns := strings.TrimSpace(string(b)); ns != "" {
			return ns
		}
	}
	return "default"
}

// leader runs a function only while this sidecar holds the driver's
// leader lock.
type leader struct {
	client  kubernetes.Interface
	opts    ProvisionerFlags
	release bool // ReleaseLeaderElectionOnExit
	health  *leaderelection.HealthzAdaptor
}

// newLeader prepares the lock; mux, when set, gets the lock's health
// check at /healthz/leader-election as csi-lib-utils adds it.
func newLeader(client kubernetes.Interface, o Options, mux *http.ServeMux) *leader {
	l := &leader{client: client, opts: o.Provisioner, release: sidecar.GateEnabled(o.Settings.FeatureGates, sidecar.GateReleaseLeaderElectionOnExit)}
	l.health = leaderelection.NewLeaderHealthzAdaptor(leaderHealthTimeout)
	if mux != nil {
		mux.HandleFunc("/healthz/leader-election", func(w http.ResponseWriter, r *http.Request) {
			if err := l.health.Check(r); err != nil {
				http.Error(w, fmt.Sprintf("internal server error: %v", err), http.StatusInternalServerError)
				return
			}
			fmt.Fprint(w, "ok")
		})
	}
	return l
}

// run takes the lock for driver and runs lead while holding it. lead's
// context ends when ctx ends or the lock is lost; the lock is given up
// (with ReleaseLeaderElectionOnExit) or left to expire only after lead
// has returned, so the registration is gone before another sidecar can
// lead. It returns nil when ctx ended, ErrLostLeadership when the lock
// was lost.
func (l *leader) run(ctx context.Context, driver string, lead func(context.Context)) error {
	identity, err := podName()
	if err != nil {
		return fmt.Errorf("leader election identity: %w", err)
	}
	ns := leaderNamespace(l.opts.LeaderElectionNamespace)
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	defer broadcaster.Shutdown()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: l.client.CoreV1().Events(ns)})
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: lockName(driver) + "/" + identity})
	lock, err := resourcelock.NewWithLabels(resourcelock.LeasesResourceLock, ns, lockName(driver), l.client.CoreV1(), l.client.CoordinationV1(),
		resourcelock.ResourceLockConfig{Identity: sanitizeName(identity), EventRecorder: recorder}, l.opts.LeaderElectionLabels)
	if err != nil {
		return err
	}
	// The elector's context ends after lead has returned (or at once if
	// this sidecar never led).
	electorCtx, stopElector := context.WithCancel(context.WithoutCancel(ctx))
	defer stopElector()
	var led atomic.Bool
	var leading sync.WaitGroup
	leading.Add(1)
	go func() {
		<-ctx.Done()
		if led.Load() {
			leading.Wait()
		}
		stopElector()
	}()
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, LeaseDuration: l.opts.LeaseDuration, RenewDeadline: l.opts.RenewDeadline, RetryPeriod: l.opts.RetryPeriod,
		ReleaseOnCancel: l.release, WatchDog: l.health, Name: lockName(driver),
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(lctx context.Context) {
				led.Store(true)
				defer leading.Done()
				merged, cancel := context.WithCancel(lctx)
				defer cancel()
				stop := context.AfterFunc(ctx, cancel)
				defer stop()
				lead(merged)
			},
			OnStoppedLeading: func() {},
		},
	})
	if err != nil {
		return fmt.Errorf("--leader-election: %w", err)
	}
	le.Run(electorCtx)
	if led.Load() {
		leading.Wait()
	}
	if ctx.Err() != nil {
		return nil
	}
	return fmt.Errorf("%w %s/%s", ErrLostLeadership, ns, lockName(driver))
}
