package minimalprov

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/callers"
	"github.com/volplane/volplane/pkg/conformance"
	"github.com/volplane/volplane/pkg/grpcutil"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	"github.com/volplane/volplane/test/harness/pki"
)

// fakeKube is a fake clientset that gives created objects a UID, as the
// API server does.
func fakeKube() *fake.Clientset {
	c := fake.NewClientset()
	c.PrependReactor("create", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if m, err := meta.Accessor(a.(k8stesting.CreateAction).GetObject()); err == nil && m.GetUID() == "" {
			m.SetUID(uuid.NewUUID())
		}
		return false, nil, nil
	})
	return c
}

// startCSI runs the dev CSI driver in-process and returns its endpoint.
func startCSI(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	drv, err := devcsi.New(devcsi.Options{RootDir: filepath.Join(dir, "root"), NodeID: "node-a", Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	sock := "unix://" + filepath.Join(dir, "csi.sock")
	lis, err := grpcutil.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpcutil.NewCSIServer(discard())
	drv.Register(srv.Server)
	srv.SetServing(true)
	serveUntilCleanup(t, srv, lis)
	return sock
}

// internalForBadInput wraps a provisioner and answers Internal where it
// answers InvalidArgument: the caller's mistake reported as the server's.
type internalForBadInput struct {
	provisionerv1.ProvisionerServiceServer
}

func internalize(err error) error {
	if status.Code(err) == codes.InvalidArgument {
		return status.Error(codes.Internal, "something went wrong")
	}
	return err
}

func (w internalForBadInput) Provision(ctx context.Context, req *provisionerv1.ProvisionRequest) (*provisionerv1.ProvisionResponse, error) {
	resp, err := w.ProvisionerServiceServer.Provision(ctx, req)
	return resp, internalize(err)
}

func (w internalForBadInput) DeleteVolume(ctx context.Context, req *provisionerv1.DeleteVolumeRequest) (*provisionerv1.DeleteVolumeResponse, error) {
	resp, err := w.ProvisionerServiceServer.DeleteVolume(ctx, req)
	return resp, internalize(err)
}

// TestSuiteCatchesBrokenProvisioner runs the provisioner suite against the
// minimal provisioner (over a fake clientset and the dev CSI driver), then
// against broken variants of it: each fails exactly the checks of the
// rule it breaks, and passes the others.
func TestSuiteCatchesBrokenProvisioner(t *testing.T) {
	certs, err := pki.Generate(t.TempDir(), "provisioner", callers.Conformance)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		broken func(s *Server) provisionerv1.ProvisionerServiceServer
		fails  []string
	}{
		{"conforming", func(s *Server) provisionerv1.ProvisionerServiceServer { return s }, nil},
		{"Internal for bad input", func(s *Server) provisionerv1.ProvisionerServiceServer { return internalForBadInput{s} },
			[]string{"provisioner/delete-volume-invalid-argument", "provisioner/provision-invalid-argument"}},
		{"a new volume on every call", func(s *Server) provisionerv1.ProvisionerServiceServer {
			n := 0
			s.VolumeName = func(c *corev1.PersistentVolumeClaim) string { n++; return fmt.Sprintf("pvc-%s-%d", c.UID, n) }
			return s
		}, []string{"provisioner/provision-idempotent"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			kube := fakeKube()
			sock := startCSI(t)
			conn, err := grpcutil.DialCSI(sock)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			s, err := New(ctx, kube, conn, sock)
			if err != nil {
				t.Fatal(err)
			}
			addr := serveProvisioner(t, tc.broken(s), certs["provisioner"])
			results, err := conformance.Run(ctx, conformance.Provisioner, conformance.Config{
				Address: addr, TLS: certs[callers.Conformance], Kube: kube, CSIEndpoint: sock, Timeout: 20 * time.Second, Logf: t.Logf,
			}, nil)
			if err != nil {
				t.Fatal(err)
			}
			var failed []string
			for _, r := range results {
				t.Logf("%s %s %s", r.Outcome, r.Check, r.Message)
				if r.Outcome == conformance.Failed {
					failed = append(failed, r.Check)
				}
			}
			sort.Strings(failed)
			if !slices.Equal(failed, tc.fails) {
				t.Fatalf("failed checks %v, want %v", failed, tc.fails)
			}
			if len(results) != len(conformance.Checks(conformance.Provisioner)) {
				t.Fatalf("%d results for %d checks", len(results), len(conformance.Checks(conformance.Provisioner)))
			}
		})
	}
}
