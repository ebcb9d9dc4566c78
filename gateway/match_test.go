package gateway

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/volplane/volplane/pkg/grpcutil"
	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
)

// matchBinder records the MatchClaim requests it gets and answers them
// with err, or with the claim's name.
type matchBinder struct {
	binderv1.UnimplementedBinderServiceServer
	mu   sync.Mutex
	reqs []*binderv1.MatchClaimRequest
	err  error
}

func (b *matchBinder) MatchClaim(_ context.Context, req *binderv1.MatchClaimRequest) (*binderv1.MatchClaimResponse, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.reqs = append(b.reqs, req)
	if b.err != nil {
		return nil, b.err
	}
	meta := req.GetClaim().GetFields()["metadata"].GetStructValue().GetFields()
	return &binderv1.MatchClaimResponse{Message: "matched " + meta["name"].GetStringValue()}, nil
}

func (b *matchBinder) last() *binderv1.MatchClaimRequest {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.reqs) == 0 {
		return nil
	}
	return b.reqs[len(b.reqs)-1]
}

// POST /v1/claims:match takes the claim itself as the body, JSON or YAML;
// the namespaced route passes the path's namespace; a body that is not a
// claim object is 400; a field error the binder reports keeps its field in
// the JSON error.
func TestMatchBodies(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mb := &matchBinder{}
	srv := grpc.NewServer()
	binderv1.RegisterBinderServiceServer(srv, mb)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	g := startGateway(t, func(o *Options) {
		o.BinderAddress = lis.Addr().String()
		o.TLS = grpcutil.TLSFiles{InsecurePlaintext: true}
	})

	const yamlClaim = `apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: data
spec:
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 1Gi
`
	const jsonClaim = `{"apiVersion":"v1","kind":"PersistentVolumeClaim","metadata":{"name":"data"},"spec":{"accessModes":["ReadWriteOnce"],"resources":{"requests":{"storage":"1Gi"}}}}`
	for _, tc := range []struct {
		name, path, ctype, body string
		ns                      string
	}{
		{"yaml", "/v1/claims:match", "application/yaml", yamlClaim, ""},
		{"x-yaml", "/v1/claims:match", "application/x-yaml; charset=utf-8", yamlClaim, ""},
		{"json", "/v1/claims:match", "application/json", jsonClaim, ""},
		{"namespaced yaml", "/v1/namespaces/team/claims:match", "application/yaml", yamlClaim, "team"},
		{"namespace in the path wins over the query", "/v1/namespaces/team/claims:match?namespace=other", "application/json", jsonClaim, "team"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, e := g.do(t, "POST", tc.path, "viewer-token", strings.NewReader(tc.body), "Content-Type", tc.ctype)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s %v", resp.Status, e)
			}
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
				t.Errorf("answer Content-Type %q, want JSON", ct)
			}
			req := mb.last()
			spec := req.GetClaim().GetFields()["spec"].GetStructValue().GetFields()
			if got := spec["accessModes"].GetListValue().GetValues()[0].GetStringValue(); got != "ReadWriteOnce" {
				t.Errorf("claim reached the binder as %v", req.GetClaim())
			}
			if req.GetNamespace() != tc.ns {
				t.Errorf("namespace %q, want %q", req.GetNamespace(), tc.ns)
			}
		})
	}

	for _, tc := range []struct {
		name, ctype, body string
	}{
		{"not YAML", "application/yaml", "a: [b\n"},
		{"a list, not a claim", "application/json", `[1, 2]`},
		{"not JSON", "application/json", `{"metadata":`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, e := g.do(t, "POST", "/v1/claims:match", "viewer-token", strings.NewReader(tc.body), "Content-Type", tc.ctype)
			if resp.StatusCode != http.StatusBadRequest || e.Code != int(codes.InvalidArgument) {
				t.Fatalf("%s %v, want 400", resp.Status, e)
			}
		})
	}

	// The binder's field violations reach the caller.
	st, _ := status.New(codes.InvalidArgument, "the API server would not accept this claim: spec.accessModes: Required value").
		WithDetails(&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "spec.accessModes", Description: "Required value"}}})
	mb.mu.Lock()
	mb.err = st.Err()
	mb.mu.Unlock()
	req, _ := http.NewRequest("POST", g.url+"/v1/claims:match", strings.NewReader(jsonClaim))
	req.Header.Set("Authorization", "Bearer viewer-token")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out struct {
		Code    int
		Message string
		Details []struct {
			Type            string `json:"@type"`
			FieldViolations []struct{ Field, Description string }
		}
	}
	if err := json.Unmarshal(b, &out); err != nil || resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("%s %s", resp.Status, b)
	}
	if len(out.Details) != 1 || len(out.Details[0].FieldViolations) != 1 || out.Details[0].FieldViolations[0].Field != "spec.accessModes" {
		t.Fatalf("error details %s", b)
	}
}
