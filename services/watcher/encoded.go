package watcher

import (
	"errors"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/watchclient"
)

// encoded is all the informers keep of a volume, a claim or a class: its
// key, resourceVersion and Kubernetes protobuf. The watcher never reads an
// object's fields, it only passes them on, and every subscriber (the
// binder always is one) wants the protobuf: so the transform (transform)
// encodes each object once, as it arrives, and the informer's cache, the
// hub's state and its history share those bytes. A decoded object takes
// several times the memory (BenchmarkVolumeMemory100k).
type encoded struct {
	namespace, name string
	uid             types.UID
	resourceVersion string
	pb              []byte // never written after the transform
}

var (
	_ kube.Object               = (*encoded)(nil)
	_ metav1.ObjectMetaAccessor = (*encoded)(nil)
)

// transform is the transform of the volume, claim and class informers: it
// turns the object into an encoded, without metadata.managedFields
// (watchclient.Slim: most of an object's bytes; no subscriber reads them,
// and writers that send an object without them leave the server's
// unchanged). It is idempotent, as
// client-go asks, and writes nothing into the object it is given. An
// object that cannot be encoded is kept decoded, and the hub reports its
// error to subscribers.
func transform(obj any) (any, error) {
	switch o := obj.(type) {
	case *encoded:
		return o, nil
	case *corev1.PersistentVolume:
		return encode(watchclient.Slim(o)), nil
	case *corev1.PersistentVolumeClaim:
		return encode(watchclient.Slim(o)), nil
	case *storagev1.StorageClass:
		return encode(watchclient.Slim(o)), nil
	}
	return obj, nil // a tombstone: its object was transformed before
}

func encode(o interface {
	kube.Object
	metav1.Object
}) kube.Object {
	b, err := kube.EncodeProto(o)
	if err != nil {
		return o
	}
	return &encoded{namespace: o.GetNamespace(), name: o.GetName(), uid: o.GetUID(), resourceVersion: o.GetResourceVersion(), pb: b}
}

// GetObjectMeta makes the key and resourceVersion readable to client-go's
// cache (meta.Accessor); a fresh copy each time, as nothing writes through
// it.
func (e *encoded) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Namespace: e.namespace, Name: e.name, UID: e.uid, ResourceVersion: e.resourceVersion}
}

// GetObjectKind implements runtime.Object.
func (e *encoded) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject implements runtime.Object. The copy shares the bytes,
// which nothing writes.
func (e *encoded) DeepCopyObject() runtime.Object {
	c := *e
	return &c
}

// Marshal returns the protobuf the transform made (kube.EncodeProto).
func (e *encoded) Marshal() ([]byte, error) { return e.pb, nil }

// Unmarshal is not needed: subscribers decode the protobuf by kind.
func (e *encoded) Unmarshal([]byte) error {
	return errors.New("an encoded object is decoded by its kind (kube.DecodeVolume, DecodeClaim, DecodeStorageClass)")
}
