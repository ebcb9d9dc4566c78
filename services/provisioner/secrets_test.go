package provisioner

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/volplane/volplane/internal/devcsi"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// secretParam returns the entry of kind.
func secretParamOf(t *testing.T, kind string) secretParam {
	t.Helper()
	for _, s := range secretParams {
		if s.kind == kind {
			return s
		}
	}
	t.Fatalf("no secret kind %q", kind)
	return secretParam{}
}

// Every csi.storage.k8s.io/ key external-provisioner v6.3.0 knows
// (removePrefixedParameters) is taken; any other is refused in its words.
// The code before took neither the controller-modify keys nor the
// deprecated secret-name and secret-namespace.
func TestClassParametersUpstreamKnows(t *testing.T) {
	upstream := []string{"fstype", "secret-name", "secret-namespace"}
	for _, op := range []string{"provisioner", "controller-publish", "node-stage", "node-publish", "controller-expand", "node-expand", "controller-modify"} {
		upstream = append(upstream, op+"-secret-name", op+"-secret-namespace")
	}
	for _, k := range upstream {
		c := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "c"}, Parameters: map[string]string{csiParameterPrefix + k: "x"}}
		if err := checkClassParameters(c); err != nil {
			t.Errorf("%s: %v", k, err)
		}
	}
	bad := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "c"}, Parameters: map[string]string{
		csiParameterPrefix + "provisioner-secret-nme": "s", csiParameterPrefix + "zz": "s", "csiProvisionerSecretName": "s"}}
	want := `failed to strip CSI Parameters of prefixed keys: found unknown parameter key "csi.storage.k8s.io/provisioner-secret-nme" with reserved namespace csi.storage.k8s.io/`
	if err := checkClassParameters(bad); err == nil || err.Error() != want {
		t.Errorf("got %v, want %s", err, want)
	}
}

// Each secret of a class resolves as external-provisioner's
// getSecretReference resolves it: its keys, its deprecated keys, the
// deprecated default, the templates and every refusal in upstream's words.
func TestSecretReferencesAsUpstream(t *testing.T) {
	claim := claimOf(nil, false, "1Gi", "")
	claim.Annotations["secrets.example.com/name"] = "from-annotation"
	p := csiParameterPrefix
	for _, tc := range []struct {
		name   string
		kind   string
		params map[string]string
		want   *secretRef
		err    string
	}{
		{"none", "provisioner", nil, nil, ""},
		{"its keys", "controller-modify", map[string]string{p + "controller-modify-secret-name": "m", p + "controller-modify-secret-namespace": "ns1"}, &secretRef{"ns1", "m"}, ""},
		{"the deprecated keys without the prefix", "node-stage", map[string]string{"csiNodeStageSecretName": "old", "csiNodeStageSecretNamespace": "ns2"}, &secretRef{"ns2", "old"}, ""},
		{"the deprecated default", "node-expand", map[string]string{p + "secret-name": "d", p + "secret-namespace": "ns3"}, &secretRef{"ns3", "d"}, ""},
		{"its keys before the default", "provisioner", map[string]string{p + "secret-name": "d", p + "secret-namespace": "ns3",
			p + "provisioner-secret-name": "own", p + "provisioner-secret-namespace": "ns4"}, &secretRef{"ns4", "own"}, ""},
		{"templates", "node-publish", map[string]string{p + "node-publish-secret-name": "${pvc.name}-${pv.name}-$pvc.namespace",
			p + "node-publish-secret-namespace": "${pvc.namespace}"}, nil, `error resolving value "${pvc.name}-${pv.name}-$pvc.namespace": invalid tokens: ["pvc"]`},
		{"templates resolved", "node-publish", map[string]string{p + "node-publish-secret-name": "${pvc.name}-${pv.name}-${pvc.annotations['secrets.example.com/name']}",
			p + "node-publish-secret-namespace": "${pvc.namespace}"}, &secretRef{"ns", "data-pvc-u-1-from-annotation"}, ""},
		{"a name token in a namespace", "provisioner", map[string]string{p + "provisioner-secret-name": "s", p + "provisioner-secret-namespace": "${pvc.name}"},
			nil, `error resolving value "${pvc.name}": invalid tokens: ["pvc.name"]`},
		{"a missing annotation", "provisioner", map[string]string{p + "provisioner-secret-name": "${pvc.annotations['nope']}", p + "provisioner-secret-namespace": "x"},
			nil, `error resolving value "${pvc.annotations['nope']}": invalid tokens: ["pvc.annotations['nope']"]`},
		{"both spellings", "provisioner", map[string]string{"csiProvisionerSecretName": "a", p + "provisioner-secret-name": "b", p + "provisioner-secret-namespace": "x"},
			nil, `failed to get name and namespace template from params: Provisioner secrets specified in parameters with both "csi" and "csi.storage.k8s.io/" keys`},
		{"half", "controller-expand", map[string]string{p + "controller-expand-secret-name": "a"},
			nil, "failed to get name and namespace template from params: either name and namespace for ControllerExpand secrets specified, Both must be specified"},
		{"half of the default", "controller-publish", map[string]string{p + "secret-namespace": "a"},
			nil, "failed to get default name and namespace template from params: either name and namespace for Default secrets specified, Both must be specified"},
		{"empty", "provisioner", map[string]string{p + "provisioner-secret-name": "", p + "provisioner-secret-namespace": "x"},
			nil, "failed to get name and namespace template from params: Provisioner secrets specified in parameters but value of either namespace or name is empty"},
		{"not a namespace", "provisioner", map[string]string{p + "provisioner-secret-name": "s", p + "provisioner-secret-namespace": "Bad_NS"},
			nil, `"Bad_NS" is not a valid namespace name`},
		{"resolved to no secret name", "provisioner", map[string]string{p + "provisioner-secret-name": "${pvc.annotations['team']}_x", p + "provisioner-secret-namespace": "x"},
			nil, `"${pvc.annotations['team']}_x" resolved to "blue_x" which is not a valid secret name`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "c"}, Parameters: tc.params}
			got, err := resolveSecretRef(class, secretParamOf(t, tc.kind), "pvc-u-1", claim)
			if tc.err != "" {
				if err == nil || err.Error() != tc.err {
					t.Fatalf("got %v %v, want error %q", got, err, tc.err)
				}
				return
			}
			if err != nil || (got == nil) != (tc.want == nil) || (got != nil && *got != *tc.want) {
				t.Fatalf("got %v %v, want %v", got, err, tc.want)
			}
		})
	}
}

// A class naming every secret by its keys, and one naming only the
// deprecated default: the PV refers to each as external-provisioner's
// does (its CSI source's five references, the deletion-secret and
// controller-modify annotations), CreateVolume gets the provisioner's
// secret, and the deprecated unprefixed keys reach the driver. Before,
// both classes were refused for their unknown keys.
func TestProvisionWithEverySecretKey(t *testing.T) {
	p := csiParameterPrefix
	every := map[string]string{"csiNodePublishSecretName": "np", "csiNodePublishSecretNamespace": "app"}
	for _, op := range []string{"provisioner", "controller-publish", "node-stage", "controller-expand", "node-expand", "controller-modify"} {
		every[p+op+"-secret-name"], every[p+op+"-secret-namespace"] = op, "${pvc.namespace}"
	}
	for _, tc := range []struct {
		name   string
		params map[string]string
		want   func(op string) *corev1.SecretReference
	}{
		{"every key", every, func(op string) *corev1.SecretReference {
			if op == "node-publish" {
				return &corev1.SecretReference{Namespace: "app", Name: "np"}
			}
			return &corev1.SecretReference{Namespace: "app", Name: op}
		}},
		{"the deprecated default", map[string]string{p + "secret-name": "provisioner", p + "secret-namespace": "app"}, func(string) *corev1.SecretReference {
			return &corev1.SecretReference{Namespace: "app", Name: "provisioner"}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGuarded(t)
			if _, err := g.api.StorageV1().StorageClasses().Create(t.Context(), &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"},
				Provisioner: devcsi.DefaultName, Parameters: tc.params}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			if _, err := g.api.CoreV1().Secrets("app").Create(t.Context(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "provisioner"},
				Data: map[string][]byte{"key": []byte("k1")}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			g.addClaim(t, vacClaim(""))
			resp, err := g.s.Provision(t.Context(), &provisionerv1.ProvisionRequest{ClaimNamespace: "app", ClaimName: "data", ClaimUid: "u1"})
			if err != nil || resp.GetOutcome() != provisionerv1.Outcome_OUTCOME_FINISHED {
				t.Fatalf("%v %v", resp, err)
			}
			g.mu.Lock()
			sent := g.creates[0]
			g.mu.Unlock()
			if sent.GetSecrets()["key"] != "k1" {
				t.Errorf("CreateVolume secrets %v, want the provisioner's", sent.GetSecrets())
			}
			for k := range sent.GetParameters() {
				if strings.HasPrefix(k, p) {
					t.Errorf("CreateVolume parameter %s: the reserved keys are not the driver's", k)
				}
			}
			if _, ok := tc.params["csiNodePublishSecretName"]; ok && sent.GetParameters()["csiNodePublishSecretName"] != "np" {
				t.Errorf("CreateVolume parameters %v: upstream passes the deprecated unprefixed keys on", sent.GetParameters())
			}
			pv, err := g.api.CoreV1().PersistentVolumes().Get(t.Context(), "pvc-u1", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			src := pv.Spec.CSI
			for op, got := range map[string]*corev1.SecretReference{"controller-publish": src.ControllerPublishSecretRef, "node-stage": src.NodeStageSecretRef,
				"node-publish": src.NodePublishSecretRef, "controller-expand": src.ControllerExpandSecretRef, "node-expand": src.NodeExpandSecretRef} {
				if want := tc.want(op); got == nil || *got != *want {
					t.Errorf("%s secret ref %v, want %v", op, got, want)
				}
			}
			for ann, want := range map[string]string{annDeletionSecretName: tc.want("provisioner").Name, annDeletionSecretNamespace: "app",
				annModifySecretName: tc.want("controller-modify").Name, annModifySecretNamespace: "app"} {
				if pv.Annotations[ann] != want {
					t.Errorf("annotation %s = %q, want %q", ann, pv.Annotations[ann], want)
				}
			}
		})
	}
}

// Without a controller-modify secret the PV has no such annotations (the
// deletion-secret ones are there, empty), as upstream.
func TestNoModifySecretNoAnnotations(t *testing.T) {
	claim := vacClaim("")
	pv := buildVolume(volumeSpec{name: "pvc-u1", claim: claim, class: &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"}}}, nil)
	for _, k := range []string{annModifySecretName, annModifySecretNamespace} {
		if v, ok := pv.Annotations[k]; ok {
			t.Errorf("annotation %s=%q on a PV whose class names no controller-modify secret", k, v)
		}
	}
	if v, ok := pv.Annotations[annDeletionSecretName]; !ok || v != "" {
		t.Errorf("deletion secret annotation %q (present %v), want present and empty", v, ok)
	}
}

// A PV made before the deletion-secret annotations existed is deleted
// with its class's provisioner secret, the deprecated default included,
// whatever the class's other secrets say, as upstream's Delete.
func TestDeletionSecretOfAnOldVolume(t *testing.T) {
	p := csiParameterPrefix
	api := fake.NewClientset(&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "old"}, Provisioner: devcsi.DefaultName, Parameters: map[string]string{
		p + "secret-name": "creds-${pvc.name}", p + "secret-namespace": "${pvc.namespace}",
		p + "node-stage-secret-name": "${pvc.annotations['gone']}", p + "node-stage-secret-namespace": "x",
	}})
	prov := &provisioner{client: api}
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pvc-u1"}, Spec: corev1.PersistentVolumeSpec{StorageClassName: "old",
		ClaimRef: &corev1.ObjectReference{Namespace: "app", Name: "data"}}}
	if got := prov.deletionSecret(t.Context(), pv); got == nil || *got != (secretRef{Namespace: "app", Name: "creds-data"}) {
		t.Fatalf("deletion secret %v, want app/creds-data", got)
	}
}
