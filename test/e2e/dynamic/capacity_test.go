package dynamic

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/kube"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	"github.com/volplane/volplane/services/provisioner/capacity"
	"github.com/volplane/volplane/test/harness/e2e"
)

// capacityNamespace holds the provisioner's CSIStorageCapacity objects.
const capacityNamespace = "default"

const gib = int64(1) << 30

// publishedCapacity is what GetCapacity shows for class, by node.
func publishedCapacity(t *testing.T, class string) map[string]*provisionerv1.Capacity {
	t.Helper()
	cc, err := cluster.e2e.Dial(cluster.provisionerAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	resp, err := provisionerv1.NewProvisionerServiceClient(cc).GetCapacity(t.Context(), &provisionerv1.GetCapacityRequest{Name: driverName})
	if err != nil {
		t.Fatalf("GetCapacity: %v", err)
	}
	out := map[string]*provisionerv1.Capacity{}
	for _, c := range resp.GetCapacities() {
		if c.GetStorageClassName() == class {
			out[c.GetSegment()[devcsi.TopologyKey]] = c
		}
	}
	return out
}

// waitCapacity waits until the class's object for node says bytes.
func waitCapacity(t *testing.T, class, node string, bytes int64, within time.Duration) *provisionerv1.Capacity {
	t.Helper()
	var got *provisionerv1.Capacity
	e2e.Eventually(t, within, func() string {
		got = publishedCapacity(t, class)[node]
		switch {
		case got == nil:
			return fmt.Sprintf("no CSIStorageCapacity for class %s on node %s", class, node)
		case got.GetCapacityBytes() != bytes:
			return fmt.Sprintf("class %s on node %s: %d bytes published, want %d", class, node, got.GetCapacityBytes(), bytes)
		}
		return ""
	})
	return got
}

// The provisioner publishes one CSIStorageCapacity per node segment and
// WaitForFirstConsumer class of the dev driver, as external-provisioner
// does, from what the driver's GetCapacity says; after a volume is made the
// object shows the space left at once (the poll here is 10 minutes); a
// claim whose selected node is full is not provisioned there: the driver
// answers ResourceExhausted and the scheduler is asked again.
func TestCapacityIsPublishedAndAFullSegmentIsNotProvisioned(t *testing.T) {
	ns := e2e.Namespace(t, cluster.client)
	sc := class(t, waitForFirstConsumer)
	immediate := class(t)
	suffix := rand.String(5)
	small, big := makeNode(t, "cap-small-"+suffix), makeNode(t, "cap-big-"+suffix)
	cluster.driver.SetNodeCapacity(small, 3*gib)
	cluster.driver.SetNodeCapacity(big, 10*gib)
	t.Cleanup(func() {
		cluster.driver.SetNodeCapacity(small, 0)
		cluster.driver.SetNodeCapacity(big, 0)
	})

	obj := waitCapacity(t, sc.Name, small, 3*gib, 30*time.Second)
	waitCapacity(t, sc.Name, big, 10*gib, 30*time.Second)
	if n := len(publishedCapacity(t, immediate.Name)); n != 0 {
		t.Errorf("%d objects for an Immediate class, want none (as external-provisioner without --capacity-for-immediate-binding)", n)
	}

	// The object itself, as the scheduler reads it.
	csc, err := cluster.client.StorageV1().CSIStorageCapacities(capacityNamespace).Get(t.Context(), obj.GetName(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(csc.Name, "csisc-") || csc.GenerateName != "csisc-" {
		t.Errorf("name %q (generateName %q), want generated from csisc-", csc.Name, csc.GenerateName)
	}
	if csc.Labels[capacity.LabelDriverName] != driverName || csc.Labels[capacity.LabelManagedBy] != capacity.DefaultManagedBy {
		t.Errorf("labels %v", csc.Labels)
	}
	if csc.StorageClassName != sc.Name || csc.NodeTopology == nil || len(csc.NodeTopology.MatchLabels) != 1 ||
		csc.NodeTopology.MatchLabels[devcsi.TopologyKey] != small || len(csc.NodeTopology.MatchExpressions) != 0 {
		t.Errorf("class %q, nodeTopology %+v: want %s on %s=%s", csc.StorageClassName, csc.NodeTopology, sc.Name, devcsi.TopologyKey, small)
	}
	if csc.Capacity == nil || csc.Capacity.Value() != 3*gib || csc.MaximumVolumeSize != nil {
		t.Errorf("capacity %v, maximumVolumeSize %v: want 3Gi and none (the driver reports no maximum)", csc.Capacity, csc.MaximumVolumeSize)
	}

	first := createClaim(t, ns, "first", "2Gi", sc.Name)
	selectNode(t, first, small)
	bound(t, ns, "first")
	waitCapacity(t, sc.Name, small, gib, 20*time.Second)
	waitCapacity(t, sc.Name, big, 10*gib, time.Second)

	second := createClaim(t, ns, "second", "2Gi", sc.Name)
	selectNode(t, second, small)
	hasEventFrom(t, second, kube.EventProvisioningFailed, "not enough capacity on node", driverName)
	e2e.Eventually(t, 30*time.Second, func() string {
		c, err := cluster.client.CoreV1().PersistentVolumeClaims(ns).Get(t.Context(), "second", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if _, ok := c.Annotations[kube.AnnSelectedNode]; ok {
			return "selected-node is still set: the scheduler was not asked again"
		}
		return ""
	})
	if _, err := cluster.client.CoreV1().PersistentVolumes().Get(t.Context(), pvName(second), metav1.GetOptions{}); err == nil {
		t.Error("a PV was made on the full node")
	}
	// On the node with room, it is.
	selectNode(t, second, big)
	bound(t, ns, "second")
	waitCapacity(t, sc.Name, big, 8*gib, 20*time.Second)

	// A deleted volume gives its space back.
	deleteClaim(t, first)
	waitCapacity(t, sc.Name, small, 3*gib, 30*time.Second)

	// A class that goes takes its objects along.
	if err := cluster.client.StorageV1().StorageClasses().Delete(t.Context(), sc.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e2e.Eventually(t, 30*time.Second, func() string {
		if n := len(publishedCapacity(t, sc.Name)); n > 0 {
			return fmt.Sprintf("%d objects of the deleted class remain", n)
		}
		return ""
	})
}

// GET /v1/drivers/{name}/capacity shows the objects over REST; an unknown
// driver is 404.
func TestCapacityOverREST(t *testing.T) {
	sc := class(t, waitForFirstConsumer)
	node := makeNode(t, "cap-rest-"+rand.String(5))
	cluster.driver.SetNodeCapacity(node, 5*gib)
	t.Cleanup(func() { cluster.driver.SetNodeCapacity(node, 0) })
	waitCapacity(t, sc.Name, node, 5*gib, 30*time.Second)

	g := newTestGateway(t)
	code, body := g.do(t, http.MethodGet, "/v1/drivers/"+driverName+"/capacity", nil)
	if code != http.StatusOK {
		t.Fatalf("GET capacity: %d %s", code, body)
	}
	var resp struct {
		DriverName string `json:"driverName"`
		Capacities []struct {
			StorageClassName string            `json:"storageClassName"`
			Segment          map[string]string `json:"segment"`
			CapacityBytes    string            `json:"capacityBytes"`
		} `json:"capacities"`
	}
	if err := json.Unmarshal([]byte(body), &resp); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	found := false
	for _, c := range resp.Capacities {
		if c.StorageClassName == sc.Name && c.Segment[devcsi.TopologyKey] == node {
			found = c.CapacityBytes == fmt.Sprint(5*gib)
		}
	}
	if resp.DriverName != driverName || !found {
		t.Errorf("answer %s lacks class %s on %s with 5Gi", body, sc.Name, node)
	}
	if code, body := g.do(t, http.MethodGet, "/v1/drivers/nope.example.com/capacity", nil); code != http.StatusNotFound || !strings.Contains(body, "nope.example.com") {
		t.Errorf("unknown driver: %d %s, want 404 naming it", code, body)
	}

	cc, err := cluster.e2e.Dial(cluster.provisionerAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	_, err = provisionerv1.NewProvisionerServiceClient(cc).GetCapacity(t.Context(), &provisionerv1.GetCapacityRequest{})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("no name: %v, want InvalidArgument", err)
	}
}
