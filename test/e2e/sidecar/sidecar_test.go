package sidecar

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/sidecar"
	"github.com/volplane/volplane/test/harness/devenv"
	"github.com/volplane/volplane/test/harness/e2e"
)

// proc is a sidecar process.
type proc struct {
	*devenv.Process
	pod, namespace string
	listen, http   string
}

// startSidecar runs volplane-csi-sidecar as pod in namespace, with
// csi-provisioner's arguments args.
func startSidecar(t *testing.T, pod, namespace string, args ...string) *proc {
	t.Helper()
	p := &proc{pod: pod, namespace: namespace}
	var err error
	if p.listen, err = devenv.FreeAddr(); err != nil {
		t.Fatal(err)
	}
	if p.http, err = devenv.FreeAddr(); err != nil {
		t.Fatal(err)
	}
	args = append([]string{"--csi-address=" + env.csiSock, "--kubeconfig=" + env.c.Kubeconfig, "--http-endpoint=" + p.http,
		"--volplane-listen=" + p.listen, "--v=5"}, args...)
	p.Process, err = devenv.StartProcessEnv(env.c.Dir(), pod, filepath.Join(env.bin, "volplane-csi-sidecar"),
		[]string{"POD_NAME=" + pod, "POD_NAMESPACE=" + namespace}, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			t.Logf("%s's log: %s", pod, p.LogPath)
		}
	})
	return p
}

// registration is the pod's registration, or an error saying why there
// is none.
func registration(ctx context.Context, namespace, pod string) (sidecar.Registration, error) {
	l, err := env.client.CoordinationV1().Leases(namespace).Get(ctx, sidecar.RegistrationName(pod), metav1.GetOptions{})
	if err != nil {
		return sidecar.Registration{}, err
	}
	return sidecar.FromLease(l)
}

// waitRegistered waits for the pod's registration.
func waitRegistered(t *testing.T, p *proc, within time.Duration) sidecar.Registration {
	t.Helper()
	var reg sidecar.Registration
	e2e.Eventually(t, within, func() string {
		var err error
		if reg, err = registration(t.Context(), p.namespace, p.pod); err != nil {
			return fmt.Sprintf("registration of %s: %v (process: %s)", p.pod, err, p.ExitStatus())
		}
		return ""
	})
	return reg
}

// provisionerCert is volplane's provisioner's client certificate.
func clientCert(t *testing.T, service string) tls.Certificate {
	t.Helper()
	f := env.c.TLS(service)
	cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// dialPinned dials the registration's port at addr as the provisioner
// does: with cert, trusting the server by the pinned hash alone.
func dialPinned(t *testing.T, addr string, reg sidecar.Registration, cert tls.Certificate) *grpc.ClientConn {
	t.Helper()
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 || sidecar.CertSHA256(cs.PeerCertificates[0].Raw) != reg.CertSHA256 {
				return errors.New("the served certificate is not the pinned one")
			}
			return nil
		}}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestProvisionThroughTheSidecar: the registration names the driver, the
// pod and the port and pins the certificate the port serves; the
// provisioner's certificate creates and deletes a volume through it,
// another service's is refused; SIGTERM deletes the registration.
func TestProvisionThroughTheSidecar(t *testing.T) {
	ns := e2e.Namespace(t, env.client)
	p := startSidecar(t, "ebs-csi-controller-6f7d-abcde", ns, "--extra-create-metadata", "--default-fstype=ext4", "--timeout=30s",
		"--worker-threads=8", "--retry-interval-max=30m", "--feature-gates=Topology=true")
	reg := waitRegistered(t, p, 30*time.Second)
	_, port, _ := strings.Cut(p.listen, ":")
	if reg.Driver != devcsi.DefaultName || reg.Pod != p.pod || reg.Namespace != ns || strconv.Itoa(reg.Port) != port || reg.LeaderElection {
		t.Fatalf("registration %+v", reg)
	}
	if s := reg.Settings; !s.ExtraCreateMetadata || s.DefaultFSType != "ext4" || s.Timeout != 30*time.Second || !s.FeatureGates["Topology"] {
		t.Fatalf("carried settings %+v", s)
	}
	if reg.Duration != sidecar.LeaseDuration || !reg.Fresh(time.Now()) {
		t.Fatalf("registration held for %s from %s", reg.Duration, reg.RenewTime)
	}

	cc := dialPinned(t, p.listen, reg, clientCert(t, "provisioner"))
	ctrl := csi.NewControllerClient(cc)
	caps := []*csi.VolumeCapability{{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}}
	vol, err := ctrl.CreateVolume(t.Context(), &csi.CreateVolumeRequest{Name: "pvc-" + ns, VolumeCapabilities: caps,
		CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 20}})
	if err != nil {
		t.Fatalf("CreateVolume through the sidecar: %v", err)
	}
	if _, err := ctrl.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: vol.GetVolume().GetVolumeId()}); err != nil {
		t.Fatalf("DeleteVolume through the sidecar: %v", err)
	}
	if _, err := csi.NewNodeClient(cc).NodeGetInfo(t.Context(), &csi.NodeGetInfoRequest{}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("NodeGetInfo through the sidecar: %v, want Unimplemented", err)
	}
	for _, other := range []string{"gateway", "binder", e2e.Client} {
		_, err := csi.NewIdentityClient(dialPinned(t, p.listen, reg, clientCert(t, other))).Probe(t.Context(), &csi.ProbeRequest{})
		if status.Code(err) != codes.Unavailable {
			t.Errorf("Probe as %s: %v, want the handshake refused", other, err)
		}
	}

	if code, body := get(t, "http://"+p.http+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz: %d %s", code, body)
	}
	if _, body := get(t, "http://"+p.http+"/metrics"); !strings.Contains(body, `volplane_csi_sidecar_calls_total{code="OK",method="/csi.v1.Controller/CreateVolume"} 1`) {
		t.Fatalf("/metrics lacks the CreateVolume call:\n%s", body)
	}

	p.Stop()
	if _, err := registration(context.Background(), ns, p.pod); !apierrors.IsNotFound(err) {
		t.Fatalf("after SIGTERM the registration is %v, want deleted", err)
	}
	if st := p.ExitStatus(); st != "exit status 0" {
		t.Fatalf("after SIGTERM the sidecar ended with %q", st)
	}
}
