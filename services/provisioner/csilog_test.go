package provisioner

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
)

// The CSI call log at debug level shows the request without the values of
// the fields the CSI spec marks csi_secret, whatever they are named.
func TestCSILogStripsSecrets(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	call := csiLogger(log, "unix:///csi.sock")
	for _, req := range []any{
		&csi.CreateVolumeRequest{Name: "pvc-1", Secrets: map[string]string{"password": "hunter2-create"}},
		&csi.DeleteVolumeRequest{VolumeId: "v1", Secrets: map[string]string{"token": "hunter2-delete"}},
		&csi.NodeStageVolumeRequest{VolumeId: "v1", Secrets: map[string]string{"k": "hunter2-stage"}},
	} {
		err := call(context.Background(), "/csi.v1.Controller/X", req, nil, nil,
			func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error { return nil })
		if err != nil {
			t.Fatal(err)
		}
	}
	out := buf.String()
	if strings.Contains(out, "hunter2") {
		t.Fatalf("a secret reached the log:\n%s", out)
	}
	if !strings.Contains(out, "pvc-1") || strings.Count(out, "stripped") < 3 {
		t.Fatalf("the requests are not logged with their secrets stripped:\n%s", out)
	}
}
