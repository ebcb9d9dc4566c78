package ha

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/volplane/volplane/internal/devcsi"
	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
	"github.com/volplane/volplane/test/harness/e2e"
)

// phases watches the API (not volplane) for every phase of the volumes and
// claims of namespace ns and reports a flip: a volume moved from Released
// or Failed back to Bound, from Bound to Available or Pending, or a claim
// moved from Bound back to Pending.
type phases struct {
	mu    sync.Mutex
	last  map[types.UID]string
	flips []string
}

func watchPhases(t *testing.T, ns string) *phases {
	t.Helper()
	p := &phases{last: map[types.UID]string{}}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	follow := func(open func(context.Context) (watch.Interface, error)) {
		for ctx.Err() == nil {
			w, err := open(ctx)
			if err != nil {
				time.Sleep(200 * time.Millisecond) // the API server may be down
				continue
			}
			for ev := range w.ResultChan() {
				switch o := ev.Object.(type) {
				case *corev1.PersistentVolume:
					if strings.HasPrefix(o.Name, ns) {
						p.see("pv/"+o.Name, o.UID, string(o.Status.Phase))
					}
				case *corev1.PersistentVolumeClaim:
					p.see("pvc/"+o.Name, o.UID, string(o.Status.Phase))
				}
			}
			w.Stop()
		}
	}
	go follow(func(ctx context.Context) (watch.Interface, error) {
		return client.CoreV1().PersistentVolumes().Watch(ctx, metav1.ListOptions{})
	})
	go follow(func(ctx context.Context) (watch.Interface, error) {
		return client.CoreV1().PersistentVolumeClaims(ns).Watch(ctx, metav1.ListOptions{})
	})
	return p
}

var flip = map[[2]string]bool{
	{"pv/Released", "Bound"}: true, {"pv/Failed", "Bound"}: true,
	{"pv/Bound", "Available"}: true, {"pv/Bound", "Pending"}: true,
	{"pvc/Bound", "Pending"}: true,
}

func (p *phases) see(key string, uid types.UID, phase string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	kind := key[:strings.Index(key, "/")]
	if old := p.last[uid]; old != "" && old != phase && flip[[2]string{kind + "/" + old, phase}] {
		p.flips = append(p.flips, fmt.Sprintf("%s: %s -> %s", key, old, phase))
	}
	p.last[uid] = phase
}

func (p *phases) check(t *testing.T) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.flips) > 0 {
		t.Errorf("phases flipped back: %v", p.flips)
	}
}

// createPairs creates count Retain volumes and claims of class cls.
func createPairs(t *testing.T, ns, cls, prefix string, count int) []string {
	t.Helper()
	var names []string
	for i := range count {
		name := fmt.Sprintf("%s-%03d", prefix, i)
		_, err := client.CoreV1().PersistentVolumes().Create(context.Background(), &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: ns + "-" + name},
			Spec: corev1.PersistentVolumeSpec{
				Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
				AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
				StorageClassName:              cls,
				PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/tmp/volplane-ha"}},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := client.CoreV1().PersistentVolumeClaims(ns).Create(context.Background(), e2e.Claim(ns, name, "1Gi", cls), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		names = append(names, name)
	}
	return names
}

// allBound waits until every named claim is Bound.
func allBound(t *testing.T, ns string, names []string, timeout time.Duration) {
	t.Helper()
	e2e.Eventually(t, timeout, func() string {
		list, err := client.CoreV1().PersistentVolumeClaims(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return err.Error()
		}
		bound := map[string]bool{}
		for _, c := range list.Items {
			bound[c.Name] = c.Status.Phase == corev1.ClaimBound
		}
		n := 0
		for _, name := range names {
			if bound[name] {
				n++
			}
		}
		if n != len(names) {
			return fmt.Sprintf("%d of %d claims Bound", n, len(names))
		}
		return ""
	})
}

// active returns the watcher the binder streams from (the one with a
// subscriber), and the other one.
func active(t *testing.T) (*service, *service) {
	t.Helper()
	var on, off *service
	e2e.Eventually(t, 30*time.Second, func() string {
		on, off = nil, nil
		for i, w := range watchers {
			cc, err := cl.Dial(w.addr)
			if err != nil {
				return err.Error()
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			st, err := watcherv1.NewWatcherServiceClient(cc).GetStatus(ctx, &watcherv1.GetStatusRequest{})
			cancel()
			cc.Close()
			if err != nil {
				continue // stopped
			}
			if st.Subscribers > 0 {
				on, off = w, watchers[1-i]
			}
		}
		if on == nil {
			return "no watcher has the binder as a subscriber"
		}
		return ""
	})
	return on, off
}

// The binder has two watchers; the one it streams from is stopped while
// claims are created and deleted: the binder moves to the other, claims
// keep binding, Released volumes stay Released, and no phase flips.
func TestBinderFailsOverBetweenWatchers(t *testing.T) {
	ns := e2e.Namespace(t, client)
	e2e.CreateClass(t, client, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: ns}, Provisioner: "kubernetes.io/no-provisioner"})
	ph := watchPhases(t, ns)

	first := createPairs(t, ns, ns, "a", 20)
	allBound(t, ns, first, time.Minute)

	// Claims bind to any free volume of the class, not the one of the same
	// name: follow each deleted claim's volumeName.
	var released []string
	for _, name := range first[:5] {
		c, err := client.CoreV1().PersistentVolumeClaims(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		released = append(released, c.Spec.VolumeName)
	}

	on, off := active(t)
	t.Logf("binder streams from %s; stopping it", on.name)
	if err := on.stop(); err != nil {
		t.Fatalf("%s: %v", on.name, err)
	}
	t.Cleanup(func() {
		on.start()
		waitHealth(t, time.Minute, healthpb.HealthCheckResponse_SERVING, on)
	})
	// Deletions and new pairs while the binder moves.
	for _, name := range first[:5] {
		if err := client.CoreV1().PersistentVolumeClaims(ns).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	second := createPairs(t, ns, ns, "b", 20)
	allBound(t, ns, second, time.Minute)
	for _, name := range released {
		e2e.VolumePhase(t, client, name, corev1.VolumeReleased, time.Minute)
	}
	if now, _ := active(t); now != off {
		t.Fatalf("the binder streams from %s, want %s", now.name, off.name)
	}
	waitHealth(t, 30*time.Second, healthpb.HealthCheckResponse_SERVING, bind)
	// Released volumes stay Released (Retain) through a resync's worth of
	// time on the new stream.
	e2e.Consistently(t, 3*time.Second, func() string {
		for _, name := range released {
			v, err := client.CoreV1().PersistentVolumes().Get(context.Background(), name, metav1.GetOptions{})
			if err != nil {
				return err.Error()
			}
			if v.Status.Phase != corev1.VolumeReleased {
				return fmt.Sprintf("volume %s is %s, want Released", v.Name, v.Status.Phase)
			}
		}
		return ""
	})
	ph.check(t)
}

// dynamicClass creates a Delete class of the dev CSI driver.
func dynamicClass(t *testing.T, name string) {
	t.Helper()
	del := corev1.PersistentVolumeReclaimDelete
	e2e.CreateClass(t, client, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: devcsi.DefaultName, ReclaimPolicy: &del})
}

// etcd (volplane's and, here, the API server's) is down for longer than
// the lease TTL (10s): no service's Run returns, the provisioner and the
// reclaimer are NOT_SERVING meanwhile, and once etcd is back on its data
// they serve again, a claim made during the outage is provisioned and
// bound, and the volume of a claim deleted afterwards is deleted.
func TestEtcdOutage(t *testing.T) {
	ns := e2e.Namespace(t, client)
	dynamicClass(t, ns)
	if _, err := client.CoreV1().PersistentVolumeClaims(ns).Create(context.Background(), e2e.Claim(ns, "before", "1Mi", ns), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	before := e2e.ClaimPhase(t, client, ns, "before", corev1.ClaimBound, time.Minute)

	logged := logMark(t)
	etcd := cl.Env.Etcd()
	etcd.Stop()
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			_ = etcd.Restart()
		}
	})
	waitHealth(t, 30*time.Second, healthpb.HealthCheckResponse_NOT_SERVING, prov, recl)
	// Past the lease TTL with nobody giving up.
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		running(t, prov, recl, bind, watchers[0], watchers[1])
		time.Sleep(500 * time.Millisecond)
	}
	if err := etcd.Restart(); err != nil {
		t.Fatal(err)
	}
	restarted = true
	waitHealth(t, 2*time.Minute, healthpb.HealthCheckResponse_SERVING, prov, recl, bind, watchers[0], watchers[1])
	running(t, prov, recl, bind, watchers[0], watchers[1])
	// The replicas with an etcd session said so once each way.
	loggedOnce(t, logged, "etcd", prov, recl, bind)

	if _, err := client.CoreV1().PersistentVolumeClaims(ns).Create(context.Background(), e2e.Claim(ns, "after", "1Mi", ns), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e2e.ClaimPhase(t, client, ns, "after", corev1.ClaimBound, time.Minute)
	if err := client.CoreV1().PersistentVolumeClaims(ns).Delete(context.Background(), "before", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e2e.Eventually(t, time.Minute, func() string {
		if _, err := client.CoreV1().PersistentVolumes().Get(context.Background(), before.Spec.VolumeName, metav1.GetOptions{}); err == nil {
			return "volume " + before.Spec.VolumeName + " of the deleted claim is still there"
		}
		return ""
	})
}

// kube-apiserver is down (a minute by default; VOLPLANE_E2E_API_OUTAGE
// sets another duration): every service goes NOT_SERVING and none exits;
// after it is back they serve again and claims bind.
func TestAPIServerOutage(t *testing.T) {
	outage := time.Minute
	if s := os.Getenv("VOLPLANE_E2E_API_OUTAGE"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("VOLPLANE_E2E_API_OUTAGE=%s: %v", s, err)
		}
		outage = d
	}
	ns := e2e.Namespace(t, client)
	dynamicClass(t, ns)
	all := []*service{watchers[0], watchers[1], prov, recl, bind}

	logged := logMark(t)
	cl.Env.StopAPIServer()
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			_ = cl.Env.StartAPIServer(context.Background())
		}
	})
	start := time.Now()
	waitHealth(t, 30*time.Second, healthpb.HealthCheckResponse_NOT_SERVING, all...)
	for time.Since(start) < outage {
		running(t, all...)
		time.Sleep(time.Second)
	}
	if err := cl.Env.StartAPIServer(context.Background()); err != nil {
		t.Fatal(err)
	}
	restarted = true
	// A reflector retries with a backoff of up to 30s.
	waitHealth(t, 2*time.Minute, healthpb.HealthCheckResponse_SERVING, all...)
	running(t, all...)
	// Each service said so once when the outage began and once when it
	// ended, not once per retry.
	loggedOnce(t, logged, "API server", all...)
	if _, err := client.CoreV1().PersistentVolumeClaims(ns).Create(context.Background(), e2e.Claim(ns, "after", "1Mi", ns), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e2e.ClaimPhase(t, client, ns, "after", corev1.ClaimBound, time.Minute)
}

// logMark is where the services' log ends now.
func logMark(t *testing.T) int64 {
	t.Helper()
	st, err := os.Stat(cl.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

// loggedOnce checks that, in the services' log from offset from on, each
// of services logged "<what> unreachable" once and, within a minute,
// "<what> reachable again" once (logging.Outage): an outage an operator
// sees at the default level, without a line per retry.
func loggedOnce(t *testing.T, from int64, what string, services ...*service) {
	t.Helper()
	count := func() (map[string][2]int, []string) {
		b, err := os.ReadFile(cl.LogPath)
		if err != nil {
			t.Fatal(err)
		}
		counts := map[string][2]int{}
		var lines []string
		for _, l := range strings.Split(string(b[from:]), "\n") {
			for i, msg := range []string{what + " unreachable", what + " reachable again"} {
				if strings.Contains(l, "msg=\""+msg+"\"") {
					for _, s := range services {
						if strings.Contains(l, "component="+s.name+" ") {
							c := counts[s.name]
							c[i]++
							counts[s.name] = c
							lines = append(lines, l)
						}
					}
				}
			}
		}
		return counts, lines
	}
	e2e.Eventually(t, time.Minute, func() string {
		counts, _ := count()
		for _, s := range services {
			if counts[s.name][1] == 0 {
				return s.name + " has not logged " + what + " reachable again"
			}
		}
		return ""
	})
	counts, lines := count()
	t.Logf("the outage in the services' log:\n%s", strings.Join(lines, "\n"))
	for _, s := range services {
		if c := counts[s.name]; c != [2]int{1, 1} {
			t.Errorf("%s logged %q %d times and %q %d times, want once each", s.name, what+" unreachable", c[0], what+" reachable again", c[1])
		}
	}
}
