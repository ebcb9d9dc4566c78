package dynamic

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/replica"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	"github.com/volplane/volplane/services/provisioner"
	"github.com/volplane/volplane/services/watcher"
	"github.com/volplane/volplane/test/harness/e2e"
)

// streamStaleAfter is the stream-fed provisioner's --watcher-stale-after
// here: short, so that a stopped watcher shows within a test's patience.
const streamStaleAfter = 2 * time.Second

// streamProvisioner is a provisioner replica fed by a watcher of its own
// (--watcher-address), which a test can stop, with the requests it sends
// to the API server and the messages it logs recorded.
type streamProvisioner struct {
	addr        string
	stopWatcher func()
	requests    *apiRequests
	logs        *logRecorder
}

// apiRequests counts the API server requests of a client by method and
// path.
type apiRequests struct {
	mu sync.Mutex
	n  map[string]int
}

func (a *apiRequests) count(method, path string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n[method+" "+path]
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// claimsList is the path of a list of every claim in the cluster.
const claimsList = "/api/v1/persistentvolumeclaims"

func claimPath(c *corev1.PersistentVolumeClaim) string {
	return "/api/v1/namespaces/" + c.Namespace + "/persistentvolumeclaims/" + c.Name
}

// logRecorder is a slog.Handler that records every message and passes the
// records on.
type logRecorder struct {
	next slog.Handler
	rec  *recorded
}

type recorded struct {
	mu   sync.Mutex
	msgs []string
}

func (h *logRecorder) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }
func (h *logRecorder) Handle(ctx context.Context, r slog.Record) error {
	h.rec.mu.Lock()
	h.rec.msgs = append(h.rec.msgs, r.Message)
	h.rec.mu.Unlock()
	return h.next.Handle(ctx, r)
}
func (h *logRecorder) WithAttrs(a []slog.Attr) slog.Handler {
	return &logRecorder{next: h.next.WithAttrs(a), rec: h.rec}
}
func (h *logRecorder) WithGroup(n string) slog.Handler {
	return &logRecorder{next: h.next.WithGroup(n), rec: h.rec}
}

// count is how many messages so far start with prefix.
func (h *logRecorder) count(prefix string) int {
	h.rec.mu.Lock()
	defer h.rec.mu.Unlock()
	n := 0
	for _, m := range h.rec.msgs {
		if strings.HasPrefix(m, prefix) {
			n++
		}
	}
	return n
}

// The provisioner's messages when its stream-fed cache turns current and
// when it stops being current (services/provisioner/stream.go).
const (
	logCurrent    = "claim and class cache current"
	logNotCurrent = "claim and class cache not current"
)

// startStreamProvisioner runs a watcher and a provisioner replica fed by
// it, serving the dev driver under the provisioner name name, and waits
// until the provisioner's cache is current.
func startStreamProvisioner(t *testing.T, name string) *streamProvisioner {
	t.Helper()
	sp := &streamProvisioner{addr: freeAddr(), requests: &apiRequests{n: map[string]int{}},
		logs: &logRecorder{next: testLogger("provisioner-stream").Handler(), rec: &recorded{}}}
	watcherAddr := freeAddr()
	wctx, stopW := context.WithCancel(context.Background())
	wdone := make(chan error, 1)
	go func() {
		wdone <- watcher.Run(wctx, watcher.Options{Kubeconfig: cluster.env.Kubeconfig, Listen: watcherAddr, TLS: cluster.e2e.TLS("watcher"), Logger: testLogger("watcher-stream")})
	}()
	sp.stopWatcher = sync.OnceFunc(func() {
		stopW()
		if err := <-wdone; err != nil {
			t.Errorf("watcher: %v", err)
		}
	})
	t.Cleanup(sp.stopWatcher)

	cfg := rest.CopyConfig(cluster.env.RESTConfig)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(r *http.Request) (*http.Response, error) {
			sp.requests.mu.Lock()
			sp.requests.n[r.Method+" "+r.URL.Path]++
			sp.requests.mu.Unlock()
			return rt.RoundTrip(r)
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- provisioner.Run(ctx, provisioner.Options{
			Options:        replica.Options{RESTConfig: cfg, EtcdEndpoints: cluster.etcd, Listen: sp.addr, MemberID: "stream-" + name, TLS: cluster.e2e.TLS("provisioner"), Logger: slog.New(sp.logs)},
			CSIEndpoints:   []string{name + "=" + cluster.csiEndpoint},
			WatcherAddress: watcherAddr,
			StaleAfter:     streamStaleAfter,
			Timeout:        csiTimeout,
			RecoveryPeriod: recoveryPeriod,
		})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("provisioner: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("the provisioner did not stop")
		}
	})
	if err := cluster.e2e.WaitServing(ctx, sp.addr, time.Minute); err != nil {
		t.Fatalf("provisioner: %v", err)
	}
	e2e.Eventually(t, 30*time.Second, func() string {
		if sp.logs.count(logCurrent) == 0 {
			return "the provisioner's stream-fed cache is not current"
		}
		return ""
	})
	return sp
}

// hinted asks the stream provisioner to provision c with c itself sent as
// the hint, and says whether the hint was taken: the provisioner answered
// from its cache without reading c from the API server. c asks for a
// volume by name, so the answer is FailedPrecondition either way.
func (sp *streamProvisioner) hinted(t *testing.T, c *corev1.PersistentVolumeClaim) bool {
	t.Helper()
	cc, err := cluster.e2e.Dial(sp.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	b, _ := kube.EncodeProto(c)
	before := sp.requests.count(http.MethodGet, claimPath(c))
	_, err = provisionerv1.NewProvisionerServiceClient(cc).Provision(t.Context(), &provisionerv1.ProvisionRequest{
		ClaimNamespace: c.Namespace, ClaimName: c.Name, ClaimUid: string(c.UID), Claim: b})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Provision of %s/%s, which asks for a volume by name: %v, want FailedPrecondition", c.Namespace, c.Name, err)
	}
	return sp.requests.count(http.MethodGet, claimPath(c)) == before
}

// deleteVolume asks the stream provisioner to delete pv's backing volume.
func (sp *streamProvisioner) deleteVolume(t *testing.T, pv string) (*provisionerv1.DeleteVolumeResponse, error) {
	t.Helper()
	cc, err := cluster.e2e.Dial(sp.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	return provisionerv1.NewProvisionerServiceClient(cc).DeleteVolume(t.Context(), &provisionerv1.DeleteVolumeRequest{VolumeName: pv})
}

// provisionWithData provisions claim name of class sc through sp, waits
// until it is bound and writes a file into its backing volume; it returns
// the claim, its volume and the file's path.
func (sp *streamProvisioner) provisionWithData(t *testing.T, ns, name string, sc *storagev1.StorageClass) (*corev1.PersistentVolumeClaim, *corev1.PersistentVolume, string) {
	t.Helper()
	c := createClaim(t, ns, name, "1Gi", sc.Name)
	if res := provision(t, sp.addr, c, sc); res.GetOutcome() != provisionerv1.Outcome_OUTCOME_FINISHED {
		t.Fatalf("Provision of %s/%s: %v", ns, name, res)
	}
	c, pv := bound(t, ns, name)
	t.Cleanup(func() { removeVolume(pv.Name) })
	data := filepath.Join(cluster.driver.VolumePath(pv.Spec.CSI.VolumeHandle), "precious.txt")
	if err := os.WriteFile(data, []byte("do not lose me"), 0o600); err != nil {
		t.Fatal(err)
	}
	return c, pv, data
}

// removeVolume deletes a PV of a provisioner name only a test serves,
// finalizer and all.
func removeVolume(name string) {
	ctx := context.Background()
	pvs := cluster.client.CoreV1().PersistentVolumes()
	if pv, err := pvs.Get(ctx, name, metav1.GetOptions{}); err == nil && len(pv.Finalizers) > 0 {
		pv.Finalizers = nil
		_, _ = pvs.Update(ctx, pv, metav1.UpdateOptions{})
	}
	_ = pvs.Delete(ctx, name, metav1.DeleteOptions{})
}

// squat creates a claim that asks for volume pv by name.
func squat(t *testing.T, ns, name, pv string) *corev1.PersistentVolumeClaim {
	t.Helper()
	return createClaim(t, ns, name, "1Gi", "", func(c *corev1.PersistentVolumeClaim) { c.Spec.VolumeName = pv })
}

// refused checks that DeleteVolume of pv was refused because of claim c
// and that the volume's data is still there.
func refused(t *testing.T, err error, c *corev1.PersistentVolumeClaim, data string) {
	t.Helper()
	want := fmt.Sprintf("claim %s/%s (uid %s) asks for this volume", c.Namespace, c.Name, c.UID)
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), want) {
		t.Fatalf("DeleteVolume: %v, want FailedPrecondition saying %q", err, want)
	}
	if b, err := os.ReadFile(data); err != nil || string(b) != "do not lose me" {
		t.Fatalf("the volume's data: %q, %v", b, err)
	}
}

// deletedOnceFree deletes claim c, then asks for the deletion of pv's
// backing volume until it is FINISHED, and checks the data went.
func (sp *streamProvisioner) deletedOnceFree(t *testing.T, c *corev1.PersistentVolumeClaim, pv, data string) {
	t.Helper()
	deleteClaim(t, c)
	e2e.Eventually(t, 30*time.Second, func() string {
		resp, err := sp.deleteVolume(t, pv)
		if err != nil || resp.GetOutcome() != provisionerv1.Outcome_OUTCOME_FINISHED {
			return fmt.Sprintf("DeleteVolume: %v %v", resp, err)
		}
		return ""
	})
	if _, err := os.Stat(data); !os.IsNotExist(err) {
		t.Fatalf("the backing volume's data is still there: %v", err)
	}
}

// A provisioner fed by the watcher's stream (--watcher-address) provisions
// a claim, and its DeleteVolume guard refuses (FailedPrecondition) while a
// live claim names the volume: while the stream is live the claim is
// found through the stream-fed index (no claim is listed from the API
// server); once its watcher stops and the cache is stale, a claim the
// stream never delivered is found by listing the claims from the API
// server, and hints are not taken any more. Once the claims are gone the
// volume is deleted either way.
func TestProvisionerOnTheWatcherStream(t *testing.T) {
	ns := e2e.Namespace(t, cluster.client)
	const name = "stream.volplane.io"
	sp := startStreamProvisioner(t, name)
	sc := class(t, func(sc *storagev1.StorageClass) { sc.Provisioner = name })

	t.Run("live stream", func(t *testing.T) {
		c, pv, data := sp.provisionWithData(t, ns, "data", sc)
		squatter := squat(t, ns, "squatter", pv.Name)
		// The stream brings the squatter: its hint is taken.
		e2e.Eventually(t, 30*time.Second, func() string {
			if !sp.hinted(t, squatter) {
				return "the squatter is not in the provisioner's cache yet"
			}
			return ""
		})
		deleteClaim(t, c)
		e2e.VolumePhase(t, cluster.client, pv.Name, corev1.VolumeReleased, 30*time.Second)
		lists := sp.requests.count(http.MethodGet, claimsList)
		_, err := sp.deleteVolume(t, pv.Name)
		refused(t, err, squatter, data)
		if n := sp.requests.count(http.MethodGet, claimsList) - lists; n != 0 {
			t.Errorf("the guard listed the claims %d times; the stream-fed index should have named the squatter", n)
		}
		sp.deletedOnceFree(t, squatter, pv.Name, data)
	})

	t.Run("stale stream", func(t *testing.T) {
		c, pv, data := sp.provisionWithData(t, ns, "data2", sc)
		// A claim the cache holds, whose hint is taken while it is current.
		held := squat(t, ns, "held", "no-such-volume")
		e2e.Eventually(t, 30*time.Second, func() string {
			if !sp.hinted(t, held) {
				return "the claim is not in the provisioner's cache yet"
			}
			return ""
		})
		deleteClaim(t, c)
		e2e.VolumePhase(t, cluster.client, pv.Name, corev1.VolumeReleased, 30*time.Second)
		notCurrent := sp.logs.count(logNotCurrent)
		sp.stopWatcher()
		e2e.Eventually(t, 30*time.Second, func() string {
			if sp.logs.count(logNotCurrent) == notCurrent {
				return "the provisioner still trusts its stream-fed cache"
			}
			return ""
		})
		// The stream cannot bring this claim: only the API server has it.
		squatter := squat(t, ns, "squatter2", pv.Name)
		lists := sp.requests.count(http.MethodGet, claimsList)
		_, err := sp.deleteVolume(t, pv.Name)
		refused(t, err, squatter, data)
		if n := sp.requests.count(http.MethodGet, claimsList) - lists; n == 0 {
			t.Error("the guard did not list the claims from the API server while the stream was stale")
		}
		// The claim the cache holds is not taken as a hint any more.
		if sp.hinted(t, held) {
			t.Error("a hint was taken from a stale cache")
		}
		sp.deletedOnceFree(t, squatter, pv.Name, data)
	})
}

// The provisioner's stream carries claims and classes only. Thousands of
// volume events (volumes created, changed and deleted, as in a mass
// deletion) flow meanwhile: the stream never looks stalled (the watcher's
// progress marks carry it past the volume events), so it is never
// abandoned or relisted, and the cache stays current throughout (issue 23,
// item 7: it used to reconnect 6 to 8 times per mass deletion).
func TestStreamIgnoresVolumeChurn(t *testing.T) {
	sp := startStreamProvisioner(t, "churn")
	ns := e2e.Namespace(t, cluster.client)
	notCurrent := sp.logs.count(logNotCurrent)
	const (
		volumes = 1000
		workers = 16
	)
	pvs := cluster.client.CoreV1().PersistentVolumes()
	ctx := context.Background()
	each := func(what string, do func(name string) error) {
		t.Helper()
		start := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < volumes; i += workers {
					if err := do(fmt.Sprintf("%s-churn-%04d", ns, i)); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("%s: %v", what, err)
		}
		t.Logf("%s %d volumes in %s", what, volumes, time.Since(start).Round(time.Millisecond))
	}
	t.Cleanup(func() {
		for i := range volumes {
			removeVolume(fmt.Sprintf("%s-churn-%04d", ns, i))
		}
	})
	each("created", func(name string) error {
		_, err := pvs.Create(ctx, e2e.Volume(name, "1Gi", ns), metav1.CreateOptions{})
		return err
	})
	each("relabelled", func(name string) error {
		pv, err := pvs.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		pv.Labels = map[string]string{"churn": "1"}
		_, err = pvs.Update(ctx, pv, metav1.UpdateOptions{})
		return err
	})
	each("deleted", func(name string) error {
		removeVolume(name)
		return nil
	})
	report := func() {
		t.Helper()
		if n := sp.logs.count("abandoning the watch stream"); n > 0 {
			t.Errorf("the provisioner abandoned its claims-and-classes stream %d times during volume churn", n)
		}
		if n := sp.logs.count("watcher unreachable"); n > 0 {
			t.Errorf("the provisioner's stream ended %d times during volume churn", n)
		}
		if n := sp.logs.count(logNotCurrent) - notCurrent; n > 0 {
			t.Errorf("the provisioner's cache stopped being current %d times during volume churn", n)
		}
	}
	report()
	if t.Failed() {
		return
	}
	// The stall detector judges a stream that went quiet after the last
	// volume events for longer than streamStaleAfter.
	e2e.Consistently(t, 2*streamStaleAfter, func() string {
		if sp.logs.count(logNotCurrent) > notCurrent || sp.logs.count("abandoning the watch stream") > 0 {
			return "the stream was abandoned or stopped being current after the churn"
		}
		return ""
	})
}
