package provisioner

import (
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Keys of StorageClass parameters that are for the provisioner, not the
// driver, spelled as external-provisioner spells them.
const (
	csiParameterPrefix = "csi.storage.k8s.io/"

	paramFSType = csiParameterPrefix + "fstype"

	// Secrets for CreateVolume and DeleteVolume.
	paramProvisionerSecretName      = csiParameterPrefix + "provisioner-secret-name"
	paramProvisionerSecretNamespace = csiParameterPrefix + "provisioner-secret-namespace"

	// Extra create metadata, passed when --extra-create-metadata is set.
	paramPVCName      = csiParameterPrefix + "pvc/name"
	paramPVCNamespace = csiParameterPrefix + "pvc/namespace"
	paramPVName       = csiParameterPrefix + "pv/name"

	// Annotations on a provisioned PV naming its deletion secret, so that
	// it can be deleted after its class is gone.
	annDeletionSecretName      = "volume.kubernetes.io/provisioner-deletion-secret-name"
	annDeletionSecretNamespace = "volume.kubernetes.io/provisioner-deletion-secret-namespace"

	// Annotations on a provisioned PV naming the secret external-resizer
	// passes to ControllerModifyVolume when its VolumeAttributesClass
	// changes.
	annModifySecretName      = "volume.kubernetes.io/controller-modify-secret-name"
	annModifySecretNamespace = "volume.kubernetes.io/controller-modify-secret-namespace"
)

// secretParam is one secret a class may name, with the keys
// external-provisioner v6.3.0 reads it from (its secretParamsMap).
type secretParam struct {
	// kind is the secret's key in volumeSpec.secrets: what it is for.
	kind string
	// label names it in external-provisioner's error messages.
	label string
	// name and namespace are its csi.storage.k8s.io/ keys.
	name, namespace string
	// oldName and oldNamespace are its deprecated keys without the
	// prefix ("" when it has none); the driver gets them as parameters.
	oldName, oldNamespace string
}

// secretParams are the secrets a class may name, in the order
// external-provisioner resolves them: the provisioner's (CreateVolume,
// DeleteVolume), then those the PV refers to (its CSI source's five
// secret references, and the controller-modify secret its annotations
// name for external-resizer's ControllerModifyVolume). Each falls back to
// defaultSecret when the class names none of its keys.
var secretParams = []secretParam{
	{"provisioner", "Provisioner", paramProvisionerSecretName, paramProvisionerSecretNamespace, "csiProvisionerSecretName", "csiProvisionerSecretNamespace"},
	{"controller-publish", "ControllerPublish", csiParameterPrefix + "controller-publish-secret-name", csiParameterPrefix + "controller-publish-secret-namespace",
		"csiControllerPublishSecretName", "csiControllerPublishSecretNamespace"},
	{"node-stage", "NodeStage", csiParameterPrefix + "node-stage-secret-name", csiParameterPrefix + "node-stage-secret-namespace",
		"csiNodeStageSecretName", "csiNodeStageSecretNamespace"},
	{"node-publish", "NodePublish", csiParameterPrefix + "node-publish-secret-name", csiParameterPrefix + "node-publish-secret-namespace",
		"csiNodePublishSecretName", "csiNodePublishSecretNamespace"},
	{"controller-expand", "ControllerExpand", csiParameterPrefix + "controller-expand-secret-name", csiParameterPrefix + "controller-expand-secret-namespace", "", ""},
	{"node-expand", "NodeExpand", csiParameterPrefix + "node-expand-secret-name", csiParameterPrefix + "node-expand-secret-namespace", "", ""},
	{"controller-modify", "ControllerModify", csiParameterPrefix + "controller-modify-secret-name", csiParameterPrefix + "controller-modify-secret-namespace", "", ""},
}

// defaultSecret is the deprecated secret of every operation: the one a
// class names with csi.storage.k8s.io/secret-name and -namespace applies
// to each secretParams entry whose own keys are absent.
var defaultSecret = secretParam{kind: "default", label: "Default", name: csiParameterPrefix + "secret-name", namespace: csiParameterPrefix + "secret-namespace"}

// secretRef names a Secret.
type secretRef struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

// VolumeName is the name of the PV provisioned for a claim: the same on
// every attempt, so a retry never makes a second volume.
func VolumeName(prefix string, claim *corev1.PersistentVolumeClaim) string {
	return prefix + "-" + string(claim.UID)
}

// driverParameters are the class parameters the driver gets: all but the
// csi.storage.k8s.io/ ones, plus the claim's and volume's names when extra
// create metadata is on.
func driverParameters(class *storagev1.StorageClass, claim *corev1.PersistentVolumeClaim, pvName string, extraMetadata bool) map[string]string {
	out := map[string]string{}
	for k, v := range class.Parameters {
		if !strings.HasPrefix(k, csiParameterPrefix) {
			out[k] = v
		}
	}
	if extraMetadata {
		out[paramPVCName] = claim.Name
		out[paramPVCNamespace] = claim.Namespace
		out[paramPVName] = pvName
	}
	return out
}

// checkClassParameters rejects csi.storage.k8s.io/ keys volplane does not
// know, as external-provisioner's removePrefixedParameters does, in its
// words: a misspelt secret key would otherwise silently provision without
// its secret. Of several, it names the first in order (upstream, any).
func checkClassParameters(class *storagev1.StorageClass) error {
	known := map[string]bool{paramFSType: true, defaultSecret.name: true, defaultSecret.namespace: true}
	for _, s := range secretParams {
		known[s.name], known[s.namespace] = true, true
	}
	for _, k := range slices.Sorted(maps.Keys(class.Parameters)) {
		if strings.HasPrefix(k, csiParameterPrefix) && !known[k] {
			return fmt.Errorf("failed to strip CSI Parameters of prefixed keys: found unknown parameter key \"%s\" with reserved namespace %s", k, csiParameterPrefix)
		}
	}
	return nil
}

// fsType is the filesystem the volume gets: the class's
// csi.storage.k8s.io/fstype, else the default. Block volumes have none.
func fsType(class *storagev1.StorageClass, claim *corev1.PersistentVolumeClaim, def string) string {
	if claim.Spec.VolumeMode != nil && *claim.Spec.VolumeMode == corev1.PersistentVolumeBlock {
		return ""
	}
	if t := class.Parameters[paramFSType]; t != "" {
		return t
	}
	return def
}

// volumeCapabilities turns the claim's access modes and volume mode into
// CSI capabilities, one per access mode.
func volumeCapabilities(claim *corev1.PersistentVolumeClaim, fs string, mountFlags []string, singleNodeMultiWriter bool) ([]*csi.VolumeCapability, error) {
	if len(claim.Spec.AccessModes) == 0 {
		return nil, fmt.Errorf("claim %s/%s has no access modes", claim.Namespace, claim.Name)
	}
	block := claim.Spec.VolumeMode != nil && *claim.Spec.VolumeMode == corev1.PersistentVolumeBlock
	var out []*csi.VolumeCapability
	for _, m := range claim.Spec.AccessModes {
		cap := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{}}
		switch m {
		case corev1.ReadWriteOnce:
			cap.AccessMode.Mode = csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
			if singleNodeMultiWriter {
				cap.AccessMode.Mode = csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER
			}
		case corev1.ReadWriteOncePod:
			cap.AccessMode.Mode = csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
			if singleNodeMultiWriter {
				cap.AccessMode.Mode = csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
			}
		case corev1.ReadOnlyMany:
			cap.AccessMode.Mode = csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
		case corev1.ReadWriteMany:
			cap.AccessMode.Mode = csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
		default:
			return nil, fmt.Errorf("claim %s/%s has unknown access mode %q", claim.Namespace, claim.Name, m)
		}
		if block {
			cap.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
		} else {
			cap.AccessType = &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fs, MountFlags: mountFlags}}
		}
		out = append(out, cap)
	}
	return out, nil
}

// capacityRange is what the claim asks for: at least its request. Like
// external-provisioner it sends no limit: a claim's storage limit is not
// the volume's, and drivers that round sizes up would fail.
func capacityRange(claim *corev1.PersistentVolumeClaim) (*csi.CapacityRange, error) {
	req, ok := claim.Spec.Resources.Requests[corev1.ResourceStorage]
	if !ok {
		return nil, fmt.Errorf("claim %s/%s requests no storage", claim.Namespace, claim.Name)
	}
	return &csi.CapacityRange{RequiredBytes: req.Value()}, nil
}

// secretTemplates are the name and namespace templates of the secret s
// in a class's parameters, "" for both when the class names none, checked
// as external-provisioner's verifyAndGetSecretNameAndNamespaceTemplate
// checks them: one spelling of each key, both or neither, neither empty.
func secretTemplates(params map[string]string, s secretParam) (nameT, nsT string, err error) {
	names, namespaces := 0, 0
	for _, k := range []string{s.oldName, s.name} {
		if t, ok := params[k]; ok && k != "" {
			nameT, names = t, names+1
		}
	}
	for _, k := range []string{s.oldNamespace, s.namespace} {
		if t, ok := params[k]; ok && k != "" {
			nsT, namespaces = t, namespaces+1
		}
	}
	switch {
	case names > 1 || namespaces > 1:
		return "", "", fmt.Errorf("%s secrets specified in parameters with both \"csi\" and \"%s\" keys", s.label, csiParameterPrefix)
	case names != namespaces:
		return "", "", fmt.Errorf("either name and namespace for %s secrets specified, Both must be specified", s.label)
	case names == 1 && (nameT == "" || nsT == ""):
		return "", "", fmt.Errorf("%s secrets specified in parameters but value of either namespace or name is empty", s.label)
	}
	return nameT, nsT, nil
}

// resolveSecretRef resolves the secret s of a class as
// external-provisioner's getSecretReference does: its own keys, else the
// deprecated csi.storage.k8s.io/secret-name and -namespace, else none
// (nil). Namespace templates may use ${pv.name} and ${pvc.namespace};
// name templates also ${pvc.name} and ${pvc.annotations['key']}. The
// result must be a namespace name and a secret name; every error is
// worded as upstream's.
func resolveSecretRef(class *storagev1.StorageClass, s secretParam, pvName string, claim *corev1.PersistentVolumeClaim) (*secretRef, error) {
	nameT, nsT, err := secretTemplates(class.Parameters, s)
	if err != nil {
		return nil, fmt.Errorf("failed to get name and namespace template from params: %w", err)
	}
	if nameT == "" && nsT == "" {
		if nameT, nsT, err = secretTemplates(class.Parameters, defaultSecret); err != nil {
			return nil, fmt.Errorf("failed to get default name and namespace template from params: %w", err)
		}
	}
	if nameT == "" && nsT == "" {
		return nil, nil
	}
	nsVars := map[string]string{"pv.name": pvName}
	nameVars := map[string]string{"pv.name": pvName}
	if claim != nil {
		nsVars["pvc.namespace"] = claim.Namespace
		nameVars["pvc.name"], nameVars["pvc.namespace"] = claim.Name, claim.Namespace
		for k, v := range claim.Annotations {
			nameVars["pvc.annotations['"+k+"']"] = v
		}
	}
	ns, err := resolveTemplate(nsT, nsVars)
	if err != nil {
		return nil, fmt.Errorf("error resolving value %q: %w", nsT, err)
	}
	if len(validation.IsDNS1123Label(ns)) > 0 {
		return nil, invalidResolved(nsT, ns, "namespace name")
	}
	name, err := resolveTemplate(nameT, nameVars)
	if err != nil {
		return nil, fmt.Errorf("error resolving value %q: %w", nameT, err)
	}
	if len(validation.IsDNS1123Subdomain(name)) > 0 {
		return nil, invalidResolved(nameT, name, "secret name")
	}
	return &secretRef{Namespace: ns, Name: name}, nil
}

// invalidResolved is upstream's error for a template that resolved to no
// valid name of what.
func invalidResolved(template, resolved, what string) error {
	if template != resolved {
		return fmt.Errorf("%q resolved to %q which is not a valid %s", template, resolved, what)
	}
	return fmt.Errorf("%q is not a valid %s", template, what)
}

// resolveTemplate expands $name and ${name} in template from params, as
// upstream does (os.Expand); every name params lacks is an error.
func resolveTemplate(template string, params map[string]string) (string, error) {
	var missing []string
	out := os.Expand(template, func(k string) string {
		v, ok := params[k]
		if !ok && !slices.Contains(missing, k) {
			missing = append(missing, k)
		}
		return v
	})
	if len(missing) > 0 {
		slices.Sort(missing)
		return "", fmt.Errorf("invalid tokens: %q", missing)
	}
	return out, nil
}
