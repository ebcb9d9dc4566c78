package standalone

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/test/harness/devenv"
	"github.com/volplane/volplane/test/harness/e2e"
)

// Classes, VolumeAttributesClasses and Secrets of the side-by-side run of
// claims with an attributes class and classes naming secrets.
const (
	classKeys     = "sa-keys"     // every secret key external-provisioner takes
	classFallback = "sa-fallback" // only the deprecated csi.storage.k8s.io/secret-name
	classBadKeys  = "sa-bad-keys" // a template that does not resolve
	vacGold       = "sa-gold"     // of the dev driver
	vacForeign    = "sa-foreign"  // of another driver
	vacNowhere    = "sa-nowhere"  // never created
)

// parityClassesAndSecrets runs the same claims with external-provisioner
// v6.3.0 and with volplane's standalone provisioner on the same driver,
// and compares what each made (PV, the driver's volume: what CreateVolume
// asked, mutable_parameters included, and Events) or, for the claims both
// must refuse, their Events: a claim with a VolumeAttributesClass of the
// driver, of another driver and of none that exists; classes naming every
// secret key, only the deprecated default, and a template that does not
// resolve.
func (x *env) parityClassesAndSecrets() {
	bin := findCSIProvisioner()
	if bin == "" {
		x.t.Skip("no csi-provisioner v6.3.0 (VOLPLANE_CSI_PROVISIONER)")
	}
	x.setupClassesAndSecrets()
	results := map[string]map[string]made{}
	x.sideBySide(bin, func(tag string) {
		component := "^" + devcsi.DefaultName + "_"
		gold := func(c *corev1.PersistentVolumeClaim) { c.Spec.VolumeAttributesClassName = ptr(vacGold) }
		stage := func(c *corev1.PersistentVolumeClaim) {
			c.Annotations = map[string]string{"example.com/stage": "staged"}
		}
		results[tag] = map[string]made{
			"attributes class":           x.madeFor(x.claimWith("vac-"+tag, classDelete, gold), component),
			"every secret key":           x.madeFor(x.claimWith("keys-"+tag, classKeys, stage), component),
			"the deprecated default":     x.madeFor(x.claimWith("fallback-"+tag, classFallback, nil), component),
			"another driver's class":     x.refused(x.claimWith("foreign-"+tag, classDelete, withVAC(vacForeign)), component),
			"an attributes class absent": x.refused(x.claimWith("nowhere-"+tag, classDelete, withVAC(vacNowhere)), component),
			"a template that fails":      x.refused(x.claimWith("bad-"+tag, classBadKeys, nil), component),
		}
	})
	for _, what := range slices.Sorted(maps.Keys(results["ep"])) {
		theirs, ours := claimNames(results["ep"][what]), claimNames(results["vp"][what])
		switch {
		case theirs.pv == nil && ours.pv == nil:
			if !slices.Equal(theirs.events, ours.events) {
				x.t.Errorf("%s: Events differ: external-provisioner %q, volplane %q", what, theirs.events, ours.events)
			}
		case theirs.pv == nil || ours.pv == nil:
			x.t.Errorf("%s: external-provisioner made PV %v, volplane %v", what, theirs.pv != nil, ours.pv != nil)
			continue
		default:
			for _, d := range diffMade(theirs, ours) {
				x.t.Errorf("%s: %s", what, d)
			}
		}
		if ours.pv != nil {
			x.t.Logf("%s: the same PV (volumeAttributesClassName %v, annotations %v, CSI source secrets %s), the same volume %v, the same Events %q",
				what, deref(ours.pv.Spec.VolumeAttributesClassName), ours.pv.Annotations, secretRefs(ours.pv.Spec.CSI), normalVolume(ours.volume), ours.events)
		} else {
			x.t.Logf("%s: no volume from either, the same Events %q", what, ours.events)
		}
	}
}

// setupClassesAndSecrets creates what the claims of
// parityClassesAndSecrets name.
func (x *env) setupClassesAndSecrets() {
	x.t.Helper()
	ctx := x.t.Context()
	for _, name := range []string{"prov", "fallback"} {
		if _, err := x.c.Client.CoreV1().Secrets(namespace).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
			StringData: map[string]string{"password": e2e.Secret("parity-Secret-" + name)}}, metav1.CreateOptions{}); err != nil {
			x.t.Fatal(err)
		}
	}
	for _, vac := range []*storagev1.VolumeAttributesClass{
		{ObjectMeta: metav1.ObjectMeta{Name: vacGold}, DriverName: devcsi.DefaultName, Parameters: map[string]string{"iops": "3000", "throughput": "125"}},
		{ObjectMeta: metav1.ObjectMeta{Name: vacForeign}, DriverName: "other.example.com", Parameters: map[string]string{"iops": "3000"}},
	} {
		if _, err := x.c.Client.StorageV1().VolumeAttributesClasses().Create(ctx, vac, metav1.CreateOptions{}); err != nil {
			x.t.Fatal(err)
		}
	}
	const p = "csi.storage.k8s.io/"
	del := corev1.PersistentVolumeReclaimDelete
	for name, params := range map[string]map[string]string{
		classKeys: {
			p + "provisioner-secret-name": "prov", p + "provisioner-secret-namespace": "${pvc.namespace}",
			"csiControllerPublishSecretName": "cp-${pvc.name}", "csiControllerPublishSecretNamespace": "${pvc.namespace}",
			p + "node-stage-secret-name": "${pvc.annotations['example.com/stage']}", p + "node-stage-secret-namespace": "${pvc.namespace}",
			p + "controller-expand-secret-name": "ce-${pv.name}", p + "controller-expand-secret-namespace": "${pvc.namespace}",
			p + "controller-modify-secret-name": "cm", p + "controller-modify-secret-namespace": "${pvc.namespace}",
			p + "secret-name": "fallback", p + "secret-namespace": "${pvc.namespace}",
		},
		classFallback: {p + "secret-name": "fallback", p + "secret-namespace": "${pvc.namespace}"},
		classBadKeys:  {p + "node-stage-secret-name": "${pvc.annotations['nope']}", p + "node-stage-secret-namespace": "x"},
	} {
		e2e.CreateClass(x.t, x.c.Client, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: devcsi.DefaultName, ReclaimPolicy: &del, Parameters: params})
	}
}

// sideBySide runs run("ep") with external-provisioner v6.3.0 (bin) in
// place of volplane's provisioners, then run("vp") with volplane's.
func (x *env) sideBySide(bin string, run func(tag string)) {
	x.t.Helper()
	ps := x.c.Replicas("provisioner")
	for _, r := range ps {
		r.Stop()
	}
	ep, err := devenv.StartProcess(x.c.Dir, "csi-provisioner", bin, "--csi-address", x.c.CSI.Addr, "--kubeconfig", x.c.API.Kubeconfig,
		"--timeout", "10s", "--v", "2")
	if err != nil {
		x.t.Fatal(err)
	}
	run("ep")
	ep.Stop()
	for _, r := range ps {
		if err := r.Start(); err != nil {
			x.t.Fatal(err)
		}
		if err := x.c.WaitServing(x.t.Context(), r, 2*time.Minute); err != nil {
			x.t.Fatal(err)
		}
	}
	run("vp")
}

// claimWith creates a claim of class, changed by change.
func (x *env) claimWith(name, class string, change func(*corev1.PersistentVolumeClaim)) *corev1.PersistentVolumeClaim {
	x.t.Helper()
	c := e2e.Claim(namespace, name, "1Gi", class)
	if change != nil {
		change(c)
	}
	cl, err := x.c.Client.CoreV1().PersistentVolumeClaims(namespace).Create(x.t.Context(), c, metav1.CreateOptions{})
	if err != nil {
		x.t.Fatal(err)
	}
	return cl
}

// refused waits until the provisioner has refused the claim cl
// (ProvisioningFailed), then deletes it; it returns the provisioner's
// Events (from sources matching component), each message once.
func (x *env) refused(cl *corev1.PersistentVolumeClaim, component string) made {
	x.t.Helper()
	var m made
	e2e.Eventually(x.t, time.Minute, func() string {
		evs, err := e2e.Events(x.c.Client, namespace, "PersistentVolumeClaim", cl.Name)
		if err != nil {
			return err.Error()
		}
		m.events = nil
		for _, e := range evs {
			if regexp.MustCompile(component).MatchString(e.Source.Component) {
				m.events = append(m.events, e.Reason+": "+strings.NewReplacer(cl.Name, "NAME", string(cl.UID), "UID").Replace(e.Message))
			}
		}
		slices.Sort(m.events)
		m.events = slices.Compact(m.events)
		if !slices.ContainsFunc(m.events, func(e string) bool { return strings.HasPrefix(e, "ProvisioningFailed: ") }) {
			return fmt.Sprintf("no ProvisioningFailed event on %s yet: %q", cl.Name, m.events)
		}
		return ""
	})
	if x.hasCSIVolume("pvc-" + string(cl.UID)) {
		x.t.Errorf("the driver made a volume for %s, which must be refused", cl.Name)
	}
	x.deleteClaim(cl)
	return m
}

func withVAC(name string) func(*corev1.PersistentVolumeClaim) {
	return func(c *corev1.PersistentVolumeClaim) { c.Spec.VolumeAttributesClassName = ptr(name) }
}

func ptr(s string) *string { return &s }

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

// claimNames is m with the claim's name and UID in the PV's secret
// references and annotations (from templates such as ${pvc.name} and
// ${pv.name}) replaced by NAME and UID, as the Events have them.
func claimNames(m made) made {
	if m.pv == nil || m.pv.Spec.ClaimRef == nil || m.pv.Spec.CSI == nil {
		return m
	}
	m.pv = m.pv.DeepCopy()
	r := strings.NewReplacer(m.pv.Spec.ClaimRef.Name, "NAME", string(m.pv.Spec.ClaimRef.UID), "UID")
	src := m.pv.Spec.CSI
	for _, ref := range []*corev1.SecretReference{src.ControllerPublishSecretRef, src.NodeStageSecretRef, src.NodePublishSecretRef,
		src.ControllerExpandSecretRef, src.NodeExpandSecretRef} {
		if ref != nil {
			ref.Name = r.Replace(ref.Name)
		}
	}
	for k, v := range m.pv.Annotations {
		m.pv.Annotations[k] = r.Replace(v)
	}
	return m
}

// secretRefs is the CSI source's secret references, for the log.
func secretRefs(src *corev1.CSIPersistentVolumeSource) string {
	if src == nil {
		return ""
	}
	var out []string
	for what, r := range map[string]*corev1.SecretReference{"controller-publish": src.ControllerPublishSecretRef, "node-stage": src.NodeStageSecretRef,
		"node-publish": src.NodePublishSecretRef, "controller-expand": src.ControllerExpandSecretRef, "node-expand": src.NodeExpandSecretRef} {
		if r != nil {
			out = append(out, what+"="+r.Namespace+"/"+r.Name)
		}
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}
