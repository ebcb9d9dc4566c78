package provisioner

import (
	"context"
	"errors"
	"fmt"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/pkg/sidecar"
)

// A claim's VolumeAttributesClass at creation, as external-provisioner
// v6.3.0 handles it (prepareProvision): the driver must advertise
// MODIFY_VOLUME, the class (storage.k8s.io/v1) must name the claim's
// driver, and its parameters go in CreateVolume's mutable_parameters. The
// PV then names the class (buildVolume), and external-resizer modifies the
// volume when the claim names another.

// errNoModifyVolume is upstream's error for a claim with a
// VolumeAttributesClass whose driver cannot modify volumes.
var errNoModifyVolume = errors.New("CSI driver does not support VolumeAttributesClass: controller MODIFY_VOLUME capability is not reported")

// attributesClassName is the claim's VolumeAttributesClass, "" for none.
func attributesClassName(claim *corev1.PersistentVolumeClaim) string {
	if n := claim.Spec.VolumeAttributesClassName; n != nil {
		return *n
	}
	return ""
}

// classFor is the claim's VolumeAttributesClass as the driver's
// provisioning sees it: none while the VolumeAttributesClass gate is off
// for the driver (upstream's prepareProvision reads the name only with
// the gate on).
func (p *provisioner) classFor(d *driver, claim *corev1.PersistentVolumeClaim) string {
	if !p.gateFor(d, sidecar.GateVolumeAttributesClass) {
		return ""
	}
	return attributesClassName(claim)
}

// checkModifyVolume refuses a claim with a VolumeAttributesClass when the
// driver does not advertise MODIFY_VOLUME, before anything else is
// resolved (upstream's checkDriverCapabilities).
func (p *provisioner) checkModifyVolume(d *driver, claim *corev1.PersistentVolumeClaim) error {
	if p.classFor(d, claim) != "" && !d.has(csi.ControllerServiceCapability_RPC_MODIFY_VOLUME) {
		return errNoModifyVolume
	}
	return nil
}

// mutableParameters are the parameters of the claim's
// VolumeAttributesClass, read from the API server (nil without a class).
// A class that cannot be read is an error tried again; one of another
// driver is refused, in upstream's words.
func (p *provisioner) mutableParameters(ctx context.Context, d *driver, claim *corev1.PersistentVolumeClaim) (map[string]string, error) {
	name := p.classFor(d, claim)
	if name == "" {
		return nil, nil
	}
	vac, err := p.client.StorageV1().VolumeAttributesClasses().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, attributesClassError{err}
	}
	if vac.DriverName != d.name() {
		return nil, fmt.Errorf("VAC %s referenced in PVC is for driver %s which does not match driver name %s", name, vac.DriverName, d.name())
	}
	return vac.Parameters, nil
}

// attributesClassError is the API server's answer to the class's read,
// with its message alone: a class that is not found is not a node that is
// gone (provision asks the scheduler again for that), and upstream merely
// tries again.
type attributesClassError struct{ err error }

func (e attributesClassError) Error() string { return e.err.Error() }
