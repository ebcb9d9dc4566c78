package timeline

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/encoding/protojson"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/volplane/volplane/gateway"
	"github.com/volplane/volplane/internal/devcsi"
	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	"github.com/volplane/volplane/test/harness/e2e"
)

// TestTimelineOfASlowProvisioning: a claim provisioned through a driver
// that takes createDelay per CreateVolume has a timeline, served by the
// gateway to a viewer, whose CreateVolume span takes at least that long
// and is the longest step; a caller without the role gets 403 as for
// explain; the binder's and the provisioner's spans, and the CSI call, are
// one OpenTelemetry trace.
func TestTimelineOfASlowProvisioning(t *testing.T) {
	ns := e2e.Namespace(t, cluster.client)
	policy := corev1.PersistentVolumeReclaimDelete
	sc := e2e.CreateClass(t, cluster.client, &storagev1.StorageClass{
		ObjectMeta: metav1.ObjectMeta{Name: "slow-" + ns}, Provisioner: devcsi.DefaultName, ReclaimPolicy: &policy,
		Parameters: map[string]string{"never-shown": "class-parameter-value"},
	})
	claim, err := cluster.client.CoreV1().PersistentVolumeClaims(ns).Create(t.Context(), e2e.Claim(ns, "slow", "1Gi", sc.Name), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e2e.ClaimPhase(t, cluster.client, ns, "slow", corev1.ClaimBound, 60*time.Second)

	g := startGateway(t, ns)
	path := "/v1/namespaces/" + ns + "/claims/slow:timeline"
	var tl binderv1.GetClaimTimelineResponse
	e2e.Eventually(t, 20*time.Second, func() string {
		code, body := g.get(t, path, g.viewer)
		if code != http.StatusOK {
			return body
		}
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal([]byte(body), &tl); err != nil {
			return err.Error()
		}
		if span(&tl, "binder", "bind claim") == nil {
			return "no bind claim span yet: " + body
		}
		return ""
	})
	body, _ := protojson.Marshal(&tl)
	t.Logf("timeline: %s", body)
	if strings.Contains(string(body), "class-parameter-value") {
		t.Error("the timeline shows a class parameter")
	}
	if tl.GetClaim().GetUid() != string(claim.UID) || len(tl.GetMissing()) != 0 {
		t.Errorf("claim %s, missing %v", tl.GetClaim().GetUid(), tl.GetMissing())
	}
	cv := span(&tl, "provisioner", "CreateVolume")
	if cv == nil {
		t.Fatalf("no CreateVolume span")
	}
	if d := duration(cv); d < createDelay || cv.GetCode() != "OK" || cv.GetDetail() != "pvc-"+string(claim.UID) {
		t.Errorf("CreateVolume took %s (want at least %s), code %s, detail %q", d, createDelay, cv.GetCode(), cv.GetDetail())
	}
	for _, s := range tl.GetSpans() {
		if s != cv && s.GetName() != "provision" && duration(s) > duration(cv) {
			t.Errorf("%s/%s took %s, longer than CreateVolume", s.GetService(), s.GetName(), duration(s))
		}
	}
	// The claim's way to the binder: created → the watcher's informer
	// (watch) → the binder (stream), in that order, none negative, and
	// before the binder queued the claim; this watcher sends its observed
	// time, so no single seen span.
	watch, stream, queued := span(&tl, "binder", "watch"), span(&tl, "binder", "stream"), span(&tl, "binder", "queued")
	switch {
	case watch == nil || stream == nil || queued == nil:
		t.Errorf("no watch, stream or queued span: %v, %v, %v", watch, stream, queued)
	case span(&tl, "binder", "seen") != nil:
		t.Errorf("a seen span from a watcher that sends its observed time: %v", span(&tl, "binder", "seen"))
	case duration(watch) < 0 || duration(stream) < 0:
		t.Errorf("negative: watch %s, stream %s", duration(watch), duration(stream))
	case !watch.GetStartTime().AsTime().Equal(claim.CreationTimestamp.Time) || !watch.GetEndTime().AsTime().Equal(stream.GetStartTime().AsTime()) ||
		stream.GetEndTime().AsTime().After(queued.GetStartTime().AsTime()):
		t.Errorf("not created (%s) → watch %s..%s → stream %s..%s → queued at %s", claim.CreationTimestamp.Time,
			watch.GetStartTime().AsTime(), watch.GetEndTime().AsTime(), stream.GetStartTime().AsTime(), stream.GetEndTime().AsTime(), queued.GetStartTime().AsTime())
	case !strings.Contains(watch.GetDetail(), "whole seconds"):
		t.Errorf("watch detail %q does not say the creationTimestamp has whole seconds", watch.GetDetail())
	}
	for _, want := range [][2]string{{"binder", "queued"}, {"binder", "sync"}, {"binder", "provision"},
		{"provisioner", "provision"}, {"provisioner", "write PV"}, {"binder", "bind volume"}} {
		if span(&tl, want[0], want[1]) == nil {
			t.Errorf("no %s span of the %s", want[1], want[0])
		}
	}
	if p := span(&tl, "binder", "provision"); p != nil && (p.GetCode() != "FINISHED" || duration(p) < createDelay) {
		t.Errorf("binder's provision span: %s, %s", p.GetCode(), duration(p))
	}

	t.Run("no role: 403 as explain", func(t *testing.T) {
		for _, route := range []string{path, "/v1/namespaces/" + ns + "/claims/slow:explain"} {
			code, msg := g.get(t, route, g.nobody)
			sub := route[strings.LastIndex(route, ":")+1:]
			if code != http.StatusForbidden || !strings.Contains(msg, `cannot get resource "claims/`+sub+`"`) || !strings.Contains(msg, "volplane.io") {
				t.Errorf("%s: %d %s", route, code, msg)
			}
		}
	})
	t.Run("unknown claim", func(t *testing.T) {
		if code, msg := g.get(t, "/v1/namespaces/"+ns+"/claims/nope:timeline", g.viewer); code != http.StatusNotFound {
			t.Errorf("%d %s", code, msg)
		}
	})

	t.Run("one trace across binder, provisioner and the CSI call", func(t *testing.T) {
		trace := cv.GetTraceId()
		if trace == "" {
			t.Fatal("the CreateVolume span has no trace ID with tracing on")
		}
		if p := span(&tl, "binder", "provision"); p.GetTraceId() != trace {
			t.Errorf("binder's provision span is in trace %s, CreateVolume in %s", p.GetTraceId(), trace)
		}
		if tp := cluster.csiCalls.traceparentOf("pvc-" + string(claim.UID)); !strings.Contains(tp, "-"+trace+"-") {
			t.Errorf("CreateVolume reached the driver with traceparent %q, want trace %s", tp, trace)
		}
		e2e.Eventually(t, 20*time.Second, func() string {
			services := map[string]bool{}
			for _, e := range cluster.collector.all() {
				if hex.EncodeToString(e.span.GetTraceId()) == trace {
					services[e.service+"/"+e.span.GetName()] = true
				}
			}
			for _, want := range []string{"volplane-binder/provision", "volplane-provisioner/provision", "volplane-provisioner/CreateVolume"} {
				if !services[want] {
					return "trace " + trace + " has no exported " + want + " span yet"
				}
			}
			return ""
		})
	})
}

func span(tl *binderv1.GetClaimTimelineResponse, service, name string) *provisionerv1.TimelineSpan {
	for _, s := range tl.GetSpans() {
		if s.GetService() == service && s.GetName() == name {
			return s
		}
	}
	return nil
}

func duration(s *provisionerv1.TimelineSpan) time.Duration {
	return s.GetEndTime().AsTime().Sub(s.GetStartTime().AsTime())
}

// restGateway is a gateway with real authentication and the shipped
// roles: viewer is bound to volplane-viewer, nobody to nothing.
type restGateway struct {
	url            string
	viewer, nobody string
}

func startGateway(t *testing.T, ns string) *restGateway {
	t.Helper()
	for _, file := range []string{"roles.yaml", "rbac.yaml"} {
		for _, cr := range clusterRoles(t, file) {
			applyClusterRole(t, cr)
		}
	}
	g := &restGateway{viewer: saToken(t, ns, "viewer"), nobody: saToken(t, ns, "nobody")}
	crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: ns + "-viewer"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "volplane-viewer"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "viewer", Namespace: ns}}}
	if _, err := cluster.client.RbacV1().ClusterRoleBindings().Create(t.Context(), crb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr()
	o := gateway.Options{
		Listen: addr, BinderAddress: cluster.binderAddr, WatcherAddress: cluster.watchAddr, ProvisionerAddress: cluster.provAddr,
		TLS:    cluster.e2e.TLS("gateway"),
		Auth:   gateway.AuthOptions{RESTConfig: cluster.env.RESTConfig},
		Logger: cluster.e2e.Logger("gateway", slog.LevelDebug),
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gateway.Run(ctx, o) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("gateway.Run: %v", err)
		}
	})
	g.url = "http://" + addr
	e2e.Eventually(t, 30*time.Second, func() string {
		resp, err := http.Get(g.url + "/healthz")
		if err != nil {
			return err.Error()
		}
		resp.Body.Close()
		return ""
	})
	return g
}

// get calls the gateway as token's user: the status and the body (the
// message of an error).
func (g *restGateway) get(t *testing.T, path, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), "GET", g.url+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var e struct{ Message string }
	if resp.StatusCode >= 300 && json.Unmarshal(raw, &e) == nil && e.Message != "" {
		return resp.StatusCode, e.Message
	}
	return resp.StatusCode, string(raw)
}

// clusterRoles reads the ClusterRoles of a file of deploy/kubernetes.
func clusterRoles(t *testing.T, file string) []*rbacv1.ClusterRole {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", "..", "deploy", "kubernetes", file))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []*rbacv1.ClusterRole
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); errors.Is(err, io.EOF) {
			return out
		} else if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		var doc metav1.TypeMeta
		if len(raw) == 0 || string(raw) == "null" || json.Unmarshal(raw, &doc) != nil || doc.Kind != "ClusterRole" {
			continue
		}
		cr := &rbacv1.ClusterRole{}
		if err := json.Unmarshal(raw, cr); err != nil {
			t.Fatal(err)
		}
		out = append(out, cr)
	}
}

func applyClusterRole(t *testing.T, cr *rbacv1.ClusterRole) {
	t.Helper()
	c := cluster.client.RbacV1().ClusterRoles()
	if _, err := c.Create(t.Context(), cr, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		old, err := c.Get(t.Context(), cr.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cr.ResourceVersion = old.ResourceVersion
		if _, err := c.Update(t.Context(), cr, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	} else if err != nil {
		t.Fatal(err)
	}
}

// saToken creates a ServiceAccount and mints a token for it.
func saToken(t *testing.T, ns, name string) string {
	t.Helper()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := cluster.client.CoreV1().ServiceAccounts(ns).Create(t.Context(), sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := cluster.client.CoreV1().ServiceAccounts(ns).CreateToken(t.Context(), name, &authnv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// TestTimelineOfAWaitForFirstConsumer: a claim of a WaitForFirstConsumer
// class shows its wait for a pod as one span, open (WAITING) while no
// node is selected, then closed by the sync that sees the scheduler's
// choice, naming the node, and at least as long as the claim waited.
func TestTimelineOfAWaitForFirstConsumer(t *testing.T) {
	ns := e2e.Namespace(t, cluster.client)
	policy := corev1.PersistentVolumeReclaimDelete
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	sc := e2e.CreateClass(t, cluster.client, &storagev1.StorageClass{
		ObjectMeta: metav1.ObjectMeta{Name: "wffc-" + ns}, Provisioner: devcsi.DefaultName, ReclaimPolicy: &policy, VolumeBindingMode: &wffc,
	})
	if _, err := cluster.client.CoreV1().PersistentVolumeClaims(ns).Create(t.Context(), e2e.Claim(ns, "late", "1Gi", sc.Name), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	g := startGateway(t, ns)
	path := "/v1/namespaces/" + ns + "/claims/late:timeline"
	read := func() (*binderv1.GetClaimTimelineResponse, string) {
		code, body := g.get(t, path, g.viewer)
		if code != http.StatusOK {
			return nil, body
		}
		var tl binderv1.GetClaimTimelineResponse
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal([]byte(body), &tl); err != nil {
			return nil, err.Error()
		}
		return &tl, body
	}
	var open *provisionerv1.TimelineSpan
	e2e.Eventually(t, 20*time.Second, func() string {
		tl, body := read()
		if tl == nil {
			return body
		}
		if open = span(tl, "binder", "wait for first consumer"); open == nil || open.GetCode() != "WAITING" {
			return "no open wait span yet: " + body
		}
		return ""
	})
	// Wait a little more, as a pod would, then the scheduler's choice.
	waited := time.Now()
	e2e.Eventually(t, 10*time.Second, func() string {
		if tl, _ := read(); tl != nil {
			if s := span(tl, "binder", "wait for first consumer"); s != nil && duration(s) >= time.Second {
				return ""
			}
		}
		return "the open wait span does not grow"
	})
	claim, err := cluster.client.CoreV1().PersistentVolumeClaims(ns).Get(t.Context(), "late", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	metav1.SetMetaDataAnnotation(&claim.ObjectMeta, "volume.kubernetes.io/selected-node", "node-a")
	if _, err := cluster.client.CoreV1().PersistentVolumeClaims(ns).Update(t.Context(), claim, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	selected := time.Now()
	e2e.ClaimPhase(t, cluster.client, ns, "late", corev1.ClaimBound, 60*time.Second)
	var closed *provisionerv1.TimelineSpan
	e2e.Eventually(t, 20*time.Second, func() string {
		tl, body := read()
		if tl == nil {
			return body
		}
		if closed = span(tl, "binder", "wait for first consumer"); closed == nil || closed.GetCode() == "WAITING" {
			return "the wait span is not closed: " + body
		}
		return ""
	})
	t.Logf("wait span: %v", closed)
	if !strings.Contains(closed.GetDetail(), `"node-a"`) || !closed.GetStartTime().AsTime().Equal(open.GetStartTime().AsTime()) ||
		closed.GetEndTime().AsTime().Before(waited) || duration(closed) < selected.Sub(open.GetStartTime().AsTime())-time.Second {
		t.Errorf("closed wait span %v (open one began %s, node selected at %s)", closed, open.GetStartTime().AsTime(), selected)
	}
}

// TestReclaimSpansOfADeletedClaim: deleting a claim whose volume's policy
// is Delete gives the reclaimer's spans to the OTLP collector (they are in
// no timeline the API serves: the claim is gone), named after the volume
// and the claim's UID: an attempt that SUCCEEDED, its DeleteVolume and its
// PV deletion, in one trace, which the provisioner's CSI DeleteVolume call
// carries on.
func TestReclaimSpansOfADeletedClaim(t *testing.T) {
	ns := e2e.Namespace(t, cluster.client)
	policy := corev1.PersistentVolumeReclaimDelete
	sc := e2e.CreateClass(t, cluster.client, &storagev1.StorageClass{
		ObjectMeta: metav1.ObjectMeta{Name: "gone-" + ns}, Provisioner: devcsi.DefaultName, ReclaimPolicy: &policy,
	})
	claim, err := cluster.client.CoreV1().PersistentVolumeClaims(ns).Create(t.Context(), e2e.Claim(ns, "gone", "1Gi", sc.Name), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e2e.ClaimPhase(t, cluster.client, ns, "gone", corev1.ClaimBound, 60*time.Second)
	pvName := "pvc-" + string(claim.UID)
	pv, err := cluster.client.CoreV1().PersistentVolumes().Get(t.Context(), pvName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := cluster.client.CoreV1().PersistentVolumeClaims(ns).Delete(t.Context(), "gone", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e2e.Eventually(t, 60*time.Second, func() string {
		if _, err := cluster.client.CoreV1().PersistentVolumes().Get(t.Context(), pvName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return "the volume is not deleted yet"
		}
		return ""
	})
	attr := func(sp *tracepb.Span, key string) string {
		for _, kv := range sp.GetAttributes() {
			if kv.GetKey() == key {
				return kv.GetValue().GetStringValue()
			}
		}
		return ""
	}
	var spans map[string]*tracepb.Span
	e2e.Eventually(t, 20*time.Second, func() string {
		spans = map[string]*tracepb.Span{}
		for _, e := range cluster.collector.all() {
			if e.service != "volplane-reclaimer" || attr(e.span, "volplane.claim.uid") != string(claim.UID) {
				continue
			}
			if attr(e.span, "volplane.volume.name") != pvName || attr(e.span, "volplane.claim") != ns+"/gone" {
				return "a reclaim span without the volume or the claim: " + e.span.String()
			}
			if e.span.GetName() == "reclaim" && attr(e.span, "volplane.reclaim.state") != "STATE_SUCCEEDED" {
				continue // an earlier attempt
			}
			spans[e.span.GetName()] = e.span
		}
		for _, want := range []string{"reclaim", "DeleteVolume", "delete PV"} {
			if spans[want] == nil {
				return "no exported reclaimer " + want + " span of the claim's UID yet"
			}
		}
		return ""
	})
	trace := spans["reclaim"].GetTraceId()
	for name, sp := range spans {
		t.Logf("reclaimer span %s: %s, %s", name, time.Duration(sp.GetEndTimeUnixNano()-sp.GetStartTimeUnixNano()), attr(sp, "volplane.detail"))
		if hex.EncodeToString(sp.GetTraceId()) != hex.EncodeToString(trace) || sp.GetEndTimeUnixNano() < sp.GetStartTimeUnixNano() {
			t.Errorf("%s: trace %x (the attempt's %x), %d..%d", name, sp.GetTraceId(), trace, sp.GetStartTimeUnixNano(), sp.GetEndTimeUnixNano())
		}
	}
	if code := attr(spans["DeleteVolume"], "volplane.code"); code != "OK" {
		t.Errorf("DeleteVolume span code %q", code)
	}
	if tp := cluster.csiCalls.traceparentOf("delete " + pv.Spec.CSI.VolumeHandle); !strings.Contains(tp, "-"+hex.EncodeToString(trace)+"-") {
		t.Errorf("the driver's DeleteVolume arrived with traceparent %q, want trace %x", tp, trace)
	}
}
