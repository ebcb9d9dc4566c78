package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/volplane/volplane/pkg/grpcutil"
	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
	"github.com/volplane/volplane/test/harness/e2e"
	"github.com/volplane/volplane/test/harness/pki"
)

// The services serve mutual TLS only: a client without TLS, or with a
// certificate of another CA, gets nothing; a client of the cluster's CA
// gets in.
func TestServicesRefuseClientsWithoutTheirCA(t *testing.T) {
	other, err := pki.Generate(filepath.Join(t.TempDir(), "other-ca"), "intruder")
	if err != nil {
		t.Fatal(err)
	}
	// Trusts the services' CA, presents a certificate of another.
	forged := other["intruder"]
	forged.CAFile = cluster.e2e.TLS(e2e.Client).CAFile
	for name, files := range map[string]grpcutil.TLSFiles{
		"plaintext":                 {InsecurePlaintext: true},
		"another CA":                other["intruder"],
		"certificate of another CA": forged,
	} {
		for svc, addr := range map[string]string{"watcher": cluster.watcherAddr, "binder": cluster.binderAddr, "reclaimer": cluster.reclaimerAddr} {
			t.Run(name+"/"+svc, func(t *testing.T) {
				cc, err := grpcutil.Dial(addr, files)
				if err != nil {
					t.Fatal(err)
				}
				defer cc.Close()
				ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
				defer cancel()
				_, err = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
				if status.Code(err) != codes.Unavailable {
					t.Fatalf("health check: %v, want Unavailable (refused in the handshake)", err)
				}
			})
		}
	}
	cc, err := cluster.e2e.Dial(cluster.binderAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	if _, err := healthpb.NewHealthClient(cc).Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("a client of the cluster's CA: %v", err)
	}
}

// A write is logged with the calling service (its certificate's name) and
// the end user the caller says it acts for.
func TestWritesAreLoggedWithTheCaller(t *testing.T) {
	n := ns(t)
	cc, err := cluster.e2e.Dial(cluster.binderAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx := metadata.AppendToOutgoingContext(t.Context(), "volplane-user", "alice@"+n, "volplane-groups", "ops")
	_, _ = binderv1.NewBinderServiceClient(cc).SyncClaim(ctx, &binderv1.SyncClaimRequest{Namespace: n, Name: "nothing"})
	eventually(t, 10*time.Second, func() string {
		b, err := os.ReadFile(cluster.logs)
		if err != nil {
			return err.Error()
		}
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, "method=/volplane.binder.v1.BinderService/SyncClaim") &&
				strings.Contains(line, "caller="+e2e.Client+" user=alice@"+n) && strings.Contains(line, "level=INFO") {
				return ""
			}
		}
		return "no info line for SyncClaim with the caller and the user"
	})
}
