package standalone

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/faultpoint"
	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/test/harness/chaos"
	"github.com/volplane/volplane/test/harness/devenv"
	"github.com/volplane/volplane/test/harness/e2e"
)

const namespace = "standalone"

// createVolumeDelay slows every CreateVolume of the dev CSI driver, so a
// claim can be deleted while its CreateVolume is in flight.
const createVolumeDelay = 3 * time.Second

// findKCM is the pinned kube-controller-manager, "" when there is none.
func findKCM() string {
	if p := os.Getenv("VOLPLANE_KUBE_CONTROLLER_MANAGER"); p != "" {
		return p
	}
	home, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	p := filepath.Join(home, "volplane", "kube-controller-manager-"+devenv.KubeVersion)
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// env is what the subtests share.
type env struct {
	t   testing.TB
	c   *chaos.Cluster
	kcm *devenv.Process
}

func TestStandalone(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the services as processes beside kube-controller-manager")
	}
	kcmBin := findKCM()
	if kcmBin == "" {
		t.Skip("no kube-controller-manager (make kube-controller-manager, or set VOLPLANE_KUBE_CONTROLLER_MANAGER)")
	}
	if _, err := devenv.FindKubeAPIServer(); err != nil {
		t.Skip(err)
	}
	ctx := t.Context()
	bin := t.TempDir()
	if err := chaos.Build(ctx, bin); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	c, err := chaos.StartCluster(ctx, chaos.ClusterOptions{Dir: dir, BinDir: bin, Watchers: 1, Provisioners: 2, Reclaimers: 1,
		Standalone: true, CSIArgs: []string{"--fault", "CreateVolume=delay:" + createVolumeDelay.String()}, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	// kube-controller-manager's binder and the protection controllers
	// that stay on a managed cluster.
	kcm, err := devenv.StartProcess(dir, "kube-controller-manager", kcmBin, "--kubeconfig", c.API.Kubeconfig,
		"--controllers", "persistentvolume-binder-controller,persistentvolumeclaim-protection-controller,persistentvolume-protection-controller",
		"--leader-elect=false", "--secure-port=0", "--v=2")
	if err != nil {
		t.Fatal(err)
	}
	defer kcm.Stop()
	t.Cleanup(func() {
		if t.Failed() {
			dumpLogs(t, dir)
		}
	})
	x := &env{t: t, c: c, kcm: kcm}
	x.setup()

	t.Run("immediate", func(t *testing.T) { x.t = t; x.immediate() })
	t.Run("wait-for-first-consumer", func(t *testing.T) { x.t = t; x.waitForFirstConsumer() })
	t.Run("delete-and-retain", func(t *testing.T) { x.t = t; x.deleteAndRetain() })
	t.Run("claim-deleted-during-create-volume", func(t *testing.T) { x.t = t; x.deletedDuringCreate() })
	t.Run(faultpoint.ProvisionerAfterCreateVolume, func(t *testing.T) { x.t = t; x.killedAfterCreate() })
	t.Run("parity-with-external-provisioner", func(t *testing.T) { x.t = t; x.parity() })
	t.Run("parity-of-flags", func(t *testing.T) { x.t = t; x.parityFlags() })
	t.Run("parity-attributes-classes-and-secret-keys", func(t *testing.T) { x.t = t; x.parityClassesAndSecrets() })
	t.Run("parity-data-sources", func(t *testing.T) { x.t = t; x.paritySources() })
	x.t = t
	x.noLeaks()
}

// Classes of the dev driver.
const (
	classDelete = "sa-delete"
	classRetain = "sa-retain"
	classWFFC   = "sa-wffc"
)

func (x *env) setup() {
	x.t.Helper()
	if _, err := x.c.Client.CoreV1().Namespaces().Create(x.t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		x.t.Fatal(err)
	}
	del, ret := corev1.PersistentVolumeReclaimDelete, corev1.PersistentVolumeReclaimRetain
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	e2e.CreateClass(x.t, x.c.Client, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: classDelete}, Provisioner: devcsi.DefaultName, ReclaimPolicy: &del})
	e2e.CreateClass(x.t, x.c.Client, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: classRetain}, Provisioner: devcsi.DefaultName, ReclaimPolicy: &ret})
	e2e.CreateClass(x.t, x.c.Client, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: classWFFC}, Provisioner: devcsi.DefaultName, ReclaimPolicy: &del,
		VolumeBindingMode: &wffc})
}

func (x *env) claim(name, class string, ann map[string]string) *corev1.PersistentVolumeClaim {
	x.t.Helper()
	c := e2e.Claim(namespace, name, "1Gi", class)
	c.Annotations = ann
	cl, err := x.c.Client.CoreV1().PersistentVolumeClaims(namespace).Create(x.t.Context(), c, metav1.CreateOptions{})
	if err != nil {
		x.t.Fatal(err)
	}
	return cl
}

// bound waits until kube-controller-manager has bound the claim to the
// PV volplane's provisioner wrote for it, and checks that PV.
func (x *env) bound(cl *corev1.PersistentVolumeClaim, policy corev1.PersistentVolumeReclaimPolicy) *corev1.PersistentVolume {
	x.t.Helper()
	name := "pvc-" + string(cl.UID)
	got := e2e.ClaimPhase(x.t, x.c.Client, cl.Namespace, cl.Name, corev1.ClaimBound, 2*time.Minute)
	if got.Spec.VolumeName != name {
		x.t.Fatalf("claim %s bound to %q, want %s", cl.Name, got.Spec.VolumeName, name)
	}
	pv := e2e.VolumePhase(x.t, x.c.Client, name, corev1.VolumeBound, time.Minute)
	if pv.Annotations[kube.AnnDynamicallyProvisioned] != devcsi.DefaultName || pv.Spec.CSI == nil || pv.Spec.CSI.Driver != devcsi.DefaultName ||
		pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.UID != cl.UID || pv.Spec.PersistentVolumeReclaimPolicy != policy {
		x.t.Fatalf("PV %s: annotations %v, csi %v, claimRef %v, policy %s", name, pv.Annotations, pv.Spec.CSI, pv.Spec.ClaimRef, pv.Spec.PersistentVolumeReclaimPolicy)
	}
	// kube-controller-manager bound it: its annotation, not volplane's
	// binder's field manager.
	if got.Annotations[kube.AnnBindCompleted] != "yes" || got.Annotations[kube.AnnBoundByController] != "yes" {
		x.t.Fatalf("claim annotations %v: not bound by kube-controller-manager", got.Annotations)
	}
	wantFinalizer := policy == corev1.PersistentVolumeReclaimDelete
	if has := contains(pv.Finalizers, kube.FinalizerExternalProvisioner); has != wantFinalizer {
		x.t.Fatalf("PV %s finalizers %v: external-provisioner finalizer %v, want %v", name, pv.Finalizers, has, wantFinalizer)
	}
	if !x.hasCSIVolume(name) {
		x.t.Fatalf("the driver has no volume %s", name)
	}
	return pv
}

func contains(l []string, s string) bool {
	for _, e := range l {
		if e == s {
			return true
		}
	}
	return false
}

// immediate: an Immediate claim is annotated by kube-controller-manager,
// provisioned by volplane with external-provisioner's Events, and bound
// by kube-controller-manager.
func (x *env) immediate() {
	cl := x.claim("immediate", classDelete, nil)
	x.bound(cl, corev1.PersistentVolumeReclaimDelete)
	e2e.HasEvent(x.t, x.c.Client, namespace, "PersistentVolumeClaim", cl.Name, "ExternalProvisioning", "Waiting for a volume to be created", "persistentvolume-controller", 10*time.Second)
	e2e.HasEvent(x.t, x.c.Client, namespace, "PersistentVolumeClaim", cl.Name, "Provisioning",
		fmt.Sprintf("External provisioner is provisioning volume for claim %q", namespace+"/"+cl.Name), devcsi.DefaultName+"_", 10*time.Second)
	e2e.HasEvent(x.t, x.c.Client, namespace, "PersistentVolumeClaim", cl.Name, "ProvisioningSucceeded",
		"Successfully provisioned volume pvc-"+string(cl.UID), devcsi.DefaultName+"_", 10*time.Second)
	// Two provisioner replicas, one Provisioning event: one attempt.
	if n := x.count(cl.Name, "Provisioning"); n != 1 {
		x.t.Errorf("%d Provisioning events, want 1 (one replica provisions a claim)", n)
	}
}

// count sums the counts of the claim's events with reason.
func (x *env) count(claim, reason string) int32 {
	x.t.Helper()
	evs, err := e2e.Events(x.c.Client, namespace, "PersistentVolumeClaim", claim)
	if err != nil {
		x.t.Fatal(err)
	}
	var n int32
	for _, e := range evs {
		if e.Reason == reason {
			n += max(e.Count, 1)
		}
	}
	return n
}

// waitForFirstConsumer: nothing is provisioned until a node is selected
// (there is no scheduler: the test selects it), then it is.
func (x *env) waitForFirstConsumer() {
	cl := x.claim("wffc", classWFFC, nil)
	e2e.HasEvent(x.t, x.c.Client, namespace, "PersistentVolumeClaim", cl.Name, "WaitForFirstConsumer", "", "persistentvolume-controller", 30*time.Second)
	time.Sleep(createVolumeDelay) // would be long enough for an attempt
	if x.hasCSIVolume("pvc-" + string(cl.UID)) {
		x.t.Fatal("a WaitForFirstConsumer claim without a selected node was provisioned")
	}
	got, err := x.c.Client.CoreV1().PersistentVolumeClaims(namespace).Get(x.t.Context(), cl.Name, metav1.GetOptions{})
	if err != nil {
		x.t.Fatal(err)
	}
	metav1.SetMetaDataAnnotation(&got.ObjectMeta, kube.AnnSelectedNode, chaos.NodeName)
	if _, err := x.c.Client.CoreV1().PersistentVolumeClaims(namespace).Update(x.t.Context(), got, metav1.UpdateOptions{}); err != nil {
		x.t.Fatal(err)
	}
	pv := x.bound(cl, corev1.PersistentVolumeReclaimDelete)
	if pv.Spec.NodeAffinity == nil {
		x.t.Errorf("PV %s of a WaitForFirstConsumer claim has no node affinity", pv.Name)
	}
}

// deleteAndRetain: after their claims are deleted, the Delete volume is
// deleted from the driver (and its PV), the Retain one kept, Released.
func (x *env) deleteAndRetain() {
	del, ret := x.claim("del", classDelete, nil), x.claim("ret", classRetain, nil)
	x.bound(del, corev1.PersistentVolumeReclaimDelete)
	x.bound(ret, corev1.PersistentVolumeReclaimRetain)
	x.deleteClaim(del)
	x.deleteClaim(ret)
	x.gone("pvc-" + string(del.UID))
	e2e.VolumePhase(x.t, x.c.Client, "pvc-"+string(ret.UID), corev1.VolumeReleased, time.Minute)
	e2e.Consistently(x.t, 3*time.Second, func() string {
		if !x.hasCSIVolume("pvc-" + string(ret.UID)) {
			return "the Retain volume was deleted from the driver"
		}
		if _, err := x.c.Client.CoreV1().PersistentVolumes().Get(x.t.Context(), "pvc-"+string(ret.UID), metav1.GetOptions{}); err != nil {
			return "the Retain PV: " + err.Error()
		}
		return ""
	})
}

func (x *env) deleteClaim(cl *corev1.PersistentVolumeClaim) {
	x.t.Helper()
	if err := x.c.Client.CoreV1().PersistentVolumeClaims(cl.Namespace).Delete(x.t.Context(), cl.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		x.t.Fatal(err)
	}
}

// gone waits until the PV, its backing volume and any journal record of
// it are gone.
func (x *env) gone(name string) {
	x.t.Helper()
	e2e.Eventually(x.t, 2*time.Minute, func() string {
		if _, err := x.c.Client.CoreV1().PersistentVolumes().Get(x.t.Context(), name, metav1.GetOptions{}); err == nil {
			return "PV " + name + " still exists"
		}
		if x.hasCSIVolume(name) {
			return "CSI volume " + name + " still exists"
		}
		j, err := x.c.JournalNames(x.t.Context())
		if err != nil {
			return err.Error()
		}
		if j[name] {
			return "the journal still holds " + name
		}
		return ""
	})
}

func (x *env) hasCSIVolume(name string) bool {
	x.t.Helper()
	vols, err := x.c.CSIVolumes()
	if err != nil {
		x.t.Fatal(err)
	}
	for _, n := range vols {
		if n == name {
			return true
		}
	}
	return false
}

// deletedDuringCreate is external-provisioner #486: the claim is deleted
// while its CreateVolume is in flight; the volume the driver then makes
// is deleted, and no PV is written.
func (x *env) deletedDuringCreate() {
	cl := x.claim("slow", classDelete, nil)
	e2e.HasEvent(x.t, x.c.Client, namespace, "PersistentVolumeClaim", cl.Name, "Provisioning", "", "", 30*time.Second)
	x.deleteClaim(cl)
	e2e.Eventually(x.t, time.Minute, func() string {
		if _, err := x.c.Client.CoreV1().PersistentVolumeClaims(namespace).Get(x.t.Context(), cl.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Sprintf("claim still there: %v", err)
		}
		return ""
	})
	time.Sleep(createVolumeDelay) // the CreateVolume in flight ends
	x.gone("pvc-" + string(cl.UID))
	// Undone by the provisioner itself (no PV was written and reclaimed).
	x.undone("pvc-" + string(cl.UID))
}

// undone checks that a provisioner replica undid the provisioning of
// volume: it deleted the volume it made, and wrote no PV.
func (x *env) undone(volume string) {
	x.t.Helper()
	for _, r := range x.c.Replicas("provisioner") {
		b, err := os.ReadFile(r.LogPath())
		if err != nil {
			x.t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, "provisioning undone") && strings.Contains(line, volume) {
				return
			}
		}
	}
	x.t.Errorf("no provisioner log says the provisioning of %s was undone", volume)
}

// killedAfterCreate is external-provisioner #1469: the provisioner dies
// between CreateVolume and the PV write. A claim kept gets its volume
// when a replica recovers; one deleted meanwhile leaves nothing.
func (x *env) killedAfterCreate() {
	ps := x.c.Replicas("provisioner")
	armed, other := ps[0], ps[1]
	other.Stop() // so the armed replica is the one that provisions
	defer func() {
		if err := other.Start(); err != nil {
			x.t.Error(err)
		}
	}()
	for _, deleteMeanwhile := range []bool{false, true} {
		x.c.ArmFault(x.t, armed, faultpoint.ProvisionerAfterCreateVolume)
		cl := x.claim(fmt.Sprintf("killed-%v", deleteMeanwhile), classDelete, nil)
		chaos.WaitFaultExit(x.t, armed)
		name := "pvc-" + string(cl.UID)
		if !x.hasCSIVolume(name) {
			x.t.Fatalf("the provisioner stopped after CreateVolume, yet the driver has no volume %s", name)
		}
		if deleteMeanwhile {
			x.deleteClaim(cl)
		}
		if err := armed.Start(); err != nil {
			x.t.Fatal(err)
		}
		if deleteMeanwhile {
			x.gone(name)
			x.undone(name)
			continue
		}
		x.bound(cl, corev1.PersistentVolumeReclaimDelete)
		x.deleteClaim(cl)
		x.gone(name)
	}
}

// noLeaks: every backing volume of the driver has a PV, and the journal
// is empty.
func (x *env) noLeaks() {
	x.t.Helper()
	e2e.Eventually(x.t, time.Minute, func() string {
		vols, err := x.c.CSIVolumes()
		if err != nil {
			return err.Error()
		}
		for _, name := range vols {
			if _, err := x.c.Client.CoreV1().PersistentVolumes().Get(context.Background(), name, metav1.GetOptions{}); err != nil {
				return fmt.Sprintf("the driver's volume %s has no PV: %v", name, err)
			}
		}
		j, err := x.c.JournalNames(context.Background())
		if err != nil {
			return err.Error()
		}
		if len(j) > 0 {
			return fmt.Sprintf("journal records left: %v", j)
		}
		return ""
	})
}

func dumpLogs(t *testing.T, dir string) {
	logs, _ := filepath.Glob(filepath.Join(dir, "logs", "*.log"))
	logs = append(logs, filepath.Join(dir, "kube-controller-manager.log"), filepath.Join(dir, "csi-provisioner.log"))
	for _, p := range logs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		const max = 16 << 10
		if len(b) > max {
			b = b[len(b)-max:]
		}
		t.Logf("---- %s ----\n%s", filepath.Base(p), strings.TrimSpace(string(b)))
	}
}

// findCSIProvisioner is external-provisioner v6.3.0's binary, built by
// the cluster tests; "" when there is none.
func findCSIProvisioner() string {
	if p := os.Getenv("VOLPLANE_CSI_PROVISIONER"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return ""
		}
		return p
	}
	home, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	p := filepath.Join(home, "volplane", "csi-provisioner-v6.3.0")
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// made is what one provisioner made for a claim: the PV, the backing
// volume as the driver keeps it, and the provisioner's Events.
type made struct {
	pv     *corev1.PersistentVolume
	volume map[string]any
	events []string
}

// parity provisions one claim with external-provisioner v6.3.0 on the
// same driver and class, beside the same kube-controller-manager, and one
// with volplane's standalone provisioner, and compares what each made.
func (x *env) parity() {
	bin := findCSIProvisioner()
	if bin == "" {
		x.t.(*testing.T).Skip("no csi-provisioner v6.3.0 (VOLPLANE_CSI_PROVISIONER)")
	}
	ps := x.c.Replicas("provisioner")
	for _, r := range ps {
		r.Stop()
	}
	ep := x.startCSIProvisioner(bin)
	theirs := x.provisionWith("parity-ep", "^"+devcsi.DefaultName+"_")
	ep.Stop()
	for _, r := range ps {
		if err := r.Start(); err != nil {
			x.t.Fatal(err)
		}
		if err := x.c.WaitServing(x.t.Context(), r, 2*time.Minute); err != nil {
			x.t.Fatal(err)
		}
	}
	ours := x.provisionWith("parity-vp", "^"+devcsi.DefaultName+"_")
	for _, d := range diffMade(theirs, ours) {
		x.t.Error(d)
	}
	x.t.Logf("external-provisioner and volplane made the same PV (%d annotations, finalizers %v), the same volume %v and the same Events %q",
		len(ours.pv.Annotations), ours.pv.Finalizers, normalVolume(ours.volume), ours.events)
}

// startCSIProvisioner starts csi-provisioner bin on the dev driver with
// the parity check's flags, then extra.
func (x *env) startCSIProvisioner(bin string, extra ...string) *devenv.Process {
	x.t.Helper()
	args := append([]string{"--csi-address", x.c.CSI.Addr, "--kubeconfig", x.c.API.Kubeconfig, "--timeout", "10s", "--v", "2"}, extra...)
	ep, err := devenv.StartProcess(x.c.Dir, "csi-provisioner", bin, args...)
	if err != nil {
		x.t.Fatal(err)
	}
	return ep
}

// provisionWith makes a claim of classDelete, waits for it to be bound,
// and returns what was made, with the events from sources matching
// component.
func (x *env) provisionWith(name, component string) made {
	x.t.Helper()
	return x.madeFor(x.claim(name, classDelete, nil), component)
}

// madeFor waits for the claim cl to be bound and returns what was made,
// with the events from sources matching component.
func (x *env) madeFor(cl *corev1.PersistentVolumeClaim, component string) made {
	x.t.Helper()
	name := cl.Name
	pv := x.bound(cl, corev1.PersistentVolumeReclaimDelete)
	m := made{pv: pv}
	vols, err := x.c.CSIVolumeStates()
	if err != nil {
		x.t.Fatal(err)
	}
	if m.volume = vols[pv.Spec.CSI.VolumeHandle]; m.volume == nil {
		x.t.Fatalf("the driver has no volume %s for PV %s", pv.Spec.CSI.VolumeHandle, pv.Name)
	}
	e2e.Eventually(x.t, 30*time.Second, func() string {
		evs, err := e2e.Events(x.c.Client, namespace, "PersistentVolumeClaim", name)
		if err != nil {
			return err.Error()
		}
		m.events = nil
		for _, e := range evs {
			if regexp.MustCompile(component).MatchString(e.Source.Component) {
				m.events = append(m.events, e.Reason+": "+strings.NewReplacer(name, "NAME", string(cl.UID), "UID").Replace(e.Message))
			}
		}
		slices.Sort(m.events)
		if len(m.events) < 2 {
			return fmt.Sprintf("provisioner events of %s: %q", name, m.events)
		}
		return ""
	})
	return m
}

// diffMade lists how ours differs from theirs, beyond names, UIDs,
// times (the driver's creation-time attribute too), the driver's volume
// ID and the provisioner's identity (its format is compared).
func diffMade(theirs, ours made) []string {
	var out []string
	a, b := normalPV(theirs.pv), normalPV(ours.pv)
	if !reflect.DeepEqual(a, b) {
		ja, _ := json.MarshalIndent(a, "", " ")
		jb, _ := json.MarshalIndent(b, "", " ")
		out = append(out, fmt.Sprintf("PV differs:\nexternal-provisioner: %s\nvolplane: %s", ja, jb))
	}
	va, vb := normalVolume(theirs.volume), normalVolume(ours.volume)
	if !reflect.DeepEqual(va, vb) {
		out = append(out, fmt.Sprintf("the driver's volume (what CreateVolume asked) differs: external-provisioner %v, volplane %v", va, vb))
	}
	if !slices.Equal(theirs.events, ours.events) {
		out = append(out, fmt.Sprintf("Events differ: external-provisioner %q, volplane %q", theirs.events, ours.events))
	}
	return out
}

// normalPV is the PV without what differs by claim and by run.
func normalPV(pv *corev1.PersistentVolume) *corev1.PersistentVolume {
	n := pv.DeepCopy()
	n.ObjectMeta = metav1.ObjectMeta{Annotations: n.Annotations, Labels: n.Labels, Finalizers: n.Finalizers}
	slices.Sort(n.Finalizers)
	n.Spec.ClaimRef = &corev1.ObjectReference{Kind: n.Spec.ClaimRef.Kind, APIVersion: n.Spec.ClaimRef.APIVersion, Namespace: n.Spec.ClaimRef.Namespace}
	n.Spec.CSI.VolumeHandle = ""
	delete(n.Spec.CSI.VolumeAttributes, "volplane.io/creation-time") // the driver's, per volume
	if id, ok := n.Spec.CSI.VolumeAttributes["storage.kubernetes.io/csiProvisionerIdentity"]; ok {
		parts := strings.SplitN(id, "-", 3)
		n.Spec.CSI.VolumeAttributes["storage.kubernetes.io/csiProvisionerIdentity"] = fmt.Sprintf("<%d parts>-%s", len(parts), parts[len(parts)-1])
	}
	n.Status = corev1.PersistentVolumeStatus{Phase: n.Status.Phase}
	return n
}

// normalVolume is the driver's record of a volume without its ID, name
// and time.
func normalVolume(v map[string]any) map[string]any {
	out := map[string]any{}
	for k, val := range v {
		switch k {
		case "id", "name", "createdAt":
		default:
			out[k] = val
		}
	}
	return out
}
