package conformance

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/pkg/callers"
	"github.com/volplane/volplane/pkg/grpcutil"
	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
	"github.com/volplane/volplane/test/harness/pki"
)

// Every check is described in docs/conformance.md, under its name.
func TestEveryCheckDocumented(t *testing.T) {
	b, err := os.ReadFile("../../docs/conformance.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range Services {
		for _, c := range Checks(s) {
			if !strings.Contains(string(b), "`"+c.Name+"`") {
				t.Errorf("docs/conformance.md does not describe %s", c.Name)
			}
			if c.Doc == "" {
				t.Errorf("%s has no Doc", c.Name)
			}
		}
	}
}

func class(name, rv string) []byte {
	b, err := (&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: rv}}).Marshal()
	if err != nil {
		panic(err)
	}
	return b
}

func ev(typ watcherv1.EventType, epoch string, seq uint64, key string) *watcherv1.WatchResponse {
	e := &watcherv1.WatchResponse{Type: typ, Cursor: &watcherv1.Cursor{Epoch: epoch, Sequence: seq}}
	if key != "" {
		e.Kind, e.Key, e.Object, e.ResourceVersion = watcherv1.Kind_KIND_STORAGE_CLASS, key, class(key, "7"), "7"
	}
	return e
}

// The stream rules catch each way a watcher can break the contract, and
// accept a stream that keeps it.
func TestStreamRules(t *testing.T) {
	const (
		reset   = watcherv1.EventType_EVENT_TYPE_RESET
		synced  = watcherv1.EventType_EVENT_TYPE_SYNCED
		added   = watcherv1.EventType_EVENT_TYPE_ADDED
		updated = watcherv1.EventType_EVENT_TYPE_UPDATED
		mark    = watcherv1.EventType_EVENT_TYPE_PROGRESS
	)
	marks := &watcherv1.WatchRequest{ProgressMarks: true}
	markWithKey := ev(mark, "e", 6, "")
	markWithKey.Key = "a"
	wrongKey := ev(added, "e", 5, "a")
	wrongKey.Key = "b"
	wrongRV := ev(updated, "e", 6, "a")
	wrongRV.ResourceVersion = "8"
	undecodable := ev(added, "e", 6, "a")
	undecodable.Object = garbage
	for _, tc := range []struct {
		name   string
		req    *watcherv1.WatchRequest
		events []*watcherv1.WatchResponse
		want   string // in the error of the last event; "" for none
	}{
		{"list then live", &watcherv1.WatchRequest{}, []*watcherv1.WatchResponse{
			ev(reset, "e", 5, ""), ev(added, "e", 5, "a"), ev(added, "e", 5, "b"), ev(synced, "e", 5, ""),
			ev(updated, "e", 6, "a"), ev(reset, "e", 9, ""), ev(added, "e", 9, "a"), ev(synced, "e", 9, ""), ev(updated, "e", 10, "a")}, ""},
		{"resumed without a list", &watcherv1.WatchRequest{ResumeAfter: &watcherv1.Cursor{Epoch: "e", Sequence: 5}}, []*watcherv1.WatchResponse{
			ev(updated, "e", 6, "a"), ev(updated, "e", 8, "b")}, ""},
		{"no RESET first", &watcherv1.WatchRequest{}, []*watcherv1.WatchResponse{ev(added, "e", 5, "a")}, "not RESET"},
		{"SYNCED without RESET", &watcherv1.WatchRequest{}, []*watcherv1.WatchResponse{ev(synced, "e", 5, "")}, "outside a list"},
		{"SYNCED of another cursor", &watcherv1.WatchRequest{}, []*watcherv1.WatchResponse{ev(reset, "e", 5, ""), ev(synced, "e", 6, "")}, "not the RESET's"},
		{"listed twice", &watcherv1.WatchRequest{}, []*watcherv1.WatchResponse{ev(reset, "e", 5, ""), ev(added, "e", 5, "a"), ev(added, "e", 5, "a")}, "twice"},
		{"UPDATED in the list", &watcherv1.WatchRequest{}, []*watcherv1.WatchResponse{ev(reset, "e", 5, ""), ev(updated, "e", 5, "a")}, "inside the list"},
		{"sequence not increasing", &watcherv1.WatchRequest{}, []*watcherv1.WatchResponse{
			ev(reset, "e", 5, ""), ev(synced, "e", 5, ""), ev(updated, "e", 7, "a"), ev(updated, "e", 7, "b")}, "not after 7"},
		{"live event not after the list", &watcherv1.WatchRequest{}, []*watcherv1.WatchResponse{
			ev(reset, "e", 5, ""), ev(synced, "e", 5, ""), ev(updated, "e", 4, "a")}, "not after 5"},
		{"replay from before the cursor", &watcherv1.WatchRequest{ResumeAfter: &watcherv1.Cursor{Epoch: "e", Sequence: 5}}, []*watcherv1.WatchResponse{
			ev(updated, "e", 5, "a")}, "not after 5"},
		{"another epoch without RESET", &watcherv1.WatchRequest{ResumeAfter: &watcherv1.Cursor{Epoch: "e", Sequence: 5}}, []*watcherv1.WatchResponse{
			ev(updated, "f", 6, "a")}, "epoch"},
		{"a kind not asked for", &watcherv1.WatchRequest{Kinds: []watcherv1.Kind{watcherv1.Kind_KIND_PERSISTENT_VOLUME}}, []*watcherv1.WatchResponse{
			ev(reset, "e", 5, ""), ev(added, "e", 5, "a")}, "did not ask for"},
		{"key not the object's", &watcherv1.WatchRequest{}, []*watcherv1.WatchResponse{ev(reset, "e", 4, ""), ev(synced, "e", 4, ""), wrongKey}, "its object is"},
		{"resource_version not the object's", &watcherv1.WatchRequest{}, []*watcherv1.WatchResponse{ev(reset, "e", 4, ""), ev(synced, "e", 4, ""), wrongRV}, "resource_version"},
		{"object not Kubernetes protobuf", &watcherv1.WatchRequest{}, []*watcherv1.WatchResponse{ev(reset, "e", 4, ""), ev(synced, "e", 4, ""), undecodable}, "not a StorageClass"},
		{"JSON expected", &watcherv1.WatchRequest{Encoding: watcherv1.Encoding_ENCODING_JSON}, []*watcherv1.WatchResponse{ev(reset, "e", 4, ""), ev(added, "e", 4, "a")}, "not JSON"},
		{"progress marks", marks, []*watcherv1.WatchResponse{
			ev(reset, "e", 5, ""), ev(synced, "e", 5, ""), ev(mark, "e", 5, ""), ev(mark, "e", 9, ""), ev(mark, "e", 9, ""), ev(updated, "e", 10, "a"), ev(mark, "e", 12, "")}, ""},
		{"resumed at a mark", &watcherv1.WatchRequest{ProgressMarks: true, ResumeAfter: &watcherv1.Cursor{Epoch: "e", Sequence: 9}}, []*watcherv1.WatchResponse{
			ev(mark, "e", 9, ""), ev(updated, "e", 10, "a")}, ""},
		{"a mark not asked for", &watcherv1.WatchRequest{}, []*watcherv1.WatchResponse{ev(reset, "e", 5, ""), ev(synced, "e", 5, ""), ev(mark, "e", 6, "")}, "did not ask"},
		{"a mark first", marks, []*watcherv1.WatchResponse{ev(mark, "e", 5, "")}, "not RESET"},
		{"a mark in the list", marks, []*watcherv1.WatchResponse{ev(reset, "e", 5, ""), ev(mark, "e", 5, "")}, "inside a list"},
		{"a mark with a key", marks, []*watcherv1.WatchResponse{ev(reset, "e", 5, ""), ev(synced, "e", 5, ""), markWithKey}, "carries"},
		{"a mark going back", marks, []*watcherv1.WatchResponse{ev(reset, "e", 5, ""), ev(synced, "e", 5, ""), ev(updated, "e", 8, "a"), ev(mark, "e", 7, "")}, "behind"},
		{"an event at a mark's sequence", marks, []*watcherv1.WatchResponse{ev(reset, "e", 5, ""), ev(synced, "e", 5, ""), ev(mark, "e", 8, ""), ev(updated, "e", 8, "a")}, "not after 8"},
		{"a mark of another epoch", marks, []*watcherv1.WatchResponse{ev(reset, "e", 5, ""), ev(synced, "e", 5, ""), ev(mark, "f", 8, "")}, "epoch"},
		{"RESET going back", &watcherv1.WatchRequest{}, []*watcherv1.WatchResponse{
			ev(reset, "e", 5, ""), ev(synced, "e", 5, ""), ev(updated, "e", 8, "a"), ev(reset, "e", 7, "")}, "behind"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newStreamRules(tc.req)
			for i, e := range tc.events {
				err := r.observe(e)
				last := i == len(tc.events)-1
				switch {
				case !last && err != nil:
					t.Fatalf("event %d (%v): %v", i, e, err)
				case last && tc.want == "" && err != nil:
					t.Fatalf("last event: %v", err)
				case last && tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
					t.Fatalf("last event: error %v, want one saying %q", err, tc.want)
				}
			}
		})
	}
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// internalEverywhere answers Internal to every call, as a service that
// blames itself for every mistake of its callers.
func internalEverywhere(context.Context, any) (any, error) {
	return nil, status.Error(codes.Internal, "something went wrong")
}

type (
	badProvisioner struct {
		provisionerv1.UnimplementedProvisionerServiceServer
	}
	badReclaimer struct {
		reclaimerv1.UnimplementedReclaimerServiceServer
	}
	badBinder struct {
		binderv1.UnimplementedBinderServiceServer
	}
	badWatcher struct {
		watcherv1.UnimplementedWatcherServiceServer
	}
)

func (badProvisioner) Provision(ctx context.Context, r *provisionerv1.ProvisionRequest) (*provisionerv1.ProvisionResponse, error) {
	_, err := internalEverywhere(ctx, r)
	return nil, err
}

func (badProvisioner) DeleteVolume(ctx context.Context, r *provisionerv1.DeleteVolumeRequest) (*provisionerv1.DeleteVolumeResponse, error) {
	_, err := internalEverywhere(ctx, r)
	return nil, err
}

func (badReclaimer) Reclaim(ctx context.Context, r *reclaimerv1.ReclaimRequest) (*reclaimerv1.ReclaimResponse, error) {
	_, err := internalEverywhere(ctx, r)
	return nil, err
}

func (badBinder) GetClaim(ctx context.Context, r *binderv1.GetClaimRequest) (*binderv1.GetClaimResponse, error) {
	_, err := internalEverywhere(ctx, r)
	return nil, err
}

// The watcher streams but never lists: events without RESET and SYNCED.
func (badWatcher) GetStatus(context.Context, *watcherv1.GetStatusRequest) (*watcherv1.GetStatusResponse, error) {
	return &watcherv1.GetStatusResponse{Epoch: "e", Sequence: 3, OldestSequence: 1, Synced: true}, nil
}

func (badWatcher) Watch(req *watcherv1.WatchRequest, st watcherv1.WatcherService_WatchServer) error {
	return st.Send(ev(watcherv1.EventType_EVENT_TYPE_ADDED, "e", 3, "a"))
}

// Without Kubernetes, against implementations that get everything wrong,
// every check that can run fails (health and the TLS check pass: the
// servers do serve health and require certificates), the checks that need
// Kubernetes are skipped, and so are the provisioner's optional RPCs.
func TestBrokenImplementationsFail(t *testing.T) {
	certs, err := pki.Generate(t.TempDir(), "server", callers.Conformance)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		service  Service
		register func(*grpcutil.Server)
	}{
		{Provisioner, func(s *grpcutil.Server) { provisionerv1.RegisterProvisionerServiceServer(s.Server, badProvisioner{}) }},
		{Reclaimer, func(s *grpcutil.Server) { reclaimerv1.RegisterReclaimerServiceServer(s.Server, badReclaimer{}) }},
		{Binder, func(s *grpcutil.Server) { binderv1.RegisterBinderServiceServer(s.Server, badBinder{}) }},
		{Watcher, func(s *grpcutil.Server) { watcherv1.RegisterWatcherServiceServer(s.Server, badWatcher{}) }},
	} {
		t.Run(string(tc.service), func(t *testing.T) {
			srv, err := grpcutil.NewServer(discard(), grpcutil.ServerOptions{TLS: certs["server"]})
			if err != nil {
				t.Fatal(err)
			}
			tc.register(srv)
			srv.SetServing(true, serviceName(tc.service))
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			go func() { done <- srv.Serve(ctx, lis, time.Second) }()
			defer func() { cancel(); <-done }()

			results, err := Run(t.Context(), tc.service, Config{Address: lis.Addr().String(), TLS: certs[callers.Conformance], Timeout: 5 * time.Second}, nil)
			if err != nil {
				t.Fatal(err)
			}
			checks := map[string]Check{}
			for _, c := range Checks(tc.service) {
				checks[c.Name] = c
			}
			for _, r := range results {
				c := checks[r.Check]
				want := Failed
				switch {
				case len(c.Needs) > 0, r.Check == "provisioner/optional-rpcs":
					want = Skipped
				case strings.HasSuffix(r.Check, "/health"), strings.HasSuffix(r.Check, "/tls-client-certificate-required"):
					want = Passed
				}
				if r.Outcome != want {
					t.Errorf("%s: %s (%s), want %s", r.Check, r.Outcome, r.Message, want)
				}
			}
		})
	}
}
