package provisioner

import (
	"fmt"
	"regexp"
	"sort"
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
)

// secretParams are the class parameter pairs that name a secret, by the
// field of the PV's CSI source they fill (provisioner secrets fill none).
var secretParams = []struct {
	kind, name, namespace string
}{
	{"provisioner", paramProvisionerSecretName, paramProvisionerSecretNamespace},
	{"controller-publish", csiParameterPrefix + "controller-publish-secret-name", csiParameterPrefix + "controller-publish-secret-namespace"},
	{"node-stage", csiParameterPrefix + "node-stage-secret-name", csiParameterPrefix + "node-stage-secret-namespace"},
	{"node-publish", csiParameterPrefix + "node-publish-secret-name", csiParameterPrefix + "node-publish-secret-namespace"},
	{"controller-expand", csiParameterPrefix + "controller-expand-secret-name", csiParameterPrefix + "controller-expand-secret-namespace"},
	{"node-expand", csiParameterPrefix + "node-expand-secret-name", csiParameterPrefix + "node-expand-secret-namespace"},
}

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
// know, as external-provisioner does: a misspelt secret key would
// otherwise silently provision without its secret.
func checkClassParameters(class *storagev1.StorageClass) error {
	known := map[string]bool{paramFSType: true}
	for _, s := range secretParams {
		known[s.name], known[s.namespace] = true, true
	}
	// The older spellings external-provisioner still accepts.
	for _, k := range []string{"provisioner-secret-name", "provisioner-secret-namespace", "fstype"} {
		known[csiParameterPrefix+k] = true
	}
	var bad []string
	for k := range class.Parameters {
		if strings.HasPrefix(k, csiParameterPrefix) && !known[k] {
			bad = append(bad, k)
		}
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		return fmt.Errorf("StorageClass %q has unknown parameter(s) %s with the reserved prefix %q", class.Name, strings.Join(bad, ", "), csiParameterPrefix)
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

// templateVar matches ${...} in secret name and namespace templates.
var templateVar = regexp.MustCompile(`\$\{([^}]*)\}`)

// resolveSecretRef resolves the secret a class names for kind, with
// external-provisioner's templates: ${pv.name}, ${pvc.namespace}, and in
// names also ${pvc.name} and ${pvc.annotations['key']}. It returns nil when
// the class names no such secret, and an error when only one half is set
// or a template does not resolve to a valid name.
func resolveSecretRef(class *storagev1.StorageClass, nameKey, nsKey, pvName string, claim *corev1.PersistentVolumeClaim) (*secretRef, error) {
	nameT, hasName := class.Parameters[nameKey]
	nsT, hasNS := class.Parameters[nsKey]
	if !hasName && !hasNS {
		return nil, nil
	}
	if hasName != hasNS {
		return nil, fmt.Errorf("StorageClass %q sets only one of %s and %s: set both or neither", class.Name, nameKey, nsKey)
	}
	nsVars := map[string]string{"pv.name": pvName}
	if claim != nil {
		nsVars["pvc.namespace"] = claim.Namespace
	}
	ns, err := expand(nsT, nsVars, nil)
	if err != nil {
		return nil, fmt.Errorf("%s %q: %w", nsKey, nsT, err)
	}
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return nil, fmt.Errorf("%s %q resolves to %q, not a namespace name: %s", nsKey, nsT, ns, strings.Join(errs, "; "))
	}
	nameVars := map[string]string{"pv.name": pvName}
	var anns map[string]string
	if claim != nil {
		nameVars["pvc.namespace"], nameVars["pvc.name"] = claim.Namespace, claim.Name
		anns = claim.Annotations
	}
	name, err := expand(nameT, nameVars, anns)
	if err != nil {
		return nil, fmt.Errorf("%s %q: %w", nameKey, nameT, err)
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return nil, fmt.Errorf("%s %q resolves to %q, not a secret name: %s", nameKey, nameT, name, strings.Join(errs, "; "))
	}
	return &secretRef{Namespace: ns, Name: name}, nil
}

// expand replaces ${var} in s from vars, and ${pvc.annotations['k']} from
// annotations when annotations is not nil.
func expand(s string, vars map[string]string, annotations map[string]string) (string, error) {
	var missing []string
	out := templateVar.ReplaceAllStringFunc(s, func(m string) string {
		key := m[2 : len(m)-1]
		if v, ok := vars[key]; ok {
			return v
		}
		if annotations != nil && strings.HasPrefix(key, "pvc.annotations['") && strings.HasSuffix(key, "']") {
			if v, ok := annotations[key[len("pvc.annotations['"):len(key)-2]]; ok {
				return v
			}
		}
		missing = append(missing, m)
		return m
	})
	if len(missing) > 0 {
		return "", fmt.Errorf("cannot resolve %s here", strings.Join(missing, ", "))
	}
	return out, nil
}
