package claimvalidation

import (
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/volplane/volplane/pkg/kube"
)

// The values the API server supports.
var (
	accessModes = []string{string(corev1.ReadOnlyMany), string(corev1.ReadWriteMany), string(corev1.ReadWriteOnce), string(corev1.ReadWriteOncePod)}
	volumeModes = []string{string(corev1.PersistentVolumeBlock), string(corev1.PersistentVolumeFilesystem)}
)

// Validate checks c as the API server checks the creation of a claim
// (after it generated a name from generateName), quantities bounded as
// ParseQuantity bounds them. It never prints or compares an unbounded
// quantity, so it is cheap on a claim decoded from anywhere.
func Validate(c *corev1.PersistentVolumeClaim) field.ErrorList {
	meta := c.ObjectMeta
	if meta.Name == "" && meta.GenerateName != "" {
		// As the API server's name generator does: at most 58 characters
		// of the prefix, then 5 random ones.
		meta.Name = meta.GenerateName[:min(len(meta.GenerateName), 58)] + "xxxxx"
	}
	errs := apivalidation.ValidateObjectMeta(&meta, true, apivalidation.NameIsDNSSubdomain, field.NewPath("metadata"))
	return append(errs, validateSpec(&c.Spec, field.NewPath("spec"))...)
}

func validateSpec(spec *corev1.PersistentVolumeClaimSpec, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if len(spec.AccessModes) == 0 {
		errs = append(errs, field.Required(p.Child("accessModes"), "at least 1 access mode is required"))
	}
	if spec.Selector != nil {
		errs = append(errs, metav1validation.ValidateLabelSelector(spec.Selector, metav1validation.LabelSelectorValidationOptions{}, p.Child("selector"))...)
	}
	rwop, others := false, false
	for _, m := range spec.AccessModes {
		switch {
		case !slices.Contains(accessModes, string(m)):
			errs = append(errs, field.NotSupported(p.Child("accessModes"), m, accessModes))
		case m == corev1.ReadWriteOncePod:
			rwop = true
		default:
			others = true
		}
	}
	if rwop && others {
		errs = append(errs, field.Forbidden(p.Child("accessModes"), "may not use ReadWriteOncePod with other access modes"))
	}

	res := p.Child("resources")
	for _, list := range []struct {
		name string
		l    corev1.ResourceList
	}{{"requests", spec.Resources.Requests}, {"limits", spec.Resources.Limits}} {
		for name, q := range list.l {
			if err := kube.CheckQuantityMagnitude(q); err != nil {
				errs = append(errs, field.Invalid(res.Child(list.name).Key(string(name)), approx(q), err.Error()))
			}
		}
	}
	storagePath := res.Child("requests").Key(string(corev1.ResourceStorage))
	if storage, ok := spec.Resources.Requests[corev1.ResourceStorage]; !ok {
		errs = append(errs, field.Required(storagePath, "the claim's size, e.g. 1Gi"))
	} else if kube.CheckQuantityMagnitude(storage) == nil && storage.Sign() <= 0 {
		errs = append(errs, field.Invalid(storagePath, storage.String(), "must be greater than zero"))
	}

	if spec.StorageClassName != nil && *spec.StorageClassName != "" {
		errs = append(errs, dnsSubdomain(p.Child("storageClassName"), *spec.StorageClassName)...)
	}
	if spec.VolumeAttributesClassName != nil && *spec.VolumeAttributesClassName != "" {
		errs = append(errs, dnsSubdomain(p.Child("volumeAttributesClassName"), *spec.VolumeAttributesClassName)...)
	}
	if spec.VolumeMode != nil && !slices.Contains(volumeModes, string(*spec.VolumeMode)) {
		errs = append(errs, field.NotSupported(p.Child("volumeMode"), *spec.VolumeMode, volumeModes))
	}

	if ds := spec.DataSource; ds != nil {
		errs = append(errs, validateSource(p.Child("dataSource"), ds.Name, ds.Kind, ds.APIGroup)...)
	}
	if ref := spec.DataSourceRef; ref != nil {
		errs = append(errs, validateSource(p.Child("dataSourceRef"), ref.Name, ref.Kind, ref.APIGroup)...)
		if ref.Namespace != nil && *ref.Namespace != "" {
			for _, msg := range apivalidation.ValidateNamespaceName(*ref.Namespace, false) {
				errs = append(errs, field.Invalid(p.Child("dataSourceRef", "namespace"), *ref.Namespace, msg))
			}
		}
	}
	ds, ref := spec.DataSource, spec.DataSourceRef
	switch {
	case ref != nil && ref.Namespace != nil && *ref.Namespace != "":
		if ds != nil {
			errs = append(errs, field.Invalid(p.Child("dataSource"), ds.Name, "may not be specified when dataSourceRef.namespace is specified"))
		}
	case ds != nil && ref != nil:
		if ds.Kind != ref.Kind || ds.Name != ref.Name || !sameGroup(ds.APIGroup, ref.APIGroup) {
			errs = append(errs, field.Invalid(p.Child("dataSource"), ds.Name, "must match dataSourceRef"))
		}
	}
	return errs
}

// validateSource checks a dataSource or dataSourceRef: a name, a kind, and
// a kind in the core group only if it is a claim.
func validateSource(p *field.Path, name, kind string, group *string) field.ErrorList {
	var errs field.ErrorList
	if name == "" {
		errs = append(errs, field.Required(p.Child("name"), ""))
	}
	if kind == "" {
		errs = append(errs, field.Required(p.Child("kind"), ""))
	}
	g := ""
	if group != nil {
		g = *group
	}
	if g == "" && kind != "PersistentVolumeClaim" {
		errs = append(errs, field.Invalid(p, kind, "must be 'PersistentVolumeClaim' when referencing the default apiGroup"))
	}
	if g != "" {
		for _, msg := range validation.IsDNS1123Subdomain(g) {
			errs = append(errs, field.Invalid(p.Child("apiGroup"), g, msg))
		}
	}
	return errs
}

func sameGroup(a, b *string) bool {
	return (a == nil) == (b == nil) && (a == nil || *a == *b)
}

func dnsSubdomain(p *field.Path, v string) field.ErrorList {
	var errs field.ErrorList
	for _, msg := range apivalidation.NameIsDNSSubdomain(v, false) {
		errs = append(errs, field.Invalid(p, v, msg))
	}
	return errs
}

// approx shows a quantity that may be too large to print exactly.
func approx(q resource.Quantity) string {
	return fmt.Sprintf("about %.3g", q.AsApproximateFloat64())
}
