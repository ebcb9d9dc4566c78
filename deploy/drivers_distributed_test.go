package deploy

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/volplane/volplane/internal/csisidecar"
	"github.com/volplane/volplane/pkg/sidecar"
)

// distributedDir is the dev driver as a node-local driver ships: a
// provisioner per node (--node-deployment).
const distributedDir = "drivers/volplane-csi-distributed"

// distributed are the rendered objects of distributedDir, decoded
// strictly (the VolumeSnapshotClass, whose CRD client-go's scheme lacks,
// is skipped).
func distributed(t *testing.T) []any {
	t.Helper()
	return decodeStrictly(t, distributedDir)
}

// TestDistributedDriverDeployment: the node-deployment form of the dev
// driver has no controller Deployment; its DaemonSet runs the driver with
// every CSI service and volplane-csi-sidecar in csi-provisioner's place
// with --node-deployment and the node's name; nothing pins it to a node
// or shares a directory between nodes; the node plugin's ServiceAccount
// may register, serve the driver and (for csi-provisioner swapped back)
// provision and publish capacity; the CSIDriver says capacity is tracked.
func TestDistributedDriverDeployment(t *testing.T) {
	var node *appsv1.DaemonSet
	bound := map[string]bool{}
	var role *rbacv1.Role
	for _, obj := range distributed(t) {
		switch o := obj.(type) {
		case *appsv1.Deployment:
			if o.Namespace == driverNamespace {
				t.Errorf("Deployment %s/%s: a node-deployed driver has no controller Deployment", o.Namespace, o.Name)
			}
		case *appsv1.DaemonSet:
			node = o
		case *rbacv1.ClusterRoleBinding:
			if boundTo(o.Subjects, driverNamespace, "volplane-csi-node") {
				bound[o.RoleRef.Name] = true
			}
		case *rbacv1.Role:
			if o.Name == "volplane-csi-node-provisioner" {
				role = o
			}
		case *storagev1.CSIDriver:
			if o.Spec.StorageCapacity == nil || !*o.Spec.StorageCapacity {
				t.Errorf("CSIDriver %s: storageCapacity is not true, so the scheduler ignores the nodes' capacities", o.Name)
			}
		}
	}
	if node == nil {
		t.Fatal("no DaemonSet")
	}
	for _, r := range []string{sidecar.ClusterRole, "volplane-csi-external-provisioner"} {
		if !bound[r] {
			t.Errorf("ClusterRole %s is not bound to volplane-csi-node", r)
		}
	}
	if role == nil || !grantsAll(role.Rules, "coordination.k8s.io", "leases", "create", "update", "delete") ||
		!grantsAll(role.Rules, "storage.k8s.io", "csistoragecapacities", "create", "update", "delete") {
		t.Errorf("Role volplane-csi-node-provisioner %v: want the registration Leases and the CSIStorageCapacity objects", role)
	}
	checkNodePod(t, node.Spec.Template.Spec)
}

// checkNodePod checks the DaemonSet's pod: the driver's services, the
// sidecar's command line, its environment and port, and no pinning.
func checkNodePod(t *testing.T, pod corev1.PodSpec) {
	t.Helper()
	if pod.NodeSelector != nil || pod.Affinity != nil || pod.NodeName != "" {
		t.Errorf("the node plugin is pinned: nodeSelector %v, affinity %v, nodeName %q", pod.NodeSelector, pod.Affinity, pod.NodeName)
	}
	if pod.AutomountServiceAccountToken == nil || !*pod.AutomountServiceAccountToken {
		t.Error("the node plugin mounts no ServiceAccount token: the sidecar cannot register")
	}
	for _, v := range pod.Volumes {
		if v.NFS != nil || v.PersistentVolumeClaim != nil {
			t.Errorf("volume %s is shared between nodes", v.Name)
		}
	}
	var drv, side *corev1.Container
	for i := range pod.Containers {
		switch pod.Containers[i].Name {
		case "csi-node":
			drv = &pod.Containers[i]
		case "csi-provisioner":
			side = &pod.Containers[i]
		}
	}
	if drv == nil || side == nil {
		t.Fatalf("containers %v: want csi-node and csi-provisioner", pod.Containers)
	}
	if !slices.Contains(drv.Command, "--mode=all") {
		t.Errorf("driver %v: want --mode=all (a node-deployed driver serves its Controller service on the node)", drv.Command)
	}
	if !strings.Contains(side.Image, "/volplane-csi-sidecar:") || len(side.Command) > 0 {
		t.Errorf("csi-provisioner container: image %s, command %v; want the sidecar image and its entrypoint", side.Image, side.Command)
	}
	env := map[string]string{}
	for _, e := range side.Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			env[e.Name] = e.ValueFrom.FieldRef.FieldPath
		} else {
			env[e.Name] = e.Value
		}
	}
	if env["NODE_NAME"] != "spec.nodeName" || env["POD_NAME"] != "metadata.name" || env["POD_NAMESPACE"] != "metadata.namespace" {
		t.Errorf("sidecar env %v: want NODE_NAME, POD_NAME and POD_NAMESPACE from the downward API", env)
	}
	if !declares(side.Ports, sidecar.DefaultPort) {
		t.Errorf("sidecar ports %v: want %d", side.Ports, sidecar.DefaultPort)
	}
	args := make([]string, len(side.Args))
	for i, a := range side.Args {
		args[i] = strings.ReplaceAll(a, "$(ADDRESS)", env["ADDRESS"])
	}
	o, err := csisidecar.Parse(args)
	if err != nil {
		t.Fatal(err)
	}
	o.NodeName = "node-a" // $NODE_NAME
	if !o.Provisioner.NodeDeployment || o.Validate() != nil {
		t.Errorf("sidecar args %v: node deployment %v, refusals %v", side.Args, o.Provisioner.NodeDeployment, o.Validate())
	}
}

func declares(ports []corev1.ContainerPort, port int) bool {
	for _, p := range ports {
		if int(p.ContainerPort) == port {
			return true
		}
	}
	return false
}

// grantsAll reports whether rules grant every verb on group's resource.
func grantsAll(rules []rbacv1.PolicyRule, group, resource string, verbs ...string) bool {
	for _, v := range verbs {
		if !grants(rules, group, resource, v) {
			return false
		}
	}
	return true
}
