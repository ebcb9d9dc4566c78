package cluster

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The dev CSI driver deployed as vendors ship drivers
// (deploy/drivers/volplane-csi): its namespace, its controller Deployment
// (the driver and the upstream sidecars), the name of the sidecar that
// volplane's takes the place of, and the driver's name.
const (
	driverNS           = "volplane-csi"
	driverController   = "volplane-csi-controller"
	provisionerSidecar = "csi-provisioner"
	devDriverName      = "hostpath.csi.volplane.io"
	// driverLock is csi-provisioner's leader lock of the driver (a Lease
	// in driverNS), which volplane-csi-sidecar takes in its place.
	driverLock = "hostpath-csi-volplane-io"
)

// stepTable runs a test's steps in order as subtests, each returning what
// it saw, and keeps one row per step for the table the test prints.
type stepTable struct {
	t    *testing.T
	rows [][]string
}

// run runs step name; false when it failed (the steps after it, which
// build on it, are not run).
func (s *stepTable) run(name string, step func(t *testing.T) string) bool {
	start, detail := time.Now(), ""
	ok := s.t.Run(name, func(t *testing.T) { detail = step(t) })
	result := "ok"
	if !ok {
		result = "FAIL"
	}
	s.rows = append(s.rows, []string{name, result, time.Since(start).Round(time.Second).String(), detail})
	return ok
}

// print logs the table.
func (s *stepTable) print() {
	s.t.Logf("steps:\n%s", table(append([][]string{{"STEP", "RESULT", "TOOK", "WHAT WAS SEEN"}}, s.rows...)))
}

// beforeSteps are TestCluster's phase "before": the dev CSI driver
// deployed as a vendor's chart deploys a driver, with the upstream
// sidecars built from their pinned modules (deploy/drivers/volplane-csi,
// the VolumeSnapshot CRDs and the snapshot controller), next to
// kube-controller-manager's binder and without volplane: a StatefulSet
// on a WaitForFirstConsumer class, a snapshot and a claim restored from
// it, a clone, a Retain and a Delete volume write and read their data;
// csi-resizer expands a claim; Delete removes the driver's volume and
// Retain keeps it; csi-provisioner's image swapped (to the same image by
// digest) and back changes nothing else and keeps provisioning; nothing
// leaks; and the Retain and Delete volumes the cutover finds. crds is the
// directory of the CRDs hack/build-csi-sidecars.sh copied from the
// external-snapshotter client module ($VOLPLANE_SNAPSHOT_CRDS).
func (cu *vendorCutover) beforeSteps(crds string) []step {
	w := cu.w
	return []step{
		{"install the driver, its sidecars and the snapshot controller", func(t *testing.T) string {
			kcmBinderOff(t, false)
			return installVendorDriver(t, crds)
		}},
		{"StatefulSet of 2 on the WaitForFirstConsumer class", w.statefulSet},
		{"snapshot of data-web-0, claim restored from it", w.snapshotRestore},
		{"clone of data-web-1", w.clone},
		{"a Retain volume and a Delete volume", w.retainAndDelete},
		{"expand data-web-0 10Mi -> 20Mi (csi-resizer)", w.expand},
		{"delete both claims: Delete's volume gone, Retain's kept", w.deleteClaims},
		{"driver volumes against PVs", func(t *testing.T) string { return noLeaks(t) }},
		{"swap csi-provisioner's image (same image by digest) and back", w.swapAndBack},
		{"a Retain and a Delete volume for the cutover (csi-provisioner)", cu.before},
	}
}

// installVendorDriver applies the snapshot CRDs, then the driver's
// kustomization, and waits until everything is rolled out and the
// kubelet lists the driver on the node.
func installVendorDriver(t *testing.T, crds string) string {
	// The cache's snapshot-crds is a link to the versioned directory:
	// kubectl reads a directory's files only when named by the directory.
	dir, err := filepath.EvalSymlinks(crds)
	if err != nil {
		t.Fatal(err)
	}
	c.Kubectl(t, "apply", "-f", dir)
	c.Kubectl(t, "wait", "--for=condition=Established", "--timeout=60s",
		"crd/volumesnapshots.snapshot.storage.k8s.io", "crd/volumesnapshotcontents.snapshot.storage.k8s.io",
		"crd/volumesnapshotclasses.snapshot.storage.k8s.io")
	c.Kubectl(t, "apply", "-k", filepath.Join(repoRoot(t), "deploy/drivers/volplane-csi"))
	for _, w := range [][]string{
		{"-n", driverNS, "deployment/" + driverController},
		{"-n", driverNS, "daemonset/volplane-csi-node"},
		{"-n", "kube-system", "deployment/snapshot-controller"},
	} {
		c.Kubectl(t, append([]string{"rollout", "status", "--timeout=100s"}, w...)...)
	}
	waitFor(t, time.Minute, func() string {
		out := c.Kubectl(t, "get", "csinodes", "-o", "jsonpath={.items[*].spec.drivers[*].name}")
		if !strings.Contains(out, devDriverName) {
			return "no CSINode lists " + devDriverName + ": " + out
		}
		return ""
	})
	rows := driverContainers(t)
	t.Logf("the driver's controller pod:\n%s", table(append([][]string{{"CONTAINER", "IMAGE"}}, rows...)))
	return fmt.Sprintf("CRDs Established; controller, node plugin, snapshot-controller rolled out; CSINode lists the driver; controller containers: %d", len(rows))
}

// driverContainers are the controller Deployment's containers and images.
func driverContainers(t testing.TB) [][]string {
	t.Helper()
	d, err := c.Client.AppsV1().Deployments(driverNS).Get(t.Context(), driverController, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var rows [][]string
	for _, ct := range d.Spec.Template.Spec.Containers {
		rows = append(rows, []string{ct.Name, ct.Image})
	}
	return rows
}

// swapProvisionerImage sets the image of the driver's csi-provisioner
// container, and nothing else, by a patch (swapProvisionerImageBy).
func swapProvisionerImage(t testing.TB, image string) (before, after [][]string) {
	t.Helper()
	return swapProvisionerImageBy(t, image, func() {
		patch := fmt.Sprintf(`{"spec":{"template":{"spec":{"containers":[{"name":%q,"image":%q}]}}}}`, provisionerSidecar, image)
		c.Kubectl(t, "patch", "deployment", "-n", driverNS, driverController, "--type=strategic", "-p", patch)
	})
}

// swapProvisionerImageBy runs swap, which is to set the image of the
// driver's csi-provisioner container to image (docs/install.md's
// swap-sidecars step, or a patch); waits until the Deployment is rolled
// out with every pod Ready; checks that the pod template differs in that
// image alone; and returns the containers before and after.
func swapProvisionerImageBy(t testing.TB, image string, swap func()) (before, after [][]string) {
	t.Helper()
	deployments := c.Client.AppsV1().Deployments(driverNS)
	old, err := deployments.Get(t.Context(), driverController, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	before = driverContainers(t)
	swap()
	c.Kubectl(t, "rollout", "status", "-n", driverNS, "deployment/"+driverController, "--timeout=5m")
	now, err := deployments.Get(t.Context(), driverController, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := templateDiff(old, now, image); diff != "" {
		t.Fatalf("swapping csi-provisioner's image changed more than its image: %s", diff)
	}
	waitFor(t, 2*time.Minute, func() string { return notReadyIn(t, driverNS, map[string]int{driverController: 2}) })
	return before, driverContainers(t)
}

// templateDiff is "" when now's pod template is old's with csi-provisioner's
// image set to image, else what differs.
func templateDiff(old, now *appsv1.Deployment, image string) string {
	want := old.Spec.Template.DeepCopy()
	for i := range want.Spec.Containers {
		if want.Spec.Containers[i].Name == provisionerSidecar {
			want.Spec.Containers[i].Image = image
		}
	}
	if reflect.DeepEqual(want.Spec, now.Spec.Template.Spec) && reflect.DeepEqual(want.Labels, now.Spec.Template.Labels) {
		return ""
	}
	a, _ := json.Marshal(want.Spec)
	b, _ := json.Marshal(now.Spec.Template.Spec)
	return fmt.Sprintf("want %s, have %s", a, b)
}

// driverState is the dev driver's own record of its volumes and
// snapshots (internal/devcsi: one JSON file per object under the node's
// <root>/state), by ID: what its ListVolumes and ListSnapshots answer.
type driverState struct {
	Volumes   map[string]driverVolume
	Snapshots map[string]bool
}

// driverVolume is what the test reads of a volume's state file.
type driverVolume struct {
	ID            string `json:"id"`
	Name          string `json:"name"`
	CapacityBytes int64  `json:"capacityBytes"`
}

// readDriverState reads the driver's state files on the node.
func readDriverState(t testing.TB) driverState {
	t.Helper()
	st := driverState{Volumes: map[string]driverVolume{}, Snapshots: map[string]bool{}}
	for _, kind := range []string{"volumes", "snapshots"} {
		files, err := filepath.Glob(filepath.Join(devDriverRoot, "state", kind, "*.json"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			id := strings.TrimSuffix(filepath.Base(f), ".json")
			if kind == "snapshots" {
				st.Snapshots[id] = true
				continue
			}
			b, err := os.ReadFile(f)
			if os.IsNotExist(err) {
				continue // deleted since the glob
			}
			var v driverVolume
			if err == nil {
				err = json.Unmarshal(b, &v)
			}
			if err != nil {
				t.Fatalf("the driver's state file %s: %v", f, err)
			}
			st.Volumes[id] = v
		}
	}
	return st
}

// driverVolumesAgainstPVs compares the driver's volumes with the PVs of
// the driver: one row per volume or PV, and the problems (a volume no PV
// names: leaked; a PV whose volume the driver lacks: lost).
func driverVolumesAgainstPVs(t testing.TB) (rows [][]string, problems []string) {
	t.Helper()
	vols := readDriverState(t).Volumes
	handles := volumeHandles(t) // volume handle -> PV
	ids := map[string]bool{}
	for id := range vols {
		ids[id] = true
	}
	for h := range handles {
		ids[h] = true
	}
	sorted := make([]string, 0, len(ids))
	for id := range ids {
		sorted = append(sorted, id)
	}
	sort.Strings(sorted)
	rows = [][]string{{"DRIVER VOLUME", "NAME", "PV", "VERDICT"}}
	for _, id := range sorted {
		v, inDriver := vols[id]
		pv, hasPV := handles[id]
		verdict := "ok"
		switch {
		case !hasPV:
			verdict, pv = "LEAKED: no PV", "-"
			problems = append(problems, fmt.Sprintf("driver volume %s (%s) has no PV", id, v.Name))
		case !inDriver:
			verdict, id = "LOST: the driver has no such volume", id+" (missing)"
			problems = append(problems, fmt.Sprintf("PV %s names volume %s, which the driver lacks", pv, id))
		}
		rows = append(rows, []string{id, v.Name, pv, verdict})
	}
	return rows, problems
}

// noLeaks checks the driver's volumes against the PVs and logs the table.
func noLeaks(t *testing.T) string {
	rows, problems := driverVolumesAgainstPVs(t)
	t.Logf("the driver's volumes against the PVs:\n%s", table(rows))
	for _, p := range problems {
		t.Error(p)
	}
	return fmt.Sprintf("%d driver volumes, %d problems", len(rows)-1, len(problems))
}

// claimManifest is a claim of class, with a data source when kind is set.
func claimManifest(name, class, size, kind, source string) string {
	ds := ""
	switch kind {
	case "VolumeSnapshot":
		ds = fmt.Sprintf("\n  dataSource: {apiGroup: snapshot.storage.k8s.io, kind: VolumeSnapshot, name: %s}", source)
	case "PersistentVolumeClaim":
		ds = fmt.Sprintf("\n  dataSource: {kind: PersistentVolumeClaim, name: %s}", source)
	}
	return fmt.Sprintf(`
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: %s}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: %s
  resources: {requests: {storage: %s}}%s
`, name, class, size, ds)
}

// claimPod is a pod of the workload image holding claim at /data,
// writing /data/id=text first unless text is empty or the file is there.
func claimPod(name, claim, text string) string {
	args := "[hold]"
	if text != "" {
		args = fmt.Sprintf("[hold, -write, %q]", "/data/id="+text)
	}
	return fmt.Sprintf(`
apiVersion: v1
kind: Pod
metadata: {name: %s}
spec:
  terminationGracePeriodSeconds: 2
  automountServiceAccountToken: false
  containers:
    - name: workload
      image: %s
      imagePullPolicy: Never
      args: %s
      volumeMounts: [{name: data, mountPath: /data}]
  volumes: [{name: data, persistentVolumeClaim: {claimName: %s}}]
`, name, c.WorkloadImage, args, claim)
}

// readClaim waits for pod to be Ready and returns its /data/id, failing
// when it is not want.
func readClaim(t *testing.T, ns, pod, want string) string {
	t.Helper()
	c.WaitPodReady(t, ns, pod, 3*time.Minute)
	got := c.Exec(t, ns, pod, "volplane-workload", "cat", "/data/id")
	if got != want {
		t.Errorf("pod %s reads %q, want %q", pod, got, want)
	}
	return fmt.Sprintf("%s: %q", pod, got)
}

// claimVolume is the PV and the driver's volume handle of a bound claim.
func claimVolume(t testing.TB, ns, claim string) (pv, handle string) {
	t.Helper()
	pvc, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Get(t.Context(), claim, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v, err := c.Client.CoreV1().PersistentVolumes().Get(t.Context(), pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("claim %s's PV %q: %v", claim, pvc.Spec.VolumeName, err)
	}
	if v.Spec.CSI == nil || v.Spec.CSI.Driver != devDriverName {
		t.Fatalf("claim %s's PV %s is not the dev driver's: %+v", claim, v.Name, v.Spec.PersistentVolumeSource)
	}
	if by := v.Annotations["pv.kubernetes.io/provisioned-by"]; by != devDriverName {
		t.Errorf("PV %s provisioned-by %q, want %s (csi-provisioner)", v.Name, by, devDriverName)
	}
	return v.Name, v.Spec.CSI.VolumeHandle
}

// pvPhase is a PV's phase, "gone" when it does not exist.
func pvPhase(t testing.TB, name string) string {
	t.Helper()
	pv, err := c.Client.CoreV1().PersistentVolumes().Get(t.Context(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "gone"
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(pv.Status.Phase)
}

// capacity is a quantity's canonical string, "" for none.
func capacity(rl corev1.ResourceList) string {
	q, ok := rl[corev1.ResourceStorage]
	if !ok {
		return ""
	}
	return q.String()
}
