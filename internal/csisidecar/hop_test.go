package csisidecar

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/callers"
	"github.com/volplane/volplane/pkg/sidecar"
)

// testCA issues client certificates with any name and validity.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue makes a client certificate named cn, valid from notBefore for an
// hour.
func (ca *testCA) issue(t *testing.T, cn string, notBefore time.Time) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn}, NotBefore: notBefore,
		NotAfter: notBefore.Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// world is a dev CSI driver on a unix socket, a fake API server holding
// volplane's CA, and a sidecar in front of the driver.
type world struct {
	ca      *testCA
	client  *fake.Clientset
	sidecar *Sidecar
	faults  *devcsi.Faults
	calls   atomic.Int64 // calls that reached the driver
	done    chan error
	cancel  context.CancelFunc
}

const testNamespace = "driver-ns"

func startWorld(t *testing.T, mutate func(*Options), args ...string) *world {
	t.Helper()
	t.Setenv("POD_NAME", "ebs-csi-controller-0")
	t.Setenv("POD_NAMESPACE", testNamespace)
	w := &world{ca: newTestCA(t, "volplane-ca"), done: make(chan error, 1)}
	w.client = fake.NewClientset(&corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: DefaultNamespace, Name: sidecar.CAConfigMap},
		Data:       map[string]string{sidecar.CAConfigMapKey: string(w.ca.pem)},
	})
	sock, faults := startDriver(t, &w.calls)
	w.faults = faults
	o, err := Parse(append([]string{"--csi-address=" + sock, "--volplane-listen=127.0.0.1:0", "--timeout=5s", "--extra-create-metadata", "--default-fstype=ext4"}, args...))
	if err != nil {
		t.Fatal(err)
	}
	o.Client = w.client
	if mutate != nil {
		mutate(&o)
	}
	if w.sidecar, err = Start(o); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	go func() { w.done <- w.sidecar.Serve(ctx) }()
	t.Cleanup(func() { cancel(); <-w.done })
	// The sidecar's own GetPluginInfo is the driver's first call.
	eventually(t, w.sidecar.metrics.ready.Load)
	return w
}

// startDriver serves the dev CSI driver's controller on a unix socket,
// counting the calls that reach it, with its fault injector.
func startDriver(t *testing.T, calls *atomic.Int64) (string, *devcsi.Faults) {
	t.Helper()
	dir := t.TempDir()
	drv, err := devcsi.New(devcsi.Options{RootDir: filepath.Join(dir, "root"), NodeID: "node-a", Mode: devcsi.ModeController})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "csi.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		calls.Add(1)
		return h(ctx, req)
	}, drv.Faults().UnaryServerInterceptor()))
	drv.Register(srv)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return sock, drv.Faults()
}

// dial connects to the sidecar presenting cert (none when nil), pinning
// the sidecar's certificate by its hash as the provisioner does.
func (w *world) dial(t *testing.T, cert *tls.Certificate) *grpc.ClientConn {
	t.Helper()
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true, VerifyConnection: func(cs tls.ConnectionState) error {
		if got := sidecar.CertSHA256(cs.PeerCertificates[0].Raw); got != w.sidecar.CertSHA256() {
			return errors.New("pinned hash mismatch")
		}
		return nil
	}}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	cc, err := grpc.NewClient(w.sidecar.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func TestHopForwardsTheProvisionersCalls(t *testing.T) {
	w := startWorld(t, nil)
	cert := w.ca.issue(t, callers.Provisioner, time.Now().Add(-time.Minute))
	cc := w.dial(t, &cert)
	ctx := t.Context()
	info, err := csi.NewIdentityClient(cc).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	if err != nil || info.GetName() != devcsi.DefaultName {
		t.Fatalf("GetPluginInfo through the sidecar = %v, %v", info, err)
	}
	ctrl := csi.NewControllerClient(cc)
	caps := []*csi.VolumeCapability{{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}}
	vol, err := ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-1", VolumeCapabilities: caps})
	if err != nil {
		t.Fatalf("CreateVolume: %v", err)
	}
	if _, err := ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: vol.GetVolume().GetVolumeId()}); err != nil {
		t.Fatalf("DeleteVolume: %v", err)
	}
	// The driver's own errors come back as they are.
	_, err = ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: ""})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("CreateVolume without a name = %v, want the driver's InvalidArgument", err)
	}
}

func TestHopRefusesEveryoneButTheProvisioner(t *testing.T) {
	w := startWorld(t, nil)
	other := newTestCA(t, "another-ca")
	now := time.Now().Add(-time.Minute)
	for name, cert := range map[string]*tls.Certificate{
		"no client certificate": nil,
		"another CA":            ptr(other.issue(t, callers.Provisioner, now)),
		"the gateway":           ptr(w.ca.issue(t, callers.Gateway, now)),
		"the binder":            ptr(w.ca.issue(t, callers.Binder, now)),
		"expired":               ptr(w.ca.issue(t, callers.Provisioner, time.Now().Add(-2*time.Hour))),
		"not yet valid":         ptr(w.ca.issue(t, callers.Provisioner, time.Now().Add(time.Hour))),
	} {
		t.Run(name, func(t *testing.T) {
			before := w.calls.Load()
			_, err := csi.NewIdentityClient(w.dial(t, cert)).GetPluginInfo(t.Context(), &csi.GetPluginInfoRequest{})
			if err == nil {
				t.Fatal("the call went through")
			}
			if c := status.Code(err); c != codes.Unavailable {
				t.Fatalf("code %v (%v), want the handshake refused (Unavailable)", c, err)
			}
			if w.calls.Load() != before {
				t.Fatal("the driver was called")
			}
		})
	}
}

func TestHopRefusesOtherMethods(t *testing.T) {
	w := startWorld(t, nil)
	cert := w.ca.issue(t, callers.Provisioner, time.Now().Add(-time.Minute))
	cc := w.dial(t, &cert)
	ctx := t.Context()
	before := w.calls.Load()
	for name, call := range map[string]func() error{
		"Node": func() error { _, err := csi.NewNodeClient(cc).NodeGetInfo(ctx, &csi.NodeGetInfoRequest{}); return err },
		"ControllerPublishVolume": func() error {
			_, err := csi.NewControllerClient(cc).ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{})
			return err
		},
		"CreateSnapshot": func() error {
			_, err := csi.NewControllerClient(cc).CreateSnapshot(ctx, &csi.CreateSnapshotRequest{})
			return err
		},
		"grpc health": func() error {
			_, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
			return err
		},
		"made-up": func() error {
			return cc.Invoke(ctx, "/csi.v1.Controller/DeleteEverything", &csi.DeleteVolumeRequest{}, &csi.DeleteVolumeResponse{})
		},
	} {
		if err := call(); status.Code(err) != codes.Unimplemented || !strings.Contains(err.Error(), "not served by volplane-csi-sidecar") {
			t.Errorf("%s: %v, want Unimplemented by the sidecar", name, err)
		}
	}
	if w.calls.Load() != before {
		t.Fatal("a refused call reached the driver")
	}
}

func TestHopPicksUpARotatedCA(t *testing.T) {
	old := caRefreshEvery
	caRefreshEvery = 50 * time.Millisecond
	t.Cleanup(func() { caRefreshEvery = old })
	w := startWorld(t, nil)
	now := time.Now().Add(-time.Minute)
	oldCert := w.ca.issue(t, callers.Provisioner, now)
	if _, err := csi.NewIdentityClient(w.dial(t, &oldCert)).Probe(t.Context(), &csi.ProbeRequest{}); err != nil {
		t.Fatalf("before the rotation: %v", err)
	}
	next := newTestCA(t, "volplane-ca-2")
	cms := w.client.CoreV1().ConfigMaps(DefaultNamespace)
	cm, err := cms.Get(t.Context(), sidecar.CAConfigMap, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data[sidecar.CAConfigMapKey] = string(next.pem)
	if _, err := cms.Update(t.Context(), cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	newCert := next.issue(t, callers.Provisioner, now)
	eventually(t, func() bool {
		_, err := csi.NewIdentityClient(w.dial(t, &newCert)).Probe(t.Context(), &csi.ProbeRequest{})
		return err == nil
	})
	if _, err := csi.NewIdentityClient(w.dial(t, &oldCert)).Probe(t.Context(), &csi.ProbeRequest{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("the old CA's certificate after the rotation: %v, want refused", err)
	}
}

func TestRegistrationPinsTheServedCertificate(t *testing.T) {
	w := startWorld(t, nil)
	var reg sidecar.Registration
	name := sidecar.RegistrationName("ebs-csi-controller-0")
	eventually(t, func() bool {
		l, err := w.client.CoordinationV1().Leases(testNamespace).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		if reg, err = sidecar.FromLease(l); err != nil {
			t.Fatalf("the sidecar's lease does not read: %v", err)
		}
		return true
	})
	cert := w.ca.issue(t, callers.Provisioner, time.Now().Add(-time.Minute))
	conn, err := tls.Dial("tcp", w.sidecar.Addr().String(), &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	served := conn.ConnectionState().PeerCertificates[0].Raw
	conn.Close()
	if got := sidecar.CertSHA256(served); reg.CertSHA256 != got {
		t.Fatalf("registration pins %s, the port serves %s", reg.CertSHA256, got)
	}
	_, port, _ := net.SplitHostPort(w.sidecar.Addr().String())
	if reg.Driver != devcsi.DefaultName || reg.Pod != "ebs-csi-controller-0" || reg.Namespace != testNamespace || port != strconv.Itoa(reg.Port) || reg.LeaderElection {
		t.Fatalf("registration %+v", reg)
	}
	if !reg.Settings.ExtraCreateMetadata || reg.Settings.DefaultFSType != "ext4" || reg.Settings.Timeout != 5*time.Second || reg.Settings.VolumeNamePrefix != "pvc" {
		t.Fatalf("settings %+v, want the command line's", reg.Settings)
	}
	w.cancel()
	if err := <-w.done; err != nil {
		t.Fatal(err)
	}
	w.done <- nil // for the cleanup
	if _, err := w.client.CoordinationV1().Leases(testNamespace).Get(context.Background(), name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("after shutdown the registration is %v, want deleted", err)
	}
}

// TestHopIsBounded: a call waits for one of --worker-threads slots only
// until its deadline, a slow driver call ends at --timeout, and a message
// over MaxMessageSize never reaches the driver.
func TestHopIsBounded(t *testing.T) {
	w := startWorld(t, nil, "--worker-threads=1", "--timeout=1s")
	cert := w.ca.issue(t, callers.Provisioner, time.Now().Add(-time.Minute))
	cc := w.dial(t, &cert)
	w.faults.Delay("CreateVolume", 5*time.Second)
	caps := []*csi.VolumeCapability{{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}}
	slow := make(chan error, 1)
	began := time.Now()
	go func() {
		_, err := csi.NewControllerClient(cc).CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: "slow", VolumeCapabilities: caps})
		slow <- err
	}()
	eventually(t, func() bool { return w.calls.Load() >= 2 }) // GetPluginInfo, then CreateVolume
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	inFlight := w.calls.Load()
	_, err := csi.NewIdentityClient(cc).Probe(ctx, &csi.ProbeRequest{})
	if status.Code(err) != codes.DeadlineExceeded || w.calls.Load() != inFlight {
		t.Fatalf("a call while the only slot is taken: %v (driver calls %d -> %d), want DeadlineExceeded before the driver", err, inFlight, w.calls.Load())
	}
	if err := <-slow; status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a driver call slower than --timeout: %v, want DeadlineExceeded", err)
	}
	if took := time.Since(began); took > 3*time.Second {
		t.Fatalf("the slow call took %s, want --timeout (1s)", took)
	}
	w.faults.Delay("CreateVolume", 0)
	before := w.calls.Load()
	huge := map[string]string{"x": strings.Repeat("a", MaxMessageSize+1)}
	_, err = csi.NewControllerClient(cc).CreateVolume(t.Context(), &csi.CreateVolumeRequest{Name: "huge", VolumeCapabilities: caps, Parameters: huge})
	if status.Code(err) != codes.ResourceExhausted || w.calls.Load() != before {
		t.Fatalf("a message over %d bytes: %v (driver calls %d -> %d), want ResourceExhausted before the driver", MaxMessageSize, err, before, w.calls.Load())
	}
}

// TestAuthorizeNamesTheIdentity is the per-call check behind the
// handshake's: a verified certificate of another identity is
// PermissionDenied, naming it.
func TestAuthorizeNamesTheIdentity(t *testing.T) {
	ca := newTestCA(t, "ca")
	for cn, want := range map[string]codes.Code{callers.Provisioner: codes.OK, callers.Gateway: codes.PermissionDenied, "": codes.PermissionDenied} {
		cert, _ := x509.ParseCertificate(ca.issue(t, cn, time.Now()).Certificate[0])
		info := credentials.TLSInfo{State: tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{cert, ca.cert}}}}
		err := authorize(peer.NewContext(t.Context(), &peer.Peer{AuthInfo: info}))
		if status.Code(err) != want || (want != codes.OK && !strings.Contains(err.Error(), fmt.Sprintf("%q", cn))) {
			t.Errorf("caller %q: %v, want %v naming it", cn, err, want)
		}
	}
	for name, ctx := range map[string]context.Context{
		"no peer":        t.Context(),
		"not TLS":        peer.NewContext(t.Context(), &peer.Peer{}),
		"no chain (TLS)": peer.NewContext(t.Context(), &peer.Peer{AuthInfo: credentials.TLSInfo{}}),
	} {
		if err := authorize(ctx); status.Code(err) != codes.Unauthenticated {
			t.Errorf("%s: %v, want Unauthenticated", name, err)
		}
	}
}

// TestNoRegistrationBeforeTheCA: until the provisioner's CA is read, the
// port refuses everyone, so the sidecar does not register.
func TestNoRegistrationBeforeTheCA(t *testing.T) {
	old := caRefreshEvery
	caRefreshEvery = 50 * time.Millisecond
	t.Cleanup(func() { caRefreshEvery = old })
	var cm *corev1.ConfigMap
	w := startWorld(t, func(o *Options) {
		cms := o.Client.CoreV1().ConfigMaps(DefaultNamespace)
		cm, _ = cms.Get(context.Background(), sidecar.CAConfigMap, metav1.GetOptions{})
		if err := cms.Delete(context.Background(), sidecar.CAConfigMap, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	})
	leases := w.client.CoordinationV1().Leases(testNamespace)
	name := sidecar.RegistrationName("ebs-csi-controller-0")
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); { // several CA refreshes
		if _, err := leases.Get(t.Context(), name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("registration without a CA: %v, want none", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := w.client.CoreV1().ConfigMaps(DefaultNamespace).Create(t.Context(), cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() bool { _, err := leases.Get(t.Context(), name, metav1.GetOptions{}); return err == nil })
}

func ptr[T any](v T) *T { return &v }

func eventually(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
