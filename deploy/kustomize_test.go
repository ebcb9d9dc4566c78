package deploy

import (
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/volplane/volplane/test/harness/manifests"
)

// components are volplane's services; each runs at least two replicas
// behind a PodDisruptionBudget.
var components = []string{"volplane-watcher", "volplane-binder", "volplane-provisioner", "volplane-reclaimer", "volplane-gateway"}

// componentsOf are the services the kustomization dir runs: all but the
// binder in standalone mode (kube-controller-manager's binds).
func componentsOf(dir string) []string {
	if dir != "overlays/standalone" {
		return components
	}
	return slices.DeleteFunc(slices.Clone(components), func(c string) bool { return c == "volplane-binder" })
}

// render runs kustomize on dir, as `kubectl kustomize` does.
func render(t *testing.T, dir string) [][]byte {
	t.Helper()
	docs, _, err := manifests.Render(dir)
	if err != nil {
		t.Fatal(err)
	}
	return docs
}

// makefileVersion is the Makefile's VERSION, the tag make images gives.
func makefileVersion(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^VERSION\s*\?=\s*(\S+)`).FindSubmatch(b)
	if m == nil {
		t.Fatal("no VERSION ?= in the Makefile")
	}
	return string(m[1])
}

// The kustomize base and its overlays render, decode strictly, and every
// workload is shipped as production wants it: replicas, disruption
// budgets, probes, resources, the restricted Pod Security profile,
// topology spread, pinned images; and every volplane command line in
// them is one its binary accepts.
func TestKustomizationRunsAsShipped(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every binary")
	}
	bin := build(t)
	version := makefileVersion(t)
	strict := json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme.Scheme, scheme.Scheme, json.SerializerOptions{Strict: true})
	for _, tc := range []struct {
		dir string
		// replicas of the provisioner: the dev overlay's driver keeps its
		// volumes in the provisioner's pod, so it runs one; cluster-dev's
		// provisioner holds no driver (the drivers' own pods do).
		provisioners int32
	}{
		{"kubernetes", 2},
		{"overlays/dev", 1},
		{"overlays/csi-driver", 2},
		{"overlays/cluster-dev", 2},
		{"overlays/standalone", 1},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			budgets := map[string]bool{}
			workloads := map[string]bool{}
			for i, doc := range render(t, tc.dir) {
				if strings.Contains(string(doc), `"apiVersion":"cert-manager.io/`) {
					continue // not in client-go's scheme
				}
				obj, _, err := strict.Decode(doc, nil, nil)
				if err != nil {
					t.Errorf("#%d: %v", i, err)
					continue
				}
				var (
					name     string
					replicas *int32
					pod      *corev1.PodTemplateSpec
				)
				switch o := obj.(type) {
				case *policyv1.PodDisruptionBudget:
					if o.Spec.MinAvailable == nil || o.Spec.MinAvailable.IntValue() < 1 {
						t.Errorf("PodDisruptionBudget %s lets every replica go", o.Name)
					}
					budgets[o.Name] = true
					continue
				case *appsv1.Deployment:
					name, replicas, pod = o.Name, o.Spec.Replicas, &o.Spec.Template
				case *appsv1.StatefulSet:
					name, replicas, pod = o.Name, o.Spec.Replicas, &o.Spec.Template
				default:
					continue
				}
				workloads[name] = true
				checkWorkload(t, bin, version, name, replicas, pod, tc.provisioners)
			}
			for _, c := range componentsOf(tc.dir) {
				if !workloads[c] {
					t.Errorf("no workload %s", c)
				}
				if !budgets[c] {
					t.Errorf("no PodDisruptionBudget for %s", c)
				}
			}
		})
	}
}

func checkWorkload(t *testing.T, bin, version, name string, replicas *int32, pod *corev1.PodTemplateSpec, provisioners int32) {
	t.Helper()
	component := false
	for _, c := range components {
		component = component || c == name
	}
	switch {
	case replicas == nil:
		t.Errorf("%s: no replicas", name)
	case name == "volplane-provisioner" && *replicas != provisioners:
		t.Errorf("%s: replicas %d, want %d", name, *replicas, provisioners)
	case name == "volplane-etcd" && *replicas != 3:
		t.Errorf("%s: replicas %d, want 3 (a quorum that survives one member; docs/etcd.md)", name, *replicas)
	case component && name != "volplane-provisioner" && *replicas < 2:
		t.Errorf("%s: replicas %d, want at least 2", name, *replicas)
	}
	ps := pod.Spec.SecurityContext
	if ps == nil || ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot || ps.SeccompProfile == nil || ps.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("%s: the pod is not restricted (runAsNonRoot, seccomp RuntimeDefault): %+v", name, ps)
	}
	if len(pod.Spec.TopologySpreadConstraints) == 0 {
		t.Errorf("%s: no topology spread", name)
	}
	for _, c := range pod.Spec.Containers {
		where := name + " container " + c.Name
		image, tag, tagged := strings.Cut(c.Image[strings.LastIndex(c.Image, "/")+1:], ":")
		switch {
		case !tagged || tag == "latest":
			t.Errorf("%s: image %q is not pinned by a tag", where, c.Image)
		case image == "volplane" && tag != version:
			t.Errorf("%s: image %q, want the Makefile's VERSION %s", where, c.Image, version)
		}
		if c.ImagePullPolicy != corev1.PullIfNotPresent {
			t.Errorf("%s: imagePullPolicy %q, want IfNotPresent", where, c.ImagePullPolicy)
		}
		sc := c.SecurityContext
		if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
			t.Errorf("%s: securityContext %+v, want no privilege escalation, a read-only root and every capability dropped", where, sc)
		}
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			if _, ok := c.Resources.Requests[r]; !ok {
				t.Errorf("%s: no %s request", where, r)
			}
			if _, ok := c.Resources.Limits[r]; !ok {
				t.Errorf("%s: no %s limit", where, r)
			}
		}
		if component && c.Name != "csi-driver" && (c.ReadinessProbe == nil || c.LivenessProbe == nil) {
			t.Errorf("%s: readiness %v, liveness %v: want both", where, c.ReadinessProbe, c.LivenessProbe)
		}
		if len(c.Command) > 0 {
			acceptsFlags(t, bin, where, c.Command)
		}
	}
}

// docker-compose.yaml's volplane image is pinned to the Makefile's
// VERSION too, and no image is :latest.
func TestComposeImagesPinned(t *testing.T) {
	version := makefileVersion(t)
	b, err := os.ReadFile("../docker-compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	images := regexp.MustCompile(`(?m)^\s*image:\s*(\S+)`).FindAllSubmatch(b, -1)
	if len(images) == 0 {
		t.Fatal("no image in docker-compose.yaml")
	}
	for _, m := range images {
		image := string(m[1])
		name, tag, tagged := strings.Cut(image[strings.LastIndex(image, "/")+1:], ":")
		if !tagged || tag == "latest" || (name == "volplane" && tag != version) {
			t.Errorf("docker-compose.yaml: image %s, want a pinned tag (volplane:%s)", image, version)
		}
	}
}

// The dev CSI driver deployed as a vendor's chart deploys it
// (deploy/drivers/volplane-csi) is a real CSI driver whose parts agree
// with each other and with what a kubelet expects: the CSIDriver object;
// the node plugin's DaemonSet registering through the kubelet's plugin
// registration directory with the CSI socket's path as the kubelet sees
// it, mounting the kubelet's directory both ways, in a namespace whose Pod
// Security lets it; the controller part in the driver's own controller
// Deployment, on the same node data directory as the node plugin; the
// StorageClasses; fully-qualified images. And the cluster-dev overlay that
// serves it holds no copy of it: the provisioner's pod is the provisioner
// alone, without a hostPath, a socket of a driver or Pod Security's
// privileged profile.
func TestClusterDevOverlay(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every binary")
	}
	bin := build(t)
	version := makefileVersion(t)
	var (
		driver     *storagev1.CSIDriver
		classes    []*storagev1.StorageClass
		node       *appsv1.DaemonSet
		controller *appsv1.Deployment
		namespaces = map[string]*corev1.Namespace{}
	)
	for _, obj := range driverObjects(t) {
		switch o := obj.(type) {
		case *storagev1.CSIDriver:
			driver = o
		case *storagev1.StorageClass:
			classes = append(classes, o)
		case *appsv1.DaemonSet:
			node = o
		case *appsv1.Deployment:
			if o.Name == "volplane-csi-controller" {
				controller = o
			}
		case *corev1.Namespace:
			namespaces[o.Name] = o
		}
		for _, c := range podContainers(obj) {
			if name, tag, _ := strings.Cut(c.Image, ":"); strings.HasSuffix(name, "/volplane") || name == "volplane" {
				if name != "ghcr.io/volplane/volplane" || tag != version {
					t.Errorf("container %s: image %s, want ghcr.io/volplane/volplane:%s", c.Name, c.Image, version)
				}
			}
		}
	}
	if driver == nil || node == nil || controller == nil {
		t.Fatalf("CSIDriver %v, DaemonSet %v, controller %v: want all three", driver != nil, node != nil, controller != nil)
	}
	checkNoDriverInVolplane(t, "overlays/cluster-dev")

	const name = "hostpath.csi.volplane.io"
	ds := driver.Spec
	if driver.Name != name || ds.AttachRequired == nil || *ds.AttachRequired || ds.FSGroupPolicy == nil || ds.PodInfoOnMount == nil ||
		len(ds.VolumeLifecycleModes) != 1 || ds.VolumeLifecycleModes[0] != storagev1.VolumeLifecyclePersistent {
		t.Errorf("CSIDriver %s: %+v, want no attach, an fsGroupPolicy, podInfoOnMount set, Persistent volumes only", driver.Name, ds)
	}
	kinds := map[string]bool{}
	for _, c := range classes {
		if c.Provisioner != name {
			t.Errorf("StorageClass %s: provisioner %s, want %s", c.Name, c.Provisioner, name)
		}
		kinds[string(*c.VolumeBindingMode)+"/"+string(*c.ReclaimPolicy)] = true
	}
	for _, want := range []string{"Immediate/Delete", "WaitForFirstConsumer/Delete", "WaitForFirstConsumer/Retain"} {
		if !kinds[want] {
			t.Errorf("no StorageClass %s among %v", want, kinds)
		}
	}

	// The node plugin.
	ns := namespaces[node.Namespace]
	if ns == nil || ns.Labels["pod-security.kubernetes.io/enforce"] != "privileged" {
		t.Errorf("namespace %s of the node plugin: %v, want Pod Security enforce=privileged", node.Namespace, ns)
	}
	pod := node.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("node plugin: %d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	acceptsFlags(t, bin, "DaemonSet "+node.Name, c.Command)
	flags := flagValues(c.Command)
	if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
		t.Errorf("node plugin: securityContext %+v, want privileged (it mounts)", c.SecurityContext)
	}
	if flags["--mode"] != "node" || flags["--driver-name"] != "" && flags["--driver-name"] != name {
		t.Errorf("node plugin: flags %v", flags)
	}
	hostPathOf := func(spec corev1.PodSpec, c corev1.Container, path string) (string, *corev1.VolumeMount) {
		t.Helper()
		for _, m := range c.VolumeMounts {
			if path == m.MountPath || strings.HasPrefix(path, m.MountPath+"/") {
				for _, v := range spec.Volumes {
					if v.Name == m.Name && v.HostPath != nil {
						return v.HostPath.Path + strings.TrimPrefix(path, m.MountPath), &m
					}
				}
			}
		}
		t.Errorf("%s: %s is on no hostPath volume", c.Name, path)
		return "", nil
	}
	socket := strings.TrimPrefix(flags["--endpoint"], "unix://")
	if onHost, _ := hostPathOf(pod, c, socket); onHost != flags["--kubelet-registration-path"] || onHost != "/var/lib/kubelet/plugins/"+name+"/csi.sock" {
		t.Errorf("node plugin: the CSI socket %s is %s on the node, --kubelet-registration-path %s: want both /var/lib/kubelet/plugins/%s/csi.sock",
			socket, onHost, flags["--kubelet-registration-path"], name)
	}
	if onHost, _ := hostPathOf(pod, c, flags["--plugin-registration-dir"]); onHost != "/var/lib/kubelet/plugins_registry" {
		t.Errorf("node plugin: --plugin-registration-dir %s is %s on the node, want the kubelet's /var/lib/kubelet/plugins_registry", flags["--plugin-registration-dir"], onHost)
	}
	if onHost, m := hostPathOf(pod, c, "/var/lib/kubelet/pods"); onHost != "/var/lib/kubelet/pods" ||
		m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationBidirectional {
		t.Errorf("node plugin: the kubelet's pod directory %s, mount %+v: want /var/lib/kubelet at its own path, Bidirectional", onHost, m)
	}
	nodeData, _ := hostPathOf(pod, c, flags["--root-dir"])
	if flags["--node-id"] != "$(NODE_NAME)" || !fromNodeName(c, "NODE_NAME") {
		t.Errorf("node plugin: --node-id %q, want $(NODE_NAME) from spec.nodeName", flags["--node-id"])
	}
	if p := c.LivenessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" || !samePort(c, p.HTTPGet.Port.String(), flags["--health-address"]) {
		t.Errorf("node plugin: liveness %+v, want /healthz on --health-address %s", p, flags["--health-address"])
	}

	// The controller part, in the driver's own controller pod.
	pspec := controller.Spec.Template.Spec
	var ctrl *corev1.Container
	for i := range pspec.Containers {
		if pspec.Containers[i].Name == "volplane-csi" {
			ctrl = &pspec.Containers[i]
		}
	}
	if ctrl == nil {
		t.Fatal("no volplane-csi container in the driver's controller pod")
	}
	cflags := flagValues(ctrl.Command)
	if cflags["--mode"] != "controller" || cflags["--node-capacity"] == "" || cflags["--node-id"] != "$(NODE_NAME)" || !fromNodeName(*ctrl, "NODE_NAME") {
		t.Errorf("controller part: flags %v, want --mode=controller, a --node-capacity, --node-id=$(NODE_NAME) from spec.nodeName", cflags)
	}
	if ctrlData, _ := hostPathOf(pspec, *ctrl, cflags["--root-dir"]); ctrlData == "" || ctrlData != nodeData {
		t.Errorf("controller part's data directory %q on the node, node plugin's %q: want one hostPath", ctrlData, nodeData)
	}
	if *controller.Spec.Replicas < 2 {
		t.Errorf("controller replicas %d, want at least 2", *controller.Spec.Replicas)
	}
	if p := ctrl.LivenessProbe; p == nil || p.HTTPGet == nil || !samePort(*ctrl, p.HTTPGet.Port.String(), cflags["--health-address"]) {
		t.Errorf("controller part: liveness %+v, want /healthz on --health-address %s", p, cflags["--health-address"])
	}
}

// checkNoDriverInVolplane checks that an overlay's volplane holds no copy
// of a driver: the provisioner's pod runs the provisioner alone, with no
// --csi-endpoint and no hostPath, and volplane-system keeps the
// restricted Pod Security profile.
func checkNoDriverInVolplane(t *testing.T, dir string) {
	t.Helper()
	strict := json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme.Scheme, scheme.Scheme, json.SerializerOptions{Strict: true})
	found := false
	for i, doc := range render(t, dir) {
		if strings.Contains(string(doc), `"apiVersion":"cert-manager.io/`) {
			continue
		}
		obj, _, err := strict.Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("%s #%d: %v", dir, i, err)
		}
		switch o := obj.(type) {
		case *corev1.Namespace:
			if o.Name == "volplane-system" && o.Labels["pod-security.kubernetes.io/enforce"] == "privileged" {
				t.Errorf("%s: volplane-system is Pod Security privileged", dir)
			}
		case *appsv1.Deployment:
			if o.Name != "volplane-provisioner" {
				continue
			}
			found = true
			spec := o.Spec.Template.Spec
			if len(spec.Containers) != 1 || spec.Containers[0].Name != "provisioner" {
				t.Errorf("%s: the provisioner's pod has %d containers, want the provisioner alone", dir, len(spec.Containers))
			}
			for _, a := range spec.Containers[0].Command {
				if strings.HasPrefix(a, "--csi-endpoint") {
					t.Errorf("%s: the provisioner has %s, want drivers found by their sidecars", dir, a)
				}
			}
			for _, v := range spec.Volumes {
				if v.HostPath != nil {
					t.Errorf("%s: the provisioner's pod mounts the node's %s", dir, v.HostPath.Path)
				}
			}
		}
	}
	if !found {
		t.Errorf("%s: no provisioner", dir)
	}
}

// podContainers are the containers of a workload object.
func podContainers(obj any) []corev1.Container {
	switch o := obj.(type) {
	case *appsv1.Deployment:
		return o.Spec.Template.Spec.Containers
	case *appsv1.StatefulSet:
		return o.Spec.Template.Spec.Containers
	case *appsv1.DaemonSet:
		return o.Spec.Template.Spec.Containers
	}
	return nil
}

// flagValues maps a command line's --name=value flags.
func flagValues(command []string) map[string]string {
	out := map[string]string{}
	for _, a := range command[1:] {
		if k, v, ok := strings.Cut(a, "="); ok {
			out[k] = v
		}
	}
	return out
}

// fromNodeName reports whether the container's variable comes from the
// pod's spec.nodeName.
func fromNodeName(c corev1.Container, name string) bool {
	for _, e := range c.Env {
		if e.Name == name && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName" {
			return true
		}
	}
	return false
}

// samePort reports whether a probe's port (a number or a port name of the
// container) is the port of a listen address.
func samePort(c corev1.Container, port, listen string) bool {
	want := listen[strings.LastIndex(listen, ":")+1:]
	if port == want {
		return true
	}
	for _, p := range c.Ports {
		if p.Name == port && strconv.Itoa(int(p.ContainerPort)) == want {
			return true
		}
	}
	return false
}
