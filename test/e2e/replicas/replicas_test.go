// Package replicas tests several binder replicas sharing one cluster: they
// split the claims by their etcd membership, never bind a volume twice, and
// a replica that leaves hands its claims to the others. Here etcd serves
// its clients over mutual TLS only, as in production: every service
// connects with a client certificate.
package replicas

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	startup "github.com/volplane/volplane/pkg/replica"
	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
	"github.com/volplane/volplane/services/binder"
	"github.com/volplane/volplane/services/watcher"
	"github.com/volplane/volplane/test/harness/devenv"
	"github.com/volplane/volplane/test/harness/e2e"
)

var (
	env         *devenv.Env
	client      kubernetes.Interface
	watcherAddr string
	// cl hands out the services' certificates and holds their log.
	cl *e2e.Cluster
)

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(0)
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var err error
	// Privileged containers allowed, as in every real cluster (kubeadm's
	// and `make cluster`'s kube-apiserver): the dev CSI driver's node
	// plugin is one (deploy/drivers/volplane-csi).
	cl, err = e2e.StartCluster(ctx, "e2e/replicas", e2e.Options{EtcdTLS: true, APIServerArgs: []string{"--allow-privileged=true"}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e/replicas:", err)
		return 1
	}
	defer cl.Stop()
	env, client = cl.Env, cl.Client
	watcherAddr, _ = devenv.FreeAddr()
	if err := startWatcher(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := m.Run()
	if code != 0 {
		cl.DumpLogs(os.Stderr)
	}
	cancel()
	if err := stopWatcher(); err != nil {
		fmt.Fprintln(os.Stderr, "watcher:", err)
		return 1
	}
	if !cl.NoSecretsLogged("e2e/replicas") {
		return 1
	}
	return code
}

// The watcher runs in this process; tests may restart it.
var watcherProc struct {
	cancel context.CancelFunc
	done   chan error
}

func startWatcher() error {
	ctx, cancel := context.WithCancel(context.Background())
	watcherProc.cancel, watcherProc.done = cancel, make(chan error, 1)
	go func() {
		watcherProc.done <- watcher.Run(ctx, watcher.Options{Kubeconfig: env.Kubeconfig, Listen: watcherAddr, TLS: cl.TLS("watcher"), Logger: logger("watcher")})
	}()
	return cl.WaitServing(ctx, watcherAddr, time.Minute)
}

func stopWatcher() error {
	watcherProc.cancel()
	return <-watcherProc.done
}

func logger(name string) *slog.Logger {
	return cl.Logger(name, slog.LevelInfo)
}

type replica struct {
	id     string
	addr   string
	cancel context.CancelFunc
	done   chan error
	client binderv1.BinderServiceClient
}

func startBinder(t *testing.T, id string) *replica {
	t.Helper()
	addr, err := devenv.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &replica{id: id, addr: addr, cancel: cancel, done: make(chan error, 1)}
	go func() {
		r.done <- binder.Run(ctx, binder.Options{
			Options:        startup.Options{Kubeconfig: env.Kubeconfig, EtcdEndpoints: env.EtcdEndpoints, Etcd: env.EtcdSecurity, Listen: addr, TLS: cl.TLS("binder"), MemberID: id, Logger: logger(id)},
			WatcherAddress: watcherAddr,
			ResyncPeriod:   10 * time.Minute,
		})
	}()
	t.Cleanup(r.stop)
	if err := cl.WaitServing(context.Background(), addr, time.Minute); err != nil {
		t.Fatal(err)
	}
	cc, err := cl.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	r.client = binderv1.NewBinderServiceClient(cc)
	return r
}

func (r *replica) stop() {
	if r.cancel == nil {
		return
	}
	r.cancel()
	<-r.done
	r.cancel = nil
}

func (r *replica) status(t *testing.T) *binderv1.GetStatusResponse {
	t.Helper()
	st, err := r.client.GetStatus(context.Background(), &binderv1.GetStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func eventually(t *testing.T, timeout time.Duration, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		why := cond()
		if why == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", timeout, why)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// newNamespace creates a namespace named after base and this run.
func newNamespace(t *testing.T, base string) string {
	t.Helper()
	name := fmt.Sprintf("%s-%d", base, time.Now().UnixNano()%1000000)
	if _, err := client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return name
}

// createPairs creates count volumes and count claims at once.
func createPairs(t *testing.T, ns, prefix string, count int) {
	t.Helper()
	cls := ns // a class per test: volumes never cross between tests
	var wg sync.WaitGroup
	errs := make(chan error, 2*count)
	for i := range count {
		wg.Add(2)
		go func() {
			defer wg.Done()
			_, err := client.CoreV1().PersistentVolumes().Create(context.Background(), &corev1.PersistentVolume{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%s-pv-%03d", ns, prefix, i)},
				Spec: corev1.PersistentVolumeSpec{
					Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
					AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
					StorageClassName:              cls,
					PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/tmp/x"}},
				},
			}, metav1.CreateOptions{})
			if err != nil {
				errs <- err
			}
		}()
		go func() {
			defer wg.Done()
			_, err := client.CoreV1().PersistentVolumeClaims(ns).Create(context.Background(), &corev1.PersistentVolumeClaim{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-claim-%03d", prefix, i)},
				Spec: corev1.PersistentVolumeClaimSpec{
					AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					StorageClassName: &cls,
					Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
				},
			}, metav1.CreateOptions{})
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// allBound waits until every claim in ns is Bound and checks that the
// bindings are one to one and agree on both sides.
func allBound(t *testing.T, ns string, want int) {
	t.Helper()
	eventually(t, 2*time.Minute, func() string {
		claims, err := client.CoreV1().PersistentVolumeClaims(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return err.Error()
		}
		bound := 0
		for _, c := range claims.Items {
			if c.Status.Phase == corev1.ClaimBound {
				bound++
			}
		}
		if bound != want {
			return fmt.Sprintf("%d of %d claims Bound", bound, want)
		}
		return ""
	})
	claims, _ := client.CoreV1().PersistentVolumeClaims(ns).List(context.Background(), metav1.ListOptions{})
	volumes, _ := client.CoreV1().PersistentVolumes().List(context.Background(), metav1.ListOptions{})
	byName := map[string]corev1.PersistentVolume{}
	for _, v := range volumes.Items {
		byName[v.Name] = v
	}
	used := map[string]string{}
	for _, c := range claims.Items {
		if other, ok := used[c.Spec.VolumeName]; ok {
			t.Fatalf("volume %s bound to %s and %s", c.Spec.VolumeName, other, c.Name)
		}
		used[c.Spec.VolumeName] = c.Name
		v := byName[c.Spec.VolumeName]
		if v.Spec.ClaimRef == nil || v.Spec.ClaimRef.UID != c.UID || v.Status.Phase != corev1.VolumeBound {
			t.Fatalf("claim %s -> %s, but the volume's claimRef is %v (phase %s)", c.Name, v.Name, v.Spec.ClaimRef, v.Status.Phase)
		}
	}
}

func TestReplicasShareTheWorkAndTakeOver(t *testing.T) {
	a := startBinder(t, "binder-a")
	b := startBinder(t, "binder-b")
	eventually(t, 30*time.Second, func() string {
		if sa, sb := a.status(t), b.status(t); len(sa.Members) != 2 || len(sb.Members) != 2 {
			return fmt.Sprintf("members: a sees %v, b sees %v", sa.Members, sb.Members)
		}
		return ""
	})

	ns := newNamespace(t, "replicas")
	createPairs(t, ns, "first", 150)
	allBound(t, ns, 150)
	sa, sb := a.status(t), b.status(t)
	t.Logf("binds: %s %d, %s %d", a.id, sa.BindsTotal, b.id, sb.BindsTotal)
	if sa.BindsTotal == 0 || sb.BindsTotal == 0 || sa.BindsTotal+sb.BindsTotal != 150 {
		t.Fatalf("binds a=%d b=%d: want both replicas to bind, 150 in total", sa.BindsTotal, sb.BindsTotal)
	}

	// Either replica takes a sync request for any object: the one that
	// does not own it passes it on.
	for _, r := range []*replica{a, b} {
		for i := range 150 {
			req := &binderv1.SyncClaimRequest{Namespace: ns, Name: fmt.Sprintf("first-claim-%03d", i)}
			if _, err := r.client.SyncClaim(context.Background(), req); err != nil {
				t.Fatalf("SyncClaim %s via %s: %v", req.Name, r.id, err)
			}
		}
		vreq := &binderv1.SyncVolumeRequest{Name: fmt.Sprintf("%s-first-pv-%03d", ns, 7)}
		if _, err := r.client.SyncVolume(context.Background(), vreq); err != nil {
			t.Fatalf("SyncVolume via %s: %v", r.id, err)
		}
	}

	// b leaves (its lease is revoked on the way out): a owns everything.
	b.stop()
	eventually(t, 30*time.Second, func() string {
		if st := a.status(t); len(st.Members) != 1 {
			return fmt.Sprintf("a still sees members %v", st.Members)
		}
		return ""
	})
	createPairs(t, ns, "second", 50)
	allBound(t, ns, 200)
}
