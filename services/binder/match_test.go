package binder

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"

	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
)

// recordingDryRun is a dry run that records what it is asked and answers
// with a claim of that namespace (it does not decode what it is sent: a
// quantity such as 1E-999999999 takes minutes to parse).
type recordingDryRun struct {
	mu    sync.Mutex
	calls []string
}

func (r *recordingDryRun) create(_ context.Context, namespace string, body []byte) (*corev1.PersistentVolumeClaim, error) {
	r.mu.Lock()
	r.calls = append(r.calls, string(body))
	r.mu.Unlock()
	return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "x", Namespace: namespace}}, nil
}

func (r *recordingDryRun) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.calls
	r.calls = nil
	return out
}

func claimJSON(t *testing.T, s string) *structpb.Struct {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatal(err)
	}
	st, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// deepClaim is a claim with a field nested n levels deep.
func deepClaim(n int) *structpb.Struct {
	s := structpb.NewStringValue("x")
	for range n {
		s = structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"a": s}})
	}
	return &structpb.Struct{Fields: map[string]*structpb.Value{
		"metadata": structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"name": structpb.NewStringValue("x")}}),
		"spec":     s,
	}}
}

// MatchClaim checks the claim itself, as the API server would, before the
// dry run: a claim the API server would refuse, or choke on, is
// InvalidArgument naming the field, and the API server is never asked.
func TestMatchValidatesBeforeTheDryRun(t *testing.T) {
	c := newController(slog.New(slog.NewTextHandler(io.Discard, nil)), fake.NewClientset(), record.NewFakeRecorder(10))
	c.Synced()
	dr := &recordingDryRun{}
	a := &api{c: c, memberID: "m", dryRun: dr.create}
	const valid = `{"metadata":{"name":"x"},"spec":{"accessModes":["ReadWriteOnce"],"resources":{"requests":{"storage":"%s"}}}}`
	quantity := func(q string) string { return strings.Replace(valid, "%s", q, 1) }
	if _, err := a.MatchClaim(t.Context(), &binderv1.MatchClaimRequest{Namespace: "team", Claim: claimJSON(t, quantity("1Gi"))}); err != nil {
		t.Fatalf("a valid claim: %v", err)
	}
	if calls := dr.take(); len(calls) != 1 {
		t.Fatalf("a valid claim: %d dry runs, want 1", len(calls))
	}
	for _, tc := range []struct {
		name  string
		claim *structpb.Struct
		field string // in the BadRequest details; "" when none
		in    string
	}{
		{"huge exponent", claimJSON(t, quantity("1E+999999999")), "spec.resources.requests[storage]", "out of range"},
		{"huge negative exponent", claimJSON(t, quantity("1E-999999999")), "spec.resources.requests[storage]", "out of range"},
		{"long mantissa, huge exponent", claimJSON(t, quantity("1234567890123456789E+99999")), "spec.resources.requests[storage]", "out of range"},
		{"beyond an int64", claimJSON(t, quantity("100E")), "spec.resources.requests[storage]", "8Ei"},
		{"a thousand digits", claimJSON(t, quantity(strings.Repeat("9", 1000))), "spec.resources.requests[storage]", "64 characters"},
		{"zero", claimJSON(t, quantity("0")), "spec.resources.requests[storage]", "greater than zero"},
		{"huge limit", claimJSON(t, strings.Replace(quantity("1Gi"), `"requests"`, `"limits":{"storage":"1e999999999"},"requests"`, 1)), "spec.resources.limits[storage]", "out of range"},
		{"huge status", claimJSON(t, strings.Replace(quantity("1Gi"), `"spec"`, `"status":{"capacity":{"storage":"1e-999999999"}},"spec"`, 1)), "status.capacity[storage]", "out of range"},
		{"no access modes", claimJSON(t, `{"metadata":{"name":"x"},"spec":{"resources":{"requests":{"storage":"1Gi"}}}}`), "spec.accessModes", "at least 1 access mode"},
		{"bad name", claimJSON(t, strings.Replace(quantity("1Gi"), `"x"`, `"X_x"`, 1)), "metadata.name", "RFC 1123"},
		{"bad class", claimJSON(t, strings.Replace(quantity("1Gi"), `"spec":{`, `"spec":{"storageClassName":"a b",`, 1)), "spec.storageClassName", "RFC 1123"},
		{"bad selector", claimJSON(t, strings.Replace(quantity("1Gi"), `"spec":{`, `"spec":{"selector":{"matchExpressions":[{"key":"a","operator":"Near"}]},`, 1)), "spec.selector.matchExpressions[0].operator", "Near"},
		{"unknown field", claimJSON(t, strings.Replace(quantity("1Gi"), `"spec":{`, `"spec":{"storageClas":"x",`, 1)), "", `unknown field "spec.storageClas"`},
		{"deep", deepClaim(500), "", "deeper than 100 levels"},
		{"deeper than protobuf decodes elsewhere", deepClaim(3000), "", "deeper than 100 levels"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			_, err := a.MatchClaim(t.Context(), &binderv1.MatchClaimRequest{Namespace: "team", Claim: tc.claim})
			if took := time.Since(start); took > time.Second {
				t.Errorf("took %v", took)
			}
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.in) {
				t.Fatalf("%v, want InvalidArgument with %q", err, tc.in)
			}
			if calls := dr.take(); len(calls) != 0 {
				t.Fatalf("the API server was asked: %v", calls)
			}
			if tc.field == "" {
				return
			}
			var fields []string
			for _, d := range status.Convert(err).Details() {
				if br, ok := d.(*errdetails.BadRequest); ok {
					for _, f := range br.GetFieldViolations() {
						fields = append(fields, f.GetField())
					}
				}
			}
			if !slices.Contains(fields, tc.field) {
				t.Errorf("field violations %v, want %s (%v)", fields, tc.field, err)
			}
		})
	}
}

// The dry run asks the API server to give up when the binder does (the
// timeout query parameter), as a server-side dry run, strictly.
func TestDryRunCarriesATimeout(t *testing.T) {
	var mu sync.Mutex
	var query string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		query = r.URL.RawQuery
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"apiVersion":"v1","kind":"PersistentVolumeClaim","metadata":{"name":"x","namespace":"team"}}`)
	}))
	defer srv.Close()
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	c := newController(slog.New(slog.NewTextHandler(io.Discard, nil)), cs, record.NewFakeRecorder(10))
	if _, err := c.apiDryRun(t.Context(), "team", []byte(`{"metadata":{"name":"x"}}`)); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, p := range []string{"dryRun=All", "fieldValidation=Strict", "timeout=" + askTimeout.String()} {
		if !strings.Contains(query, p) {
			t.Errorf("query %q lacks %s", query, p)
		}
	}
}
