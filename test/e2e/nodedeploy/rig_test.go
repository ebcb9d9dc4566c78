package nodedeploy

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/sidecar"
	"github.com/volplane/volplane/test/harness/e2e"
)

// nodeCapacity is each node's dev driver's capacity.
const nodeCapacity = 10 << 30

// zoneOf is each node's zone.
var zoneOf = map[string]string{"node-a": "zone-a", "node-b": "zone-b", "node-c": "zone-c"}

// nodeNames are the nodes, in order.
var nodeNames = []string{"node-a", "node-b", "node-c"}

// driver is one node's dev CSI driver, on a unix socket of its own,
// behind a recorder of the CreateVolume requests it gets.
type driver struct {
	node, root, sock string

	mu      sync.Mutex
	creates []*csi.CreateVolumeRequest
}

func (d *driver) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if r, ok := req.(*csi.CreateVolumeRequest); ok {
		d.mu.Lock()
		d.creates = append(d.creates, proto.Clone(r).(*csi.CreateVolumeRequest))
		d.mu.Unlock()
	}
	return h(ctx, req)
}

// createsOf are the CreateVolume requests of the volume named name.
func (d *driver) createsOf(name string) []*csi.CreateVolumeRequest {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []*csi.CreateVolumeRequest
	for _, r := range d.creates {
		if r.GetName() == name {
			out = append(out, r)
		}
	}
	return out
}

// volumes are the volume directories in the driver's state directory.
func (d *driver) volumes(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(d.root, "volumes"))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".tmp") {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out
}

// startDriver runs node's dev driver (all services, as a DaemonSet's
// driver container runs it) in dir until the test ends.
func startDriver(t *testing.T, c *e2e.Cluster, dir, node string) *driver {
	t.Helper()
	d := &driver{node: node, root: filepath.Join(dir, node, "root"), sock: filepath.Join(dir, node, "csi.sock")}
	drv, err := devcsi.New(devcsi.Options{RootDir: d.root, NodeID: node, NodeCapacity: nodeCapacity, Logger: c.Logger("csi-"+node, slog.LevelInfo)})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := grpcutil.Listen("unix://" + d.sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpcutil.NewCSIServer(c.Logger("csi-"+node, slog.LevelInfo), grpc.ChainUnaryInterceptor(d.intercept))
	drv.Register(srv.Server)
	srv.SetServing(true)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, lis, time.Second) }()
	t.Cleanup(func() { cancel(); <-done })
	return d
}

// setupCluster creates what a cluster of three nodes has before any
// driver runs: the Nodes (labelled with their zone and, as the kubelet
// labels them once the driver's node plugin registers, the driver's
// topology key) and their CSINodes; volplane's namespace and the
// sidecar's ClusterRole (deploy/kubernetes/rbac.yaml) bound to the node
// plugin's ServiceAccount.
func setupCluster(ctx context.Context, c *e2e.Cluster) error {
	for _, n := range nodeNames {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{corev1.LabelHostname: n,
			corev1.LabelTopologyZone: zoneOf[n], devcsi.TopologyKey: n}}}
		if _, err := c.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			return err
		}
		cn := &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: n}, Spec: storagev1.CSINodeSpec{
			Drivers: []storagev1.CSINodeDriver{{Name: devcsi.DefaultName, NodeID: n, TopologyKeys: []string{devcsi.TopologyKey}}}}}
		if _, err := c.Client.StorageV1().CSINodes().Create(ctx, cn, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	for _, ns := range []string{"volplane-system", csiNamespace} {
		if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: csiNamespace, Name: nodeServiceAccount}}
	if _, err := c.Client.CoreV1().ServiceAccounts(csiNamespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		return err
	}
	role, err := shippedRole(sidecar.ClusterRole)
	if err != nil {
		return err
	}
	if _, err := c.Client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		return err
	}
	rb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "volplane-csi-node-sidecar"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: sidecar.ClusterRole},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: nodeServiceAccount, Namespace: csiNamespace}}}
	_, err = c.Client.RbacV1().ClusterRoleBindings().Create(ctx, rb, metav1.CreateOptions{})
	return err
}

// The driver's namespace and its node plugin's ServiceAccount.
const (
	csiNamespace       = "volplane-csi"
	nodeServiceAccount = "volplane-csi-node"
)

// shippedRole is the ClusterRole name of deploy/kubernetes/rbac.yaml.
func shippedRole(name string) (*rbacv1.ClusterRole, error) {
	b, err := os.ReadFile("../../../deploy/kubernetes/rbac.yaml")
	if err != nil {
		return nil, err
	}
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var r rbacv1.ClusterRole
		if err := yaml.Unmarshal([]byte(doc), &r); err != nil {
			return nil, err
		}
		if r.Kind == "ClusterRole" && r.Name == name {
			return &r, nil
		}
	}
	return nil, fmt.Errorf("rbac.yaml has no ClusterRole %s", name)
}

// nodePod creates the DaemonSet pod of node, Ready at 127.0.0.1 (no
// kubelet runs it: the sidecar and the driver run in this process).
func nodePod(t *testing.T, c *e2e.Cluster, name, node string) {
	t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: csiNamespace, Name: name, Labels: map[string]string{"app": "volplane-csi-node"}},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: nodeServiceAccount, Containers: []corev1.Container{{Name: "csi-provisioner", Image: "volplane-csi-sidecar"}}}}
	p, err := c.Client.CoreV1().Pods(csiNamespace).Create(t.Context(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1", PodIPs: []corev1.PodIP{{IP: "127.0.0.1"}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if _, err := c.Client.CoreV1().Pods(csiNamespace).UpdateStatus(t.Context(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}
