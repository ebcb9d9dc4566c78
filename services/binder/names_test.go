package binder

import (
	"io"
	"log/slog"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
)

// Invalid names are refused up front, with the field to fix, before the
// cache is even asked (which would answer NotFound).
func TestAPIRefusesInvalidNames(t *testing.T) {
	c := newController(slog.New(slog.NewTextHandler(io.Discard, nil)), fake.NewClientset(), record.NewFakeRecorder(100))
	a := &api{c: c, memberID: "m", members: func() []string { return []string{"m"} }, workers: 1}
	ctx := t.Context()
	for name, call := range map[string]func() error{
		"GetClaim namespace": func() error {
			_, err := a.GetClaim(ctx, &binderv1.GetClaimRequest{Namespace: "Bad_NS", Name: "x"})
			return err
		},
		"SyncClaim name": func() error {
			_, err := a.SyncClaim(ctx, &binderv1.SyncClaimRequest{Namespace: "ns", Name: "a/../b"})
			return err
		},
		"GetVolume name": func() error {
			_, err := a.GetVolume(ctx, &binderv1.GetVolumeRequest{Name: "bad\xff"})
			return err
		},
		"SyncVolume name": func() error {
			_, err := a.SyncVolume(ctx, &binderv1.SyncVolumeRequest{Name: ""})
			return err
		},
	} {
		err := call()
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "name") {
			t.Errorf("%s: %v, want InvalidArgument naming the field", name, err)
		}
	}
}
