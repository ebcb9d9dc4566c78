package dynamic

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/volplane/volplane/pkg/kube"
	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	"github.com/volplane/volplane/test/harness/e2e"
)

// restMatch asks the gateway what would happen to claim.
func restMatch(t *testing.T, g *testGateway, c *corev1.PersistentVolumeClaim) (*binderv1.MatchClaimResponse, int, string) {
	t.Helper()
	code, body := g.do(t, http.MethodPost, "/v1/namespaces/"+c.Namespace+"/claims:match", c)
	if code != http.StatusOK {
		return nil, code, body
	}
	var m binderv1.MatchClaimResponse
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal([]byte(body), &m); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	return &m, code, body
}

func restExplain(t *testing.T, g *testGateway, ns, name string) *binderv1.ExplainClaimResponse {
	t.Helper()
	code, body := g.do(t, http.MethodGet, "/v1/namespaces/"+ns+"/claims/"+name+":explain", nil)
	if code != http.StatusOK {
		t.Fatalf("explain %s/%s: %d %s", ns, name, code, body)
	}
	var ex binderv1.ExplainClaimResponse
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal([]byte(body), &ex); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	return &ex
}

func segments(ts []*provisionerv1.TopologySegment) []string {
	var out []string
	for _, s := range ts {
		out = append(out, fmt.Sprint(s.GetSegments()))
	}
	return out
}

func csiSegments(ts []*csi.Topology) []string {
	var out []string
	for _, s := range ts {
		out = append(out, fmt.Sprint(s.GetSegments()))
	}
	return out
}

// samePlan compares what match said the provisioner would ask the driver
// with the request the driver then got for the real claim. The volume name
// comes from the claim's UID, the dry run's in the plan, so the names and
// the parameter naming the PV differ by that, and with several segments
// the preferred order (rotated by the name) may too; the claim matched may
// have another name (planClaim) than the one created.
func samePlan(t *testing.T, plan *provisionerv1.CreateVolumePlan, got *csi.CreateVolumeRequest, planClaim string, exactTopology bool) {
	t.Helper()
	if plan.GetDriverName() != driverName || plan.GetRequiredBytes() != got.GetCapacityRange().GetRequiredBytes() || plan.GetLimitBytes() != got.GetCapacityRange().GetLimitBytes() {
		t.Errorf("plan %v, request %v", plan, got)
	}
	params := map[string]string{}
	for k, v := range got.GetParameters() {
		params[k] = v
	}
	if params["csi.storage.k8s.io/pv/name"] != got.GetName() || plan.GetParameters()["csi.storage.k8s.io/pv/name"] != plan.GetVolumeName() {
		t.Errorf("pv/name parameters %v and %v", got.GetParameters(), plan.GetParameters())
	}
	params["csi.storage.k8s.io/pv/name"] = plan.GetVolumeName()
	params["csi.storage.k8s.io/pvc/name"] = planClaim
	if fmt.Sprint(params) != fmt.Sprint(plan.GetParameters()) {
		t.Errorf("parameters: plan %v, request %v", plan.GetParameters(), got.GetParameters())
	}
	if len(plan.GetVolumeCapabilities()) != len(got.GetVolumeCapabilities()) {
		t.Fatalf("capabilities: plan %v, request %v", plan.GetVolumeCapabilities(), got.GetVolumeCapabilities())
	}
	for i, c := range got.GetVolumeCapabilities() {
		p := plan.GetVolumeCapabilities()[i]
		if p.GetAccessMode() != c.GetAccessMode().GetMode().String() || p.GetFsType() != c.GetMount().GetFsType() ||
			fmt.Sprint(p.GetMountFlags()) != fmt.Sprint(c.GetMount().GetMountFlags()) || p.GetBlock() != (c.GetBlock() != nil) {
			t.Errorf("capability %d: plan %v, request %v", i, p, c)
		}
	}
	req, pref := csiSegments(got.GetAccessibilityRequirements().GetRequisite()), csiSegments(got.GetAccessibilityRequirements().GetPreferred())
	preq, ppref := segments(plan.GetRequisiteTopology()), segments(plan.GetPreferredTopology())
	if !exactTopology {
		slices.Sort(pref)
		slices.Sort(ppref)
	}
	if fmt.Sprint(req) != fmt.Sprint(preq) || fmt.Sprint(pref) != fmt.Sprint(ppref) {
		t.Errorf("topology: plan %v / %v, request %v / %v", preq, ppref, req, pref)
	}
}

// Match asks the provisioner for the CreateVolume request it would send,
// built by its own code: the request the driver gets once the claim is
// created is that one. The match itself makes nothing.
func TestMatchPlanIsTheCreateVolumeRequest(t *testing.T) {
	g := newTestGateway(t)
	ns := e2e.Namespace(t, cluster.client)
	sc := class(t, func(sc *storagev1.StorageClass) {
		sc.Parameters = map[string]string{"tier": "gold", "csi.storage.k8s.io/fstype": "xfs"}
		sc.MountOptions = []string{"noatime"}
	})
	claim := e2e.Claim(ns, "data", "1Gi", sc.Name, func(c *corev1.PersistentVolumeClaim) {
		c.Spec.Resources.Limits = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("2Gi")}
	})
	before := driverVolumes(t)
	m, code, body := restMatch(t, g, claim)
	if m == nil {
		t.Fatalf("match: %d %s", code, body)
	}
	p := m.GetProvisioning()
	if m.Decision != binderv1.Decision_DECISION_PROVISION || !p.GetServed() || p.GetDriverName() != driverName || !p.GetDriverReady() || m.GetCreateVolume() == nil {
		t.Fatalf("match: %s", body)
	}
	plan := m.GetCreateVolume()
	if !strings.HasPrefix(plan.GetVolumeName(), "pvc-") || plan.GetWithSecrets() {
		t.Errorf("plan %v", plan)
	}
	if n := len(cluster.requests.createsFor(plan.GetVolumeName())); n != 0 || len(operations(t, plan.GetVolumeName())) != 0 {
		t.Fatalf("the match made %d CreateVolume calls or journaled %v", n, operations(t, plan.GetVolumeName()))
	}
	if s := noneAdded(t, before); s != "" {
		t.Fatal(s)
	}

	createClaim(t, ns, "data", "1Gi", sc.Name, func(c *corev1.PersistentVolumeClaim) { c.Spec = claim.Spec })
	c, pv := bound(t, ns, "data")
	reqs := cluster.requests.createsFor(pv.Name)
	if len(reqs) != 1 {
		t.Fatalf("%d CreateVolume calls", len(reqs))
	}
	samePlan(t, plan, reqs[0], "data", false)

	ex := restExplain(t, g, ns, "data")
	if ex.Decision != binderv1.Decision_DECISION_BOUND || ex.Binding.GetProvisionedBy() != driverName || ex.Binding.GetVolumeName() != pvName(c) ||
		!strings.Contains(ex.Binding.GetMessage(), driverName+" provisioned volume") {
		t.Fatalf("explain of the bound claim: %v", ex)
	}
}

// A WaitForFirstConsumer claim waits for a node; asked with a selected
// node, match plans the volume on that node's topology, and the driver
// gets exactly that once a node is selected for the real claim.
func TestExplainWaitForFirstConsumerAndMatchOnANode(t *testing.T) {
	g := newTestGateway(t)
	ns := e2e.Namespace(t, cluster.client)
	sc := class(t, waitForFirstConsumer)
	node := makeNode(t, "node-explain")
	c := createClaim(t, ns, "data", "1Gi", sc.Name)
	e2e.HasEvent(t, cluster.client, ns, "PersistentVolumeClaim", "data", kube.EventWaitForFirstConsumer, "waiting for first consumer", kube.ControllerComponent, 30*time.Second)
	ex := restExplain(t, g, ns, "data")
	if p := ex.GetProvisioning(); ex.Decision != binderv1.Decision_DECISION_WAIT_FOR_FIRST_CONSUMER || !p.GetWaitingForNode() || !p.GetServed() || p.GetVolumeBindingMode() != "WaitForFirstConsumer" {
		t.Fatalf("explain: %v", ex)
	}

	onNode := e2e.Claim(ns, "what-if", "1Gi", sc.Name, func(c *corev1.PersistentVolumeClaim) {
		c.Annotations = map[string]string{kube.AnnSelectedNode: node}
	})
	var plan *provisionerv1.CreateVolumePlan
	e2e.Eventually(t, 30*time.Second, func() string {
		m, code, body := restMatch(t, g, onNode)
		if m == nil {
			return fmt.Sprintf("%d %s", code, body)
		}
		if m.Decision != binderv1.Decision_DECISION_PROVISION || m.GetCreateVolume() == nil {
			return "match: " + body // the provisioner's node cache may lag
		}
		plan = m.GetCreateVolume()
		return ""
	})
	// As external-provisioner without --strict-topology: every node's
	// segment is requisite, the selected node's is preferred first.
	if segs := segments(plan.GetRequisiteTopology()); !slices.ContainsFunc(segs, func(s string) bool { return strings.Contains(s, node) }) {
		t.Fatalf("requisite topology %v, want %s among them", segs, node)
	}
	if segs := segments(plan.GetPreferredTopology()); len(segs) == 0 || !strings.Contains(segs[0], node) {
		t.Fatalf("preferred topology %v, want %s first", segs, node)
	}
	selectNode(t, c, node)
	_, pv := bound(t, ns, "data")
	samePlan(t, plan, cluster.requests.createsFor(pv.Name)[0], "what-if", true)
}

// While the driver fails, explain shows the journaled operation: its
// attempts, the last CSI error's code and message, and when the binder
// tries again; once the driver recovers the claim is bound.
func TestExplainShowsTheJournaledOperation(t *testing.T) {
	g := newTestGateway(t)
	ns := e2e.Namespace(t, cluster.client)
	sc := class(t)
	f := faults(t)
	f.FailNext("CreateVolume", 1000, codes.Unavailable, "backend restarting")
	c := createClaim(t, ns, "data", "1Gi", sc.Name)
	var last *binderv1.ExplainClaimResponse
	e2e.Eventually(t, 30*time.Second, func() string {
		last = restExplain(t, g, ns, "data")
		p := last.GetProvisioning()
		op := p.GetOperation()
		switch {
		case last.Decision != binderv1.Decision_DECISION_PROVISION || !p.GetServed() || !p.GetRequested():
			return fmt.Sprintf("explain: %v", last)
		case op.GetAttempts() < 2 || op.GetLastErrorCode() != "Unavailable" || op.GetLastErrorMessage() != "backend restarting" || op.GetLastAttemptTime() == nil:
			return fmt.Sprintf("operation %v", op)
		case op.GetVolumeName() != pvName(c):
			return fmt.Sprintf("operation of %s", op.GetVolumeName())
		case p.GetNextRetryTime() == nil && !p.GetCallInFlight():
			return fmt.Sprintf("no retry scheduled: %v", p)
		case !strings.Contains(p.GetLastResult(), "backend restarting"):
			return fmt.Sprintf("last result %q", p.GetLastResult())
		}
		return ""
	})
	if !strings.Contains(last.GetProvisioning().GetMessage(), "last error Unavailable: backend restarting") {
		t.Errorf("message %q", last.GetProvisioning().GetMessage())
	}
	b, _ := json.Marshal(last.GetProvisioning())
	t.Logf("provisioning while the driver fails: %s", b)
	f.Reset()
	bound(t, ns, "data")
	if ex := restExplain(t, g, ns, "data"); ex.Decision != binderv1.Decision_DECISION_BOUND || ex.GetProvisioning() != nil {
		t.Fatalf("after recovery: %v", ex)
	}
}

// A class of a provisioner volplane does not serve: explain and match say
// it is left to that provisioner, and match plans nothing.
func TestExplainExternalProvisioner(t *testing.T) {
	g := newTestGateway(t)
	ns := e2e.Namespace(t, cluster.client)
	sc := class(t, func(sc *storagev1.StorageClass) { sc.Provisioner = "example.com/elsewhere" })
	createClaim(t, ns, "data", "1Gi", sc.Name)
	e2e.HasEvent(t, cluster.client, ns, "PersistentVolumeClaim", "data", kube.EventExternalProvisioning, "example.com/elsewhere", kube.ControllerComponent, 30*time.Second)
	ex := restExplain(t, g, ns, "data")
	if p := ex.GetProvisioning(); ex.Decision != binderv1.Decision_DECISION_PROVISION || p.GetServed() || p.GetOperation() != nil || !strings.Contains(p.GetMessage(), "does not serve") {
		t.Fatalf("explain: %v", ex)
	}
	m, code, body := restMatch(t, g, e2e.Claim(ns, "other", "1Gi", sc.Name))
	if m == nil || m.GetProvisioning().GetServed() || m.GetCreateVolume() != nil {
		t.Fatalf("match: %d %s", code, body)
	}
}
