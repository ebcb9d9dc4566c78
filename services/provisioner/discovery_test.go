package provisioner

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/callers"
	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/sidecar"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	"github.com/volplane/volplane/test/harness/pki"
)

// testSidecar stands in for volplane-csi-sidecar: the dev CSI driver over
// TLS 1.3 with a self-signed certificate, requiring a client certificate
// of volplane's CA naming the provisioner.
type testSidecar struct {
	port int
	hash string
	cert tls.Certificate
}

// selfSigned is an ECDSA certificate valid from notBefore for a day.
func selfSigned(t *testing.T, notBefore time.Time) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "volplane-csi-sidecar"},
		NotBefore: notBefore, NotAfter: notBefore.Add(24 * time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// startSidecar serves a dev CSI driver named name on host:port (port 0:
// any) with cert, for clients whose certificate chains to caFile.
func startSidecar(t *testing.T, name, host string, port int, cert tls.Certificate, caFile string) *testSidecar {
	t.Helper()
	return startSidecarOf(t, devcsi.Options{Name: name, RootDir: t.TempDir(), NodeID: "node-a", Logger: discard}, host, port, cert, caFile)
}

// startSidecarOf is startSidecar in front of a dev driver of options o.
func startSidecarOf(t *testing.T, o devcsi.Options, host string, port int, cert tls.Certificate, caFile string) *testSidecar {
	t.Helper()
	pem, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool,
		VerifyPeerCertificate: func(_ [][]byte, chains [][]*x509.Certificate) error {
			if len(chains) == 0 || chains[0][0].Subject.CommonName != callers.Provisioner {
				return errors.New("not volplane's provisioner")
			}
			return nil
		}}
	d, err := devcsi.New(o)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", net.JoinHostPort(host, fmt.Sprint(port)))
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(cfg)))
	d.Register(srv)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return &testSidecar{port: lis.Addr().(*net.TCPAddr).Port, hash: sidecar.CertSHA256(cert.Certificate[0]), cert: cert}
}

// logBuffer is a slog handler's output, safe for concurrent writes.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// discoveryRig is discovery over a fake API server whose
// SubjectAccessReviews allow the ServiceAccounts in allowed.
type discoveryRig struct {
	api     *fake.Clientset
	reg     *registry
	disc    *discovery
	journal *memJournal
	logs    *logBuffer
	tls     grpcutil.TLSFiles
	mu      sync.Mutex
	allowed map[string]bool
	sars    int
}

func newDiscoveryRig(t *testing.T, reg *registry) *discoveryRig {
	t.Helper()
	ca, err := pki.NewCA(t.TempDir(), "volplane-test")
	if err != nil {
		t.Fatal(err)
	}
	files, err := ca.IssueService("provisioner")
	if err != nil {
		t.Fatal(err)
	}
	rig := &discoveryRig{api: fake.NewClientset(), reg: reg, journal: newMemJournal(), logs: &logBuffer{}, tls: files, allowed: map[string]bool{}}
	if rig.reg == nil {
		rig.reg = newRegistry(discard)
	}
	rig.api.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		sar := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SubjectAccessReview)
		ra := sar.Spec.ResourceAttributes
		rig.mu.Lock()
		defer rig.mu.Unlock()
		rig.sars++
		sar.Status.Allowed = rig.allowed[sar.Spec.User] && ra.Group == sidecar.Group && ra.Resource == sidecar.ResourceDrivers && ra.Verb == sidecar.VerbServe &&
			strings.Contains(strings.Join(sar.Spec.Groups, ","), "system:serviceaccounts:")
		return true, sar, nil
	})
	log := slog.New(slog.NewTextHandler(rig.logs, nil))
	connect := sidecarConnector(clientCertificate(files), func(string, string) []grpc.UnaryClientInterceptor { return nil })
	disc, factory, err := newDiscovery(log, rig.api, rig.reg, newKnownDrivers(log, rig.journal, "member-a"), connect)
	if err != nil {
		t.Fatal(err)
	}
	rig.disc = disc
	ctx, cancel := context.WithCancel(context.Background())
	factory.Start(ctx.Done())
	cache.WaitForCacheSync(ctx.Done(), disc.synced)
	done := make(chan struct{})
	go func() { defer close(done); disc.run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; factory.Shutdown(); closeSidecars(rig.reg) })
	return rig
}

func (rig *discoveryRig) allow(ns, sa string) {
	rig.mu.Lock()
	defer rig.mu.Unlock()
	rig.allowed["system:serviceaccount:"+ns+":"+sa] = true
}

// pod creates a pod of ServiceAccount sa, Ready with ip unless ip is "".
func (rig *discoveryRig) pod(t *testing.T, ns, name, sa, ip string, ready bool) *corev1.Pod {
	t.Helper()
	cond := corev1.ConditionFalse
	if ready {
		cond = corev1.ConditionTrue
	}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.PodSpec{ServiceAccountName: sa},
		Status: corev1.PodStatus{PodIP: ip, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: cond}}}}
	p, err := rig.api.CoreV1().Pods(ns).Create(t.Context(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// inNodeNetwork puts pod in the node's network (hostNetwork), its first
// container declaring ports (TCP unless a protocol is given: port/UDP).
func (rig *discoveryRig) inNodeNetwork(t *testing.T, p *corev1.Pod, ports ...string) {
	t.Helper()
	ct := corev1.Container{Name: "csi-provisioner", Image: "volplane-csi-sidecar"}
	for _, s := range ports {
		num, proto, _ := strings.Cut(s, "/")
		n, err := strconv.Atoi(num)
		if err != nil {
			t.Fatal(err)
		}
		ct.Ports = append(ct.Ports, corev1.ContainerPort{ContainerPort: int32(n), Protocol: corev1.Protocol(proto)})
	}
	p.Spec.HostNetwork = true
	p.Spec.Containers = []corev1.Container{{Name: "driver", Image: "driver"}, ct}
	if _, err := rig.api.CoreV1().Pods(p.Namespace).Update(t.Context(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// register writes (or renews, at renew) the registration of pod for
// driver at the sidecar s.
func (rig *discoveryRig) register(t *testing.T, ns, pod, driver string, port int, hash string, renew time.Time, settings sidecar.Settings) {
	t.Helper()
	r := sidecar.Registration{Namespace: ns, Pod: pod, Driver: driver, Port: port, CertSHA256: hash, Duration: sidecar.LeaseDuration, Settings: settings}
	l := r.Lease(renew)
	leases := rig.api.CoordinationV1().Leases(ns)
	if _, err := leases.Create(t.Context(), l, metav1.CreateOptions{}); err == nil {
		return
	}
	if _, err := leases.Update(t.Context(), l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (rig *discoveryRig) unregister(t *testing.T, ns, pod string) {
	t.Helper()
	if err := rig.api.CoordinationV1().Leases(ns).Delete(t.Context(), sidecar.RegistrationName(pod), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// driverInfo probes every driver and returns what ListDrivers says of
// name (nil when it is not listed).
func (rig *discoveryRig) driverInfo(t *testing.T, name string) *provisionerv1.Driver {
	t.Helper()
	rig.reg.probeAll(t.Context())
	for _, d := range rig.reg.list() {
		if d.GetDriverName() == name {
			return d
		}
	}
	return nil
}

// eventually polls cond for ten seconds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

const sidecarDriverName = "sidecar.csi.example.com"

func TestDiscoveryUsesAVerifiedSidecar(t *testing.T) {
	rig := newDiscoveryRig(t, nil)
	sc := startSidecar(t, sidecarDriverName, "127.0.0.1", 0, selfSigned(t, time.Now().Add(-time.Hour)), rig.tls.CAFile)
	rig.allow("vendor", "driver-sa")
	rig.pod(t, "vendor", "ctrl-0", "driver-sa", "127.0.0.1", true)
	rig.register(t, "vendor", "ctrl-0", sidecarDriverName, sc.port, sc.hash, time.Now(), sidecar.Settings{})
	eventually(t, "the driver ready", func() bool { d := rig.driverInfo(t, sidecarDriverName); return d != nil && d.Ready })
	d := rig.reg.byProvisioner(sidecarDriverName)
	resp, err := d.controller.CreateVolume(t.Context(), &csi.CreateVolumeRequest{Name: "pvc-1", VolumeCapabilities: []*csi.VolumeCapability{{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}}})
	if err != nil || resp.GetVolume().GetVolumeId() == "" {
		t.Fatalf("CreateVolume through the sidecar: %v, %v", resp, err)
	}
	if rec, ok, _ := rig.journal.Get(t.Context(), kindKnownDriver, sidecarDriverName); !ok || !strings.Contains(string(rec.Value), "vendor/ctrl-0") {
		t.Errorf("the discovered driver is not remembered in etcd: %q, %v", rec.Value, ok)
	}
}

// TestDiscoveryHostNetworkDeclaredPort: a sidecar whose pod is in the
// node's network is used when one of the pod's containers declares the
// registered port (TestDiscoveryRefusesForgedRegistrations refuses the
// others).
func TestDiscoveryHostNetworkDeclaredPort(t *testing.T) {
	rig := newDiscoveryRig(t, nil)
	sc := startSidecar(t, sidecarDriverName, "127.0.0.1", 0, selfSigned(t, time.Now().Add(-time.Hour)), rig.tls.CAFile)
	rig.allow("vendor", "driver-sa")
	rig.inNodeNetwork(t, rig.pod(t, "vendor", "ctrl-0", "driver-sa", "127.0.0.1", true), "9808", fmt.Sprintf("%d/TCP", sc.port))
	rig.register(t, "vendor", "ctrl-0", sidecarDriverName, sc.port, sc.hash, time.Now(), sidecar.Settings{})
	eventually(t, "the driver ready", func() bool { d := rig.driverInfo(t, sidecarDriverName); return d != nil && d.Ready })
}

// TestDiscoveryRefusesForgedRegistrations: a registration whose pod,
// ServiceAccount, port (in the node's network), freshness or certificate
// does not check out never makes
// its driver ready, and is logged once with its reason however often it
// is renewed.
func TestDiscoveryRefusesForgedRegistrations(t *testing.T) {
	for _, tc := range []struct {
		name   string
		setup  func(rig *discoveryRig, sc *testSidecar) (port int, hash string, renew time.Time)
		reason string
	}{
		{"pod not Ready", func(rig *discoveryRig, sc *testSidecar) (int, string, time.Time) {
			rig.pod(t, "vendor", "ctrl-0", "driver-sa", "127.0.0.1", false)
			return sc.port, sc.hash, time.Now()
		}, "the pod is not Ready"},
		{"pod without IP", func(rig *discoveryRig, sc *testSidecar) (int, string, time.Time) {
			rig.pod(t, "vendor", "ctrl-0", "driver-sa", "", true)
			return sc.port, sc.hash, time.Now()
		}, "the pod has no IP"},
		{"pod being deleted", func(rig *discoveryRig, sc *testSidecar) (int, string, time.Time) {
			p := rig.pod(t, "vendor", "ctrl-0", "driver-sa", "127.0.0.1", true)
			now := metav1.Now()
			p.DeletionTimestamp = &now
			if _, err := rig.api.CoreV1().Pods("vendor").Update(t.Context(), p, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			return sc.port, sc.hash, time.Now()
		}, "the pod is being deleted"},
		{"ServiceAccount denied", func(rig *discoveryRig, sc *testSidecar) (int, string, time.Time) {
			rig.pod(t, "vendor", "ctrl-0", "other-sa", "127.0.0.1", true)
			return sc.port, sc.hash, time.Now()
		}, "ServiceAccount vendor/other-sa may not serve CSI driver " + sidecarDriverName},
		{"no such pod", func(rig *discoveryRig, sc *testSidecar) (int, string, time.Time) {
			return sc.port, sc.hash, time.Now()
		}, "the pod does not exist"},
		{"hostNetwork pod, port declared by none of its containers", func(rig *discoveryRig, sc *testSidecar) (int, string, time.Time) {
			rig.inNodeNetwork(t, rig.pod(t, "vendor", "ctrl-0", "driver-sa", "127.0.0.1", true), "9808", fmt.Sprintf("%d", sc.port+1))
			return sc.port, sc.hash, time.Now()
		}, "none of its containers declares the registered port"},
		{"hostNetwork pod, port declared for UDP", func(rig *discoveryRig, sc *testSidecar) (int, string, time.Time) {
			rig.inNodeNetwork(t, rig.pod(t, "vendor", "ctrl-0", "driver-sa", "127.0.0.1", true), fmt.Sprintf("%d/UDP", sc.port))
			return sc.port, sc.hash, time.Now()
		}, "none of its containers declares the registered port"},
		{"expired", func(rig *discoveryRig, sc *testSidecar) (int, string, time.Time) {
			rig.pod(t, "vendor", "ctrl-0", "driver-sa", "127.0.0.1", true)
			return sc.port, sc.hash, time.Now().Add(-time.Minute)
		}, "expired at"},
		{"certificate not the pinned one", func(rig *discoveryRig, sc *testSidecar) (int, string, time.Time) {
			rig.pod(t, "vendor", "ctrl-0", "driver-sa", "127.0.0.1", true)
			other := selfSigned(t, time.Now().Add(-time.Hour))
			return sc.port, sidecar.CertSHA256(other.Certificate[0]), time.Now()
		}, "does not answer with its pinned certificate"},
		{"pinned certificate not valid yet", func(rig *discoveryRig, _ *testSidecar) (int, string, time.Time) {
			rig.pod(t, "vendor", "ctrl-0", "driver-sa", "127.0.0.1", true)
			future := startSidecar(t, sidecarDriverName, "127.0.0.1", 0, selfSigned(t, time.Now().Add(time.Hour)), rig.tls.CAFile)
			return future.port, future.hash, time.Now()
		}, "not now"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rig := newDiscoveryRig(t, nil)
			sc := startSidecar(t, sidecarDriverName, "127.0.0.1", 0, selfSigned(t, time.Now().Add(-time.Hour)), rig.tls.CAFile)
			rig.allow("vendor", "driver-sa")
			port, hash, renew := tc.setup(rig, sc)
			for i := range 3 { // the first registration and two renewals
				rig.register(t, "vendor", "ctrl-0", sidecarDriverName, port, hash, renew.Add(time.Duration(i)*time.Millisecond), sidecar.Settings{})
				eventually(t, "the reason logged", func() bool { return strings.Contains(rig.logs.String(), tc.reason) })
			}
			// Let the renewals be processed: the count of lines must not grow.
			time.Sleep(300 * time.Millisecond)
			if n := strings.Count(rig.logs.String(), tc.reason); n != 1 {
				t.Errorf("reason logged %d times, want once:\n%s", n, rig.logs)
			}
			if !strings.Contains(rig.logs.String(), "lease=vendor/volplane-csi-ctrl-0") || !strings.Contains(rig.logs.String(), "pod=vendor/ctrl-0") {
				t.Errorf("the log names neither the lease nor the pod:\n%s", rig.logs)
			}
			if d := rig.driverInfo(t, sidecarDriverName); d != nil && d.Ready {
				t.Errorf("a forged registration made the driver ready: %v", d)
			}
		})
	}
}

func TestDiscoveryLogsAMalformedRegistrationOnce(t *testing.T) {
	rig := newDiscoveryRig(t, nil)
	l := sidecar.Registration{Namespace: "vendor", Pod: "ctrl-0", Driver: sidecarDriverName, Port: 7710, CertSHA256: "nothex", Duration: time.Minute}.Lease(time.Now())
	if _, err := rig.api.CoordinationV1().Leases("vendor").Create(t.Context(), l, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	l.Annotations["unrelated"] = "change"
	if _, err := rig.api.CoordinationV1().Leases("vendor").Update(t.Context(), l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the malformed registration logged", func() bool { return strings.Contains(rig.logs.String(), "malformed registration") })
	time.Sleep(200 * time.Millisecond)
	if n := strings.Count(rig.logs.String(), "malformed registration"); n != 1 {
		t.Errorf("logged %d times:\n%s", n, rig.logs)
	}
	if d := rig.driverInfo(t, sidecarDriverName); d != nil {
		t.Errorf("a malformed registration listed a driver: %v", d)
	}
}

// TestDiscoveryFollowsThePodIP: the registration's pod moves to another
// IP; the next renewal dials the sidecar there, and the old address is
// no longer used.
func TestDiscoveryFollowsThePodIP(t *testing.T) {
	rig := newDiscoveryRig(t, nil)
	cert := selfSigned(t, time.Now().Add(-time.Hour))
	first := startSidecar(t, sidecarDriverName, "127.0.0.1", 0, cert, rig.tls.CAFile)
	rig.allow("vendor", "driver-sa")
	p := rig.pod(t, "vendor", "ctrl-0", "driver-sa", "127.0.0.1", true)
	rig.register(t, "vendor", "ctrl-0", sidecarDriverName, first.port, first.hash, time.Now(), sidecar.Settings{})
	eventually(t, "the driver ready", func() bool { d := rig.driverInfo(t, sidecarDriverName); return d != nil && d.Ready })
	startSidecar(t, sidecarDriverName, "127.0.0.2", first.port, cert, rig.tls.CAFile)
	p.Status.PodIP = "127.0.0.2"
	if _, err := rig.api.CoreV1().Pods("vendor").UpdateStatus(t.Context(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	rig.register(t, "vendor", "ctrl-0", sidecarDriverName, first.port, first.hash, time.Now(), sidecar.Settings{})
	eventually(t, "the new address used", func() bool {
		d := rig.driverInfo(t, sidecarDriverName)
		return d != nil && d.Ready && strings.Contains(d.Endpoint, fmt.Sprintf("127.0.0.2:%d", first.port))
	})
}

// TestDiscoveryTwoSidecarsAreOneDriver: two registrations of one driver
// are one ready driver with two endpoints, not a conflict; when one
// goes, the other serves; when both go, the driver stays listed, not
// ready, saying when and where it was last seen, and its volumes wait.
func TestDiscoveryTwoSidecarsAreOneDriver(t *testing.T) {
	rig := newDiscoveryRig(t, nil)
	rig.allow("vendor", "driver-sa")
	for i, host := range []string{"127.0.0.1", "127.0.0.3"} {
		sc := startSidecar(t, sidecarDriverName, host, 0, selfSigned(t, time.Now().Add(-time.Hour)), rig.tls.CAFile)
		pod := fmt.Sprintf("ctrl-%d", i)
		rig.pod(t, "vendor", pod, "driver-sa", host, true)
		rig.register(t, "vendor", pod, sidecarDriverName, sc.port, sc.hash, time.Now(), sidecar.Settings{})
	}
	eventually(t, "one ready driver with two sidecars", func() bool {
		d := rig.driverInfo(t, sidecarDriverName)
		return d != nil && d.Ready && strings.Contains(d.Endpoint, "vendor/ctrl-0") && strings.Contains(d.Endpoint, "vendor/ctrl-1")
	})
	if n := len(rig.reg.list()); n != 1 {
		t.Errorf("%d drivers listed, want 1: %v", n, rig.reg.list())
	}
	rig.unregister(t, "vendor", "ctrl-0")
	eventually(t, "the other sidecar serving", func() bool {
		d := rig.driverInfo(t, sidecarDriverName)
		return d != nil && d.Ready && !strings.Contains(d.Endpoint, "vendor/ctrl-0")
	})
	rig.unregister(t, "vendor", "ctrl-1")
	var d *provisionerv1.Driver
	want := "no volplane-csi-sidecar of driver " + sidecarDriverName + " is registered; last seen "
	eventually(t, "the driver listed not ready", func() bool {
		d = rig.driverInfo(t, sidecarDriverName)
		return d != nil && !d.Ready && strings.HasPrefix(d.Message, want)
	})
	if !strings.HasPrefix(d.Message, want) || !strings.HasSuffix(d.Message, " in pod vendor/ctrl-1") || d.ProvisionerName != sidecarDriverName {
		t.Errorf("driver gone: %v, want message %q... in pod vendor/ctrl-1", d, want)
	}
	p := &provisioner{drivers: rig.reg, log: discard, prefix: "pvc", timeout: time.Second}
	pv := provisionedPV("pvc-1", "vol-1", corev1.VolumeReleased, corev1.PersistentVolumeReclaimDelete, nil)
	pv.Spec.CSI.Driver = sidecarDriverName
	res, err := p.deleteVolume(t.Context(), pv)
	if err != nil || res.outcome != provisionerv1.Outcome_OUTCOME_IN_BACKGROUND || !strings.Contains(res.message, want) {
		t.Errorf("DeleteVolume of a gone driver's volume: %v, %v; want IN_BACKGROUND (retried), never not served", res, err)
	}
}

// TestDiscoveredDriverSurvivesARestart: a new registry loads the drivers
// etcd remembers and lists them, not ready, before any sidecar is seen.
func TestDiscoveredDriverSurvivesARestart(t *testing.T) {
	j := newMemJournal()
	known := newKnownDrivers(discard, j, "member-a")
	seen := time.Date(2026, 12, 6, 22, 0, 0, 0, time.UTC)
	known.remember(t.Context(), sidecarDriverName, seen, "vendor/ctrl-0")
	reg := newRegistry(discard)
	if err := newKnownDrivers(discard, j, "member-b").load(t.Context(), reg); err != nil {
		t.Fatal(err)
	}
	reg.probeAll(t.Context())
	l := reg.list()
	want := "no volplane-csi-sidecar of driver " + sidecarDriverName + " is registered; last seen 2026-12-06T22:00:00Z in pod vendor/ctrl-0"
	if len(l) != 1 || l[0].DriverName != sidecarDriverName || l[0].ProvisionerName != sidecarDriverName || l[0].Ready || l[0].Message != want {
		t.Fatalf("after a restart: %v, want %q", l, want)
	}
	if err := reg.check(); err != nil {
		t.Errorf("a gone discovered driver makes the provisioner not ready: %v", err)
	}
}

// TestDiscoveredNameClashingWithAnEndpoint: a sidecar registering the
// name of a --csi-endpoint driver is refused; the endpoint keeps serving
// and is the one every call goes to.
func TestDiscoveredNameClashingWithAnEndpoint(t *testing.T) {
	_, ep := startDriverNamed(t, sidecarDriverName)
	reg := newRegistry(discard)
	cc, err := grpcutil.DialCSI(ep)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	reg.add(newDriver(ep, "", cc))
	rig := newDiscoveryRig(t, reg)
	sc := startSidecar(t, sidecarDriverName, "127.0.0.1", 0, selfSigned(t, time.Now().Add(-time.Hour)), rig.tls.CAFile)
	rig.allow("vendor", "driver-sa")
	rig.pod(t, "vendor", "ctrl-0", "driver-sa", "127.0.0.1", true)
	rig.register(t, "vendor", "ctrl-0", sidecarDriverName, sc.port, sc.hash, time.Now(), sidecar.Settings{})
	eventually(t, "the sidecar verified", func() bool { return strings.Contains(rig.logs.String(), "volplane-csi-sidecar registered") })
	reg.probeAll(t.Context())
	var configured, discovered *provisionerv1.Driver
	for _, d := range reg.list() {
		if d.Endpoint == ep {
			configured = d
		} else {
			discovered = d
		}
	}
	if configured == nil || !configured.Ready {
		t.Errorf("the --csi-endpoint driver: %v, want ready", configured)
	}
	if discovered == nil || discovered.Ready || !strings.Contains(discovered.Message, "also served by --csi-endpoint "+ep) {
		t.Errorf("the discovered driver: %v, want refused naming the endpoint", discovered)
	}
	if d := reg.byDriver(sidecarDriverName); d == nil || d.sidecars != nil {
		t.Error("calls for the driver do not go to the --csi-endpoint")
	}
}

// TestSidecarSettings: the sidecar's flags shape the driver's requests;
// a flag the provisioner cannot honour makes the driver not ready, named
// with its value; sidecars of one driver that disagree too.
func TestSidecarSettings(t *testing.T) {
	no, yes := false, true
	for _, tc := range []struct {
		name     string
		settings []sidecar.Settings
		why      string
	}{
		{"volume mode conversion allowed", []sidecar.Settings{{PreventVolumeModeConversion: &no}},
			"--prevent-volume-mode-conversion=false, which volplane's provisioner runs with true for every driver (its --prevent-volume-mode-conversion)"},
		{"honoured", []sidecar.Settings{{VolumeNamePrefix: "vendor", PreventVolumeModeConversion: &yes, ExtraCreateMetadata: true, DefaultFSType: "xfs", StrictTopology: true, Timeout: 3 * time.Minute,
			FeatureGates: map[string]bool{"Topology": true, "ReleaseLeaderElectionOnExit": true}}}, ""},
		{"uuid length", []sidecar.Settings{{VolumeNameUUIDLength: 33}}, "--volume-name-uuid-length=33"},
		{"unknown gate", []sidecar.Settings{{FeatureGates: map[string]bool{"HonorPVReclaimPolicy": true}}}, "unrecognized feature gate: HonorPVReclaimPolicy"},
		{"gate unlike the provisioner's", []sidecar.Settings{{FeatureGates: map[string]bool{GateCrossNamespaceVolumeDataSource: true}}}, "CrossNamespaceVolumeDataSource on, which volplane's provisioner runs off"},
		{"sidecars disagree", []sidecar.Settings{{VolumeNamePrefix: "a"}, {VolumeNamePrefix: "b"}}, "run with different csi-provisioner flags"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var eps []*sidecarEndpoint
			for i, s := range tc.settings {
				eps = append(eps, &sidecarEndpoint{lease: fmt.Sprint(i), pod: fmt.Sprintf("vendor/ctrl-%d", i), settings: s})
			}
			got, why := sidecarSettings(eps, FeatureGates{}, false)
			if tc.why == "" {
				if why != "" || got == nil {
					t.Fatalf("refused: %s", why)
				}
				d := &driver{}
				d.state.Store(&driverState{info: &provisionerv1.Driver{}, settings: got})
				p := &provisioner{prefix: "pvc", defaultFSType: "ext4", timeout: time.Second}
				if p.prefixFor(d) != "vendor" || p.fsTypeFor(d) != "xfs" || !p.strictTopologyFor(d) || !p.extraMetadataFor(d) || p.timeoutFor(d) != 3*time.Minute {
					t.Errorf("settings not applied: %+v", got)
				}
				if plain := (&driver{}); true {
					plain.state.Store(&driverState{info: &provisionerv1.Driver{}})
					if p.prefixFor(plain) != "pvc" || p.fsTypeFor(plain) != "ext4" || p.timeoutFor(plain) != time.Second {
						t.Error("a --csi-endpoint driver does not get the provisioner's flags")
					}
				}
				return
			}
			if got != nil || !strings.Contains(why, tc.why) {
				t.Errorf("got %+v, %q; want refused with %q", got, why, tc.why)
			}
		})
	}
	// A provisioner run with --prevent-volume-mode-conversion=false
	// refuses a sidecar that prevents it (its default), and takes one
	// that allows it.
	eps := []*sidecarEndpoint{{lease: "0", pod: "vendor/ctrl-0", settings: sidecar.Settings{PreventVolumeModeConversion: &yes}}}
	if got, why := sidecarSettings(eps, FeatureGates{}, true); got != nil || !strings.Contains(why, "--prevent-volume-mode-conversion=true, which volplane's provisioner runs with false") {
		t.Errorf("a preventing sidecar, an allowing provisioner: %+v, %q", got, why)
	}
	eps[0].settings.PreventVolumeModeConversion = &no
	if _, why := sidecarSettings(eps, FeatureGates{}, true); why != "" {
		t.Errorf("an allowing sidecar, an allowing provisioner: refused: %s", why)
	}
}

// TestProvisionWaitsForAGoneDriver: a claim whose class names a
// discovered driver without sidecars waits (IN_BACKGROUND) with a
// ProvisioningFailed Warning naming the driver and why.
func TestProvisionWaitsForAGoneDriver(t *testing.T) {
	reg := newRegistry(discard)
	reg.sidecarDriver(sidecarDriverName)
	reg.probeAll(t.Context())
	rec := record.NewFakeRecorder(10)
	p := &provisioner{drivers: reg, log: discard, prefix: "pvc", timeout: time.Second, events: func(string) record.EventRecorder { return rec }}
	claim := claimOf([]corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, false, "1Gi", "")
	class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "vendor"}, Provisioner: sidecarDriverName}
	res, err := p.provision(t.Context(), claim, class, "")
	if err != nil || res.outcome != provisionerv1.Outcome_OUTCOME_IN_BACKGROUND {
		t.Fatalf("provision: %v, %v", res, err)
	}
	var ev string
	select {
	case ev = <-rec.Events:
	default:
	}
	if !strings.Contains(ev, "Warning ProvisioningFailed") || !strings.Contains(ev, "no volplane-csi-sidecar of driver "+sidecarDriverName+" is registered") {
		t.Errorf("event %q", ev)
	}
}

// TestDiscoveryDropsARegistrationThatIsNotRenewed: a sidecar that stops
// renewing (it died with its pod still Ready) is dropped when its
// registration expires, with no event from the API server.
func TestDiscoveryDropsARegistrationThatIsNotRenewed(t *testing.T) {
	rig := newDiscoveryRig(t, nil)
	sc := startSidecar(t, sidecarDriverName, "127.0.0.1", 0, selfSigned(t, time.Now().Add(-time.Hour)), rig.tls.CAFile)
	rig.allow("vendor", "driver-sa")
	rig.pod(t, "vendor", "ctrl-0", "driver-sa", "127.0.0.1", true)
	// Renewed long ago: it holds for four more seconds.
	rig.register(t, "vendor", "ctrl-0", sidecarDriverName, sc.port, sc.hash, time.Now().Add(-sidecar.LeaseDuration+4*time.Second), sidecar.Settings{})
	eventually(t, "the driver ready", func() bool { d := rig.driverInfo(t, sidecarDriverName); return d != nil && d.Ready })
	eventually(t, "the driver dropped at expiry", func() bool {
		d := rig.driverInfo(t, sidecarDriverName)
		return d != nil && !d.Ready && strings.Contains(rig.logs.String(), "expired at")
	})
}
