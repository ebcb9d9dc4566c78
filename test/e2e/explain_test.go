package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/gateway"
	"github.com/volplane/volplane/pkg/kube"
	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
)

// binderClient dials the shared binder as the tests.
func binderClient(t *testing.T) binderv1.BinderServiceClient {
	t.Helper()
	cc, err := cluster.e2e.Dial(cluster.binderAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return binderv1.NewBinderServiceClient(cc)
}

// claimStruct is a claim as MatchClaim takes it over gRPC.
func claimStruct(t *testing.T, c *corev1.PersistentVolumeClaim) *structpb.Struct {
	t.Helper()
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	s, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// cachedByBinder waits until the binder's cache holds each volume at the
// resourceVersion the API server has once its phase is settled (the binder
// wrote it): a match or an explain then sees what the binder's sync sees.
func cachedByBinder(t *testing.T, bc binderv1.BinderServiceClient, names ...string) {
	t.Helper()
	for _, name := range names {
		eventually(t, 30*time.Second, func() string {
			v := getPV(t, name)
			if v == nil {
				return "PV " + name + " not found"
			}
			if v.Status.Phase == "" || v.Status.Phase == corev1.VolumePending {
				return "PV " + name + " has no phase yet"
			}
			got, err := bc.GetVolume(t.Context(), &binderv1.GetVolumeRequest{Name: name})
			if err != nil {
				return err.Error()
			}
			if got.GetVolume().GetResourceVersion() != v.ResourceVersion {
				return fmt.Sprintf("binder has %s at %s, the API server at %s", name, got.GetVolume().GetResourceVersion(), v.ResourceVersion)
			}
			return ""
		})
	}
}

// One binding case: volumes, a claim, and what Kubernetes' PV controller
// does with them.
type bindCase struct {
	name string
	// class: a StorageClass of the test's class name with this binding
	// mode and a provisioner volplane does not serve; "" makes none.
	class storagev1.VolumeBindingMode
	// volumes are made with the test's class; their names get the
	// namespace as a prefix.
	volumes []func(n, cls string) *corev1.PersistentVolume
	claim   func(n, cls string) *corev1.PersistentVolumeClaim
	// decision and wouldBind (a volume name without the prefix) are what
	// the binder must do; event is what the claim then shows when it is
	// not bound.
	decision  binderv1.Decision
	wouldBind string
	event     string
	// how is part of ExplainClaim's account of the binding afterwards.
	how string
}

func pvf(name, size string, opts ...pvOpt) func(n, cls string) *corev1.PersistentVolume {
	return func(n, cls string) *corev1.PersistentVolume { return newPV(n+"-"+name, size, cls, opts...) }
}

// The binding cases of binding_test.go, each asked first as a match (what
// would happen if the claim were created now), then created for real: the
// volume match says the binder would bind is the one it binds, and a claim
// it does not bind shows the event of match's decision. ExplainClaim and
// MatchClaim decide with the same code (judge, bestLocked), so this is
// explain's "would bind" proven against the running services.
func TestMatchPredictsTheBinder(t *testing.T) {
	rwoRwx := func(v *corev1.PersistentVolume) {
		v.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce, corev1.ReadWriteMany}
	}
	gold := func(v *corev1.PersistentVolume) { v.Labels = map[string]string{"tier": "gold"} }
	block := func(v *corev1.PersistentVolume) { m := corev1.PersistentVolumeBlock; v.Spec.VolumeMode = &m }
	claim := func(size string, opts ...pvcOpt) func(n, cls string) *corev1.PersistentVolumeClaim {
		return func(n, cls string) *corev1.PersistentVolumeClaim { return newPVC(n, "data", size, cls, opts...) }
	}
	selectGold := func(c *corev1.PersistentVolumeClaim) {
		c.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "gold"}}
	}
	for _, tc := range []bindCase{
		{name: "best match", volumes: []func(n, cls string) *corev1.PersistentVolume{pvf("10g", "10Gi"), pvf("5g", "5Gi"), pvf("1g", "1Gi")},
			claim: claim("3Gi"), decision: binderv1.Decision_DECISION_BIND, wouldBind: "5g", how: "chose volume"},
		{name: "fewest access modes first", volumes: []func(n, cls string) *corev1.PersistentVolume{pvf("rwx", "1Gi", rwoRwx), pvf("rwo", "9Gi")},
			claim: claim("1Gi"), decision: binderv1.Decision_DECISION_BIND, wouldBind: "rwo", how: "chose volume"},
		{name: "selector", volumes: []func(n, cls string) *corev1.PersistentVolume{pvf("plain", "1Gi"), pvf("gold", "5Gi", gold)},
			claim: claim("1Gi", selectGold), decision: binderv1.Decision_DECISION_BIND, wouldBind: "gold", how: "chose volume"},
		{name: "block", volumes: []func(n, cls string) *corev1.PersistentVolume{pvf("fs", "1Gi"), pvf("block", "5Gi", block)},
			claim: claim("1Gi", blockMode()), decision: binderv1.Decision_DECISION_BIND, wouldBind: "block", how: "chose volume"},
		{name: "volume pre-bound by user", volumes: []func(n, cls string) *corev1.PersistentVolume{pvf("small", "1Gi"),
			func(n, cls string) *corev1.PersistentVolume {
				return newPV(n+"-big", "9Gi", cls, withClaimRef(n, "data", ""))
			}},
			claim: claim("1Gi"), decision: binderv1.Decision_DECISION_BIND, wouldBind: "big", how: "pre-bound volume"},
		{name: "claim pre-bound by user", volumes: []func(n, cls string) *corev1.PersistentVolume{pvf("small", "1Gi"), pvf("big", "9Gi")},
			claim: func(n, cls string) *corev1.PersistentVolumeClaim {
				return newPVC(n, "data", "1Gi", cls, wantVolume(n+"-big"))
			}, decision: binderv1.Decision_DECISION_BIND, wouldBind: "big", how: "pre-bound: the claim named volume"},
		{name: "named volume missing", claim: func(n, cls string) *corev1.PersistentVolumeClaim {
			return newPVC(n, "data", "1Gi", cls, wantVolume(n+"-later"))
		}, decision: binderv1.Decision_DECISION_VOLUME_MISSING},
		{name: "named volume too small", volumes: []func(n, cls string) *corev1.PersistentVolume{pvf("small", "1Gi")},
			claim: func(n, cls string) *corev1.PersistentVolumeClaim {
				return newPVC(n, "data", "5Gi", cls, wantVolume(n+"-small"))
			}, decision: binderv1.Decision_DECISION_VOLUME_MISMATCH, event: kube.EventVolumeMismatch},
		{name: "named volume taken", volumes: []func(n, cls string) *corev1.PersistentVolume{func(n, cls string) *corev1.PersistentVolume {
			return newPV(n+"-taken", "1Gi", cls, withClaimRef(n, "other", "uid-of-other"))
		}}, claim: func(n, cls string) *corev1.PersistentVolumeClaim {
			return newPVC(n, "data", "1Gi", cls, wantVolume(n+"-taken"))
		}, decision: binderv1.Decision_DECISION_VOLUME_TAKEN, event: kube.EventFailedBinding},
		{name: "no class nothing fits", volumes: []func(n, cls string) *corev1.PersistentVolume{pvf("classy", "1Gi")},
			claim:    func(n, _ string) *corev1.PersistentVolumeClaim { return newPVC(n, "data", "1Gi", "") },
			decision: binderv1.Decision_DECISION_NO_MATCH, event: kube.EventFailedBinding},
		{name: "wait for first consumer", class: storagev1.VolumeBindingWaitForFirstConsumer,
			volumes: []func(n, cls string) *corev1.PersistentVolume{pvf("free", "1Gi")},
			claim:   claim("1Gi"), decision: binderv1.Decision_DECISION_WAIT_FOR_FIRST_CONSUMER, event: kube.EventWaitForFirstConsumer},
		{name: "wait for first consumer takes a pre-bound volume", class: storagev1.VolumeBindingWaitForFirstConsumer,
			volumes: []func(n, cls string) *corev1.PersistentVolume{pvf("free", "1Gi"), func(n, cls string) *corev1.PersistentVolume {
				return newPV(n+"-pre", "2Gi", cls, withClaimRef(n, "data", ""))
			}}, claim: claim("1Gi"), decision: binderv1.Decision_DECISION_BIND, wouldBind: "pre", how: "pre-bound volume"},
		{name: "external provisioning", class: storagev1.VolumeBindingImmediate,
			volumes: []func(n, cls string) *corev1.PersistentVolume{pvf("small", "1Gi")},
			claim:   claim("5Gi"), decision: binderv1.Decision_DECISION_PROVISION, event: kube.EventExternalProvisioning},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bc := binderClient(t)
			n := ns(t)
			cls := n
			if tc.class != "" {
				createClass(t, cls, "example.com/external", tc.class)
			}
			var names []string
			for _, mk := range tc.volumes {
				v := mk(n, cls)
				createPV(t, v.Name, v.Spec.Capacity.Storage().String(), v.Spec.StorageClassName, func(p *corev1.PersistentVolume) { *p = *v })
				names = append(names, v.Name)
			}
			cachedByBinder(t, bc, names...)
			want := ""
			if tc.wouldBind != "" {
				want = n + "-" + tc.wouldBind
			}

			c := tc.claim(n, cls)
			m, err := bc.MatchClaim(t.Context(), &binderv1.MatchClaimRequest{Claim: claimStruct(t, c)})
			if err != nil {
				t.Fatal(err)
			}
			if m.Decision != tc.decision || m.WouldBind != want {
				t.Fatalf("match: %v would bind %q (%s), want %v and %q", m.Decision, m.WouldBind, m.Message, tc.decision, want)
			}
			if m.GetClaim().GetNamespace() != n || m.GetClaim().GetName() != "data" {
				t.Errorf("match's claim %v", m.GetClaim())
			}

			created, err := cluster.client.CoreV1().PersistentVolumeClaims(n).Create(t.Context(), c, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if want != "" {
				bound := pvcPhase(t, n, "data", corev1.ClaimBound)
				if bound.Spec.VolumeName != want {
					t.Fatalf("match said %s, the binder bound %s", want, bound.Spec.VolumeName)
				}
				ex, err := bc.ExplainClaim(t.Context(), &binderv1.ExplainClaimRequest{Namespace: n, Name: "data"})
				if err != nil {
					t.Fatal(err)
				}
				if ex.Decision != binderv1.Decision_DECISION_BOUND || ex.Binding.GetVolumeName() != want || !strings.Contains(ex.Binding.GetMessage(), tc.how) {
					t.Fatalf("explain after the bind: %v %v", ex.Decision, ex.Binding)
				}
				return
			}
			if tc.event != "" {
				hasEvent(t, n, "PersistentVolumeClaim", "data", tc.event, "")
			}
			pvcPhase(t, n, "data", corev1.ClaimPending)
			// The live claim, explained, gets the decision match gave. A
			// claim the API server shows may not have reached the binder
			// yet (a case without an event proves nothing was synced).
			var ex *binderv1.ExplainClaimResponse
			eventually(t, 30*time.Second, func() string {
				var err error
				if ex, err = bc.ExplainClaim(t.Context(), &binderv1.ExplainClaimRequest{Namespace: n, Name: "data"}); err != nil {
					return err.Error()
				}
				return ""
			})
			if ex.Decision != tc.decision || ex.WouldBind != "" || ex.GetClaim().GetUid() != string(created.UID) {
				t.Fatalf("explain of the pending claim: %v would bind %q (%s)", ex.Decision, ex.WouldBind, ex.Message)
			}
		})
	}
}

// A claim that cannot bind: explain lists every volume of its class, in
// the binder's order, each with the rule that rejects it, and pages them.
func TestExplainPendingClaim(t *testing.T) {
	bc := binderClient(t)
	n := ns(t)
	cls := n
	hold := "e2e.volplane.io/hold"
	createPV(t, n+"-small", "1Gi", cls, func(v *corev1.PersistentVolume) { v.Labels = map[string]string{"tier": "gold"} })
	createPV(t, n+"-block", "5Gi", cls, func(v *corev1.PersistentVolume) {
		m := corev1.PersistentVolumeBlock
		v.Spec.VolumeMode, v.Labels = &m, map[string]string{"tier": "gold"}
	})
	createPV(t, n+"-rox", "5Gi", cls, func(v *corev1.PersistentVolume) {
		v.Spec.AccessModes, v.Labels = []corev1.PersistentVolumeAccessMode{corev1.ReadOnlyMany}, map[string]string{"tier": "gold"}
	})
	createPV(t, n+"-silver", "5Gi", cls, func(v *corev1.PersistentVolume) { v.Labels = map[string]string{"tier": "silver"} })
	createPV(t, n+"-leaving", "6Gi", cls, func(v *corev1.PersistentVolume) {
		v.Labels, v.Finalizers = map[string]string{"tier": "gold"}, []string{hold}
	})
	createPV(t, n+"-other-class", "5Gi", "elsewhere-"+n)
	cachedByBinder(t, bc, n+"-small", n+"-block", n+"-rox", n+"-silver", n+"-leaving")
	// Being deleted: the finalizer keeps it until the test ends.
	if err := cluster.client.CoreV1().PersistentVolumes().Delete(t.Context(), n+"-leaving", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p := []byte(`{"metadata":{"finalizers":null}}`)
		_, _ = cluster.client.CoreV1().PersistentVolumes().Patch(context.Background(), n+"-leaving", "application/merge-patch+json", p, metav1.PatchOptions{})
	})
	eventually(t, 30*time.Second, func() string {
		v, err := bc.GetVolume(t.Context(), &binderv1.GetVolumeRequest{Name: n + "-leaving"})
		if err != nil || !v.GetVolume().GetDeleting() {
			return fmt.Sprintf("binder does not see %s-leaving being deleted: %v", n, err)
		}
		return ""
	})
	createPVC(t, n, "data", "2Gi", cls, func(c *corev1.PersistentVolumeClaim) {
		c.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "gold"}}
	})
	hasEvent(t, n, "PersistentVolumeClaim", "data", kube.EventProvisioningFailed, "not found")

	var all []*binderv1.Candidate
	token := ""
	for {
		ex, err := bc.ExplainClaim(t.Context(), &binderv1.ExplainClaimRequest{Namespace: n, Name: "data", PageSize: 2, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		if ex.Decision != binderv1.Decision_DECISION_PROVISION || ex.WouldBind != "" || ex.TotalCandidates != 5 {
			t.Fatalf("%v would bind %q, %d candidates: %s", ex.Decision, ex.WouldBind, ex.TotalCandidates, ex.Message)
		}
		if p := ex.GetProvisioning(); p.GetClassFound() || !strings.Contains(p.GetMessage(), "not found") {
			t.Errorf("provisioning %v", p)
		}
		all = append(all, ex.Candidates...)
		if token = ex.NextPageToken; token == "" {
			break
		}
	}
	var got []string
	for i, c := range all {
		if int(c.Rank) != i+1 {
			t.Errorf("candidate %s has rank %d at %d", c.Name, c.Rank, i+1)
		}
		got = append(got, strings.TrimPrefix(c.Name, n+"-")+":"+strings.TrimPrefix(c.RejectedBy.String(), "RULE_"))
	}
	// ReadOnlyMany before ReadWriteOnce (groups by name when the mode
	// counts tie), then capacity and name: the binder's order.
	want := "rox:ACCESS_MODES small:CAPACITY block:VOLUME_MODE silver:LABEL_SELECTOR leaving:DELETING"
	if strings.Join(got, " ") != want {
		t.Fatalf("candidates %s\nwant       %s", strings.Join(got, " "), want)
	}
	for _, c := range all {
		if c.Message == "" {
			t.Errorf("%s: no message", c.Name)
		}
	}
}

// A volume another binder replica holds in etcd is "reserved elsewhere";
// once the hold is gone the binder binds the volume explain named.
func TestExplainReservedElsewhere(t *testing.T) {
	bc := binderClient(t)
	n := ns(t)
	vol := n + "-held"
	createPV(t, vol, "1Gi", n)
	cachedByBinder(t, bc, vol)
	etcd, err := clientv3.New(clientv3.Config{Endpoints: cluster.env.EtcdEndpoints, DialTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer etcd.Close()
	key := "/volplane/reservations/pv/" + vol
	if _, err := etcd.Put(t.Context(), key, "another-replica"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = etcd.Delete(context.Background(), key) })
	createPVC(t, n, "data", "1Gi", n)
	// Each sync tries the volume, meets the hold and skips the volume for
	// a while (foreign); explain then says so.
	eventually(t, 30*time.Second, func() string {
		if _, err := bc.SyncClaim(t.Context(), &binderv1.SyncClaimRequest{Namespace: n, Name: "data"}); err != nil {
			return err.Error()
		}
		ex, err := bc.ExplainClaim(t.Context(), &binderv1.ExplainClaimRequest{Namespace: n, Name: "data"})
		if err != nil {
			return err.Error()
		}
		if ex.WouldBind != "" && ex.WouldBind != vol {
			t.Fatalf("explain would bind %s", ex.WouldBind)
		}
		if len(ex.Candidates) != 1 || ex.Candidates[0].RejectedBy != binderv1.Rule_RULE_RESERVED || !strings.Contains(ex.Candidates[0].Message, "another binder replica") {
			return fmt.Sprintf("candidates %v", ex.Candidates)
		}
		return ""
	})
	pvcPhase(t, n, "data", corev1.ClaimPending)
	if _, err := etcd.Delete(t.Context(), key); err != nil {
		t.Fatal(err)
	}
	// Nothing changed in the API that would queue the claim: ask for
	// syncs (the e2e resync is 10 minutes).
	eventually(t, 30*time.Second, func() string {
		c := getPVC(t, n, "data")
		if c.Spec.VolumeName == vol {
			return ""
		}
		if c.Spec.VolumeName != "" {
			t.Fatalf("bound to %s", c.Spec.VolumeName)
		}
		ex, err := bc.ExplainClaim(t.Context(), &binderv1.ExplainClaimRequest{Namespace: n, Name: "data"})
		if err == nil && ex.WouldBind != "" && ex.WouldBind != vol {
			t.Fatalf("explain would bind %s", ex.WouldBind)
		}
		_, _ = bc.SyncClaim(t.Context(), &binderv1.SyncClaimRequest{Namespace: n, Name: "data"})
		return "claim not bound yet"
	})
}

// Match over REST and gRPC, for every decision and for claims the API
// server refuses, writes nothing: no etcd key of the namespace, of its
// volumes or of volplane's reservations and journal changes, and the
// volumes keep their resourceVersions.
func TestMatchWritesNothing(t *testing.T) {
	bc := binderClient(t)
	n := ns(t)
	createPV(t, n+"-a", "1Gi", n)
	createPV(t, n+"-b", "5Gi", n, withClaimRef(n, "pre", ""))
	cachedByBinder(t, bc, n+"-a", n+"-b")
	before := map[string]string{}
	for _, name := range []string{n + "-a", n + "-b"} {
		before[name] = getPV(t, name).ResourceVersion
	}
	g := matchGateway(t, n)
	etcd, err := clientv3.New(clientv3.Config{Endpoints: cluster.env.EtcdEndpoints, DialTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer etcd.Close()
	start, err := etcd.Get(t.Context(), "/registry/namespaces/"+n)
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(t.Context())
	defer stop()
	watch := etcd.Watch(wctx, "/", clientv3.WithPrefix(), clientv3.WithRev(start.Header.Revision+1))
	claims := []*corev1.PersistentVolumeClaim{
		newPVC(n, "data", "1Gi", n),                      // binds a
		newPVC(n, "pre", "1Gi", n),                       // binds b (pre-bound)
		newPVC(n, "big", "50Gi", n),                      // provisions (class missing)
		newPVC(n, "none", "1Gi", ""),                     // no match
		newPVC(n, "named", "1Gi", n, wantVolume(n+"-a")), // the named volume
		newPVC(n, "bad", "1Gi", n, func(c *corev1.PersistentVolumeClaim) { c.Spec.AccessModes = nil }), // invalid
	}
	for _, c := range claims {
		if _, err := bc.MatchClaim(t.Context(), &binderv1.MatchClaimRequest{Claim: claimStruct(t, c)}); err != nil && c.Name != "bad" {
			t.Fatalf("match %s: %v", c.Name, err)
		}
		body, _ := json.Marshal(c)
		if code, resp := g.callType(t, "POST", "/v1/namespaces/"+n+"/claims:match", g.viewer, string(body), "application/json"); code != http.StatusOK && c.Name != "bad" {
			t.Fatalf("REST match %s: %d %s", c.Name, code, resp)
		}
	}
	// A write would show in the watch at the latest by the revision of
	// this marker.
	marker := "/e2e/match-writes-nothing/" + n
	if _, err := etcd.Put(t.Context(), marker, "done"); err != nil {
		t.Fatal(err)
	}
	defer etcd.Delete(context.Background(), marker)
	var others []string
	sawMarker := false
	for resp := range watch {
		if err := resp.Err(); err != nil {
			t.Fatal(err)
		}
		done := false
		for _, ev := range resp.Events {
			k := string(ev.Kv.Key)
			switch {
			case k == marker:
				done, sawMarker = true, true
			case strings.Contains(k, "/"+n+"/") || strings.HasSuffix(k, "/"+n) || strings.Contains(k, n+"-a") || strings.Contains(k, n+"-b") ||
				strings.HasPrefix(k, "/volplane/reservations/") || strings.HasPrefix(k, "/volplane/journal/provision/"):
				t.Errorf("a match wrote %s %s", ev.Type, k)
			default:
				others = append(others, k)
			}
		}
		if done {
			break
		}
	}
	if !sawMarker {
		t.Fatal("the etcd watch ended before the marker: it proves nothing")
	}
	t.Logf("unrelated etcd writes meanwhile (other components): %d", len(others))
	for name, rv := range before {
		if got := getPV(t, name).ResourceVersion; got != rv {
			t.Errorf("%s changed from resourceVersion %s to %s", name, rv, got)
		}
	}
	if list, _ := cluster.client.CoreV1().PersistentVolumeClaims(n).List(t.Context(), metav1.ListOptions{}); len(list.Items) != 0 {
		t.Errorf("the namespace has claims: %v", list.Items)
	}
}

// matchGateway is a gateway with real authentication and the shipped
// roles: viewer is bound to volplane-viewer cluster-wide, nsViewer in
// namespace n only, nobody to nothing.
type authedGateway struct {
	*authGateway
	viewer, nsViewer, nobody string
}

func matchGateway(t *testing.T, n string, mutate ...func(*gateway.Options)) *authedGateway {
	t.Helper()
	roles := clusterRoles(t, "roles.yaml")
	applyClusterRole(t, roles["volplane-viewer"])
	applyClusterRole(t, clusterRoles(t, "rbac.yaml")["volplane-gateway"])
	g := &authedGateway{
		viewer:   serviceAccountToken(t, n, "viewer"),
		nsViewer: serviceAccountToken(t, n, "ns-viewer"),
		nobody:   serviceAccountToken(t, n, "nobody"),
	}
	serviceAccountToken(t, n, "gateway")
	bind(t, n+"-viewer", "volplane-viewer", rbacv1.Subject{Kind: "ServiceAccount", Name: "viewer", Namespace: n})
	bind(t, n+"-gateway", "volplane-gateway", rbacv1.Subject{Kind: "ServiceAccount", Name: "gateway", Namespace: n})
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "ns-viewer", Namespace: n},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "volplane-viewer"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "ns-viewer", Namespace: n}}}
	if _, err := cluster.client.RbacV1().RoleBindings(n).Create(t.Context(), rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	g.authGateway = startAuthGateway(t, n+"/gateway", "", func(o *gateway.Options) {
		for _, m := range mutate {
			m(o)
		}
	})
	return g
}

// Explain and match through the REST gateway: authentication, the
// shipped roles (get claims/explain, get claims/match, namespaced or
// cluster-wide), YAML bodies, and the errors for bad input.
func TestExplainAndMatchOverREST(t *testing.T) {
	bc := binderClient(t)
	n := ns(t)
	createPV(t, n+"-vol", "1Gi", n)
	cachedByBinder(t, bc, n+"-vol")
	createPVC(t, n, "bound", "1Gi", n)
	pvcPhase(t, n, "bound", corev1.ClaimBound)
	createPVC(t, n, "waiting", "1Gi", n)
	pvcPhase(t, n, "waiting", corev1.ClaimPending)
	g := matchGateway(t, n)
	other := ns(t)
	explain := "/v1/namespaces/" + n + "/claims/waiting:explain"

	t.Run("explain", func(t *testing.T) {
		code, body := g.callType(t, "GET", explain, g.viewer, "", "")
		if code != http.StatusOK {
			t.Fatalf("%d %s", code, body)
		}
		var ex binderv1.ExplainClaimResponse
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal([]byte(body), &ex); err != nil {
			t.Fatal(err)
		}
		// The class's only volume went to "bound"; the class has no
		// StorageClass object.
		if ex.Decision != binderv1.Decision_DECISION_PROVISION || ex.TotalCandidates != 0 || ex.GetProvisioning().GetClassFound() || ex.GetClaim().GetName() != "waiting" {
			t.Fatalf("explain: %s", body)
		}
		code, body = g.callType(t, "GET", "/v1/namespaces/"+n+"/claims/bound:explain", g.nsViewer, "", "")
		if code != http.StatusOK || !strings.Contains(body, `"decision":"DECISION_BOUND"`) || !strings.Contains(body, "best match") {
			t.Fatalf("bound claim: %d %s", code, body)
		}
	})

	const yamlClaim = `apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: what-if
spec:
  storageClassName: %s
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 1Gi
`
	yamlBody := fmt.Sprintf(yamlClaim, n)
	t.Run("match YAML", func(t *testing.T) {
		code, body := g.callType(t, "POST", "/v1/namespaces/"+n+"/claims:match", g.nsViewer, yamlBody, "application/yaml")
		if code != http.StatusOK {
			t.Fatalf("%d %s", code, body)
		}
		var m binderv1.MatchClaimResponse
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal([]byte(body), &m); err != nil {
			t.Fatal(err)
		}
		// The only free volume went to "bound"; "waiting" has none.
		if m.Decision != binderv1.Decision_DECISION_PROVISION || m.GetClaim().GetNamespace() != n || m.GetClaim().GetStorageClassName() != n {
			t.Fatalf("match: %s", body)
		}
	})

	for _, tc := range []struct {
		name, method, path, token, body, ctype string
		code                                   int
		inMessage                              []string
	}{
		{"no credential", "GET", explain, "", "", "", http.StatusUnauthorized, nil},
		{"bad token", "GET", explain, "garbage", "", "", http.StatusUnauthorized, nil},
		{"no role: explain", "GET", explain, g.nobody, "", "", http.StatusForbidden, []string{`cannot get resource "claims/explain"`, "volplane.io"}},
		{"no role: match", "POST", "/v1/claims:match", g.nobody, yamlBody, "application/yaml", http.StatusForbidden, []string{`cannot get resource "claims/match"`}},
		{"namespaced viewer elsewhere", "GET", "/v1/namespaces/" + other + "/claims/x:explain", g.nsViewer, "", "", http.StatusForbidden, []string{`in the namespace "` + other + `"`}},
		{"namespaced viewer, cluster-wide match", "POST", "/v1/claims:match", g.nsViewer, yamlBody, "application/yaml", http.StatusForbidden, []string{`cannot get resource "claims/match"`}},
		{"unknown claim", "GET", "/v1/namespaces/" + n + "/claims/nope:explain", g.viewer, "", "", http.StatusNotFound, []string{"nope"}},
		{"bad name", "GET", "/v1/namespaces/" + n + "/claims/No_Such:explain", g.viewer, "", "", http.StatusBadRequest, []string{"name"}},
		{"bad page size", "GET", explain + "?pageSize=100000", g.viewer, "", "", http.StatusBadRequest, []string{"page_size"}},
		{"bad page token", "GET", explain + "?pageToken=xyz", g.viewer, "", "", http.StatusBadRequest, []string{"page_token"}},
		{"match: no body", "POST", "/v1/claims:match", g.viewer, "", "application/json", http.StatusBadRequest, []string{"claim is required"}},
		{"match: not a claim", "POST", "/v1/claims:match", g.viewer, `{"kind":"Pod","metadata":{"name":"x"}}`, "application/json", http.StatusBadRequest, []string{"kind"}},
		{"match: no access modes", "POST", "/v1/namespaces/" + n + "/claims:match", g.viewer,
			`{"metadata":{"name":"x"},"spec":{"resources":{"requests":{"storage":"1Gi"}}}}`, "application/json", http.StatusBadRequest, []string{"spec.accessModes"}},
		{"match: unknown field", "POST", "/v1/namespaces/" + n + "/claims:match", g.viewer,
			`{"metadata":{"name":"x"},"spec":{"storageClas":"x","accessModes":["ReadWriteOnce"],"resources":{"requests":{"storage":"1Gi"}}}}`, "application/json", http.StatusBadRequest, []string{"storageClas"}},
		{"match: bad quantity", "POST", "/v1/namespaces/" + n + "/claims:match", g.viewer,
			`{"metadata":{"name":"x"},"spec":{"accessModes":["ReadWriteOnce"],"resources":{"requests":{"storage":"lots"}}}}`, "application/json", http.StatusBadRequest, []string{"quantities must match"}},
		{"match: namespace mismatch", "POST", "/v1/namespaces/" + n + "/claims:match", g.viewer,
			`{"metadata":{"name":"x","namespace":"` + other + `"},"spec":{}}`, "application/json", http.StatusBadRequest, []string{"metadata.namespace"}},
		{"match: namespace missing", "POST", "/v1/claims:match", g.viewer,
			`{"metadata":{"name":"x","namespace":"no-such-ns-` + n + `"},"spec":{"accessModes":["ReadWriteOnce"],"resources":{"requests":{"storage":"1Gi"}}}}`, "application/json", http.StatusNotFound, []string{"not found"}},
		{"match: claim exists", "POST", "/v1/namespaces/" + n + "/claims:match", g.viewer,
			`{"metadata":{"name":"waiting"},"spec":{"accessModes":["ReadWriteOnce"],"resources":{"requests":{"storage":"1Gi"}}}}`, "application/json", http.StatusConflict, []string{"already exists", ":explain"}},
		{"match: not YAML", "POST", "/v1/claims:match", g.viewer, "a: [b\n", "application/yaml", http.StatusBadRequest, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, msg := g.callType(t, tc.method, tc.path, tc.token, tc.body, tc.ctype)
			if code != tc.code {
				t.Fatalf("%d %s, want %d", code, msg, tc.code)
			}
			for _, s := range tc.inMessage {
				if !strings.Contains(msg, s) {
					t.Errorf("%q lacks %q", msg, s)
				}
			}
		})
	}
}

// callType is call with a Content-Type.
func (g *authGateway) callType(t *testing.T, method, path, token, body, ctype string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, g.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := g.client.Do(req)
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

// gRPC callers get the codes the REST statuses come from.
func TestExplainAndMatchGRPCCodes(t *testing.T) {
	bc := binderClient(t)
	n := ns(t)
	if _, err := bc.ExplainClaim(t.Context(), &binderv1.ExplainClaimRequest{Namespace: n, Name: "nope"}); status.Code(err) != codes.NotFound {
		t.Errorf("unknown claim: %v", err)
	}
	bad := newPVC(n, "bad", "1Gi", n, func(c *corev1.PersistentVolumeClaim) { c.Spec.AccessModes = nil })
	_, err := bc.MatchClaim(t.Context(), &binderv1.MatchClaimRequest{Claim: claimStruct(t, bad)})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "spec.accessModes") {
		t.Fatalf("invalid claim: %v", err)
	}
	var fields []string
	for _, d := range status.Convert(err).Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, f := range br.GetFieldViolations() {
				fields = append(fields, f.GetField())
			}
		}
	}
	if !slices.Contains(fields, "spec.accessModes") {
		t.Errorf("field violations %v, want spec.accessModes", fields)
	}
}
