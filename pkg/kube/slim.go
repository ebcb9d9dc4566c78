package kube

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// Slim returns o, or a shallow copy of it without metadata.managedFields
// when it has them: the form objects travel in on the watcher stream and
// are cached in. managedFields are most of an object's bytes, no volplane
// service reads them, and an update that sends an object without them
// leaves the server's unchanged. Slim never writes into o (it may be an
// informer's, or shared).
func Slim[T any, P interface {
	*T
	metav1.Object
}](o P) P {
	if o.GetManagedFields() == nil {
		return o
	}
	c := *o
	P(&c).SetManagedFields(nil)
	return &c
}

// StripManagedFields is an informer transform (cache.TransformFunc) that
// keeps objects as Slim would, in place: an informer's transform owns the
// object it is given.
func StripManagedFields(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	return obj, nil
}
