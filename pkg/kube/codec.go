package kube

import (
	"fmt"
	"reflect"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/client-go/kubernetes/scheme"
)

// Object is a Kubernetes object that has a generated protobuf codec.
type Object interface {
	runtime.Object
	Marshal() ([]byte, error)
	Unmarshal([]byte) error
}

var (
	_ Object = (*corev1.PersistentVolume)(nil)
	_ Object = (*corev1.PersistentVolumeClaim)(nil)
	_ Object = (*storagev1.StorageClass)(nil)
)

// EncodeProto encodes an object in Kubernetes protobuf, without the envelope
// the API server adds: both ends know the kind.
func EncodeProto(o Object) ([]byte, error) {
	b, err := o.Marshal()
	if err != nil {
		return nil, fmt.Errorf("encode %T: %w", o, err)
	}
	return b, nil
}

// DecodeVolume decodes a PersistentVolume encoded by EncodeProto. Its
// quantities are checked (ParseQuantity's bounds) before it is decoded:
// the bytes may come from any caller.
func DecodeVolume(b []byte) (*corev1.PersistentVolume, error) {
	pv := &corev1.PersistentVolume{}
	if err := checkProtoQuantities(b, reflect.TypeOf(*pv)); err != nil {
		return nil, fmt.Errorf("decode PersistentVolume: %w", err)
	}
	if err := pv.Unmarshal(b); err != nil {
		return nil, fmt.Errorf("decode PersistentVolume: %w", err)
	}
	return pv, nil
}

// DecodeClaim decodes a PersistentVolumeClaim encoded by EncodeProto, its
// quantities checked first as DecodeVolume's are.
func DecodeClaim(b []byte) (*corev1.PersistentVolumeClaim, error) {
	pvc := &corev1.PersistentVolumeClaim{}
	if err := checkProtoQuantities(b, reflect.TypeOf(*pvc)); err != nil {
		return nil, fmt.Errorf("decode PersistentVolumeClaim: %w", err)
	}
	if err := pvc.Unmarshal(b); err != nil {
		return nil, fmt.Errorf("decode PersistentVolumeClaim: %w", err)
	}
	return pvc, nil
}

// DecodeStorageClass decodes a StorageClass encoded by EncodeProto.
func DecodeStorageClass(b []byte) (*storagev1.StorageClass, error) {
	sc := &storagev1.StorageClass{}
	if err := sc.Unmarshal(b); err != nil {
		return nil, fmt.Errorf("decode StorageClass: %w", err)
	}
	return sc, nil
}

var jsonSerializer = json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme.Scheme, scheme.Scheme, json.SerializerOptions{})

// EncodeJSON encodes an object as the API server's JSON, with apiVersion and
// kind set.
func EncodeJSON(o runtime.Object) ([]byte, error) {
	o = o.DeepCopyObject()
	gvks, _, err := scheme.Scheme.ObjectKinds(o)
	if err != nil || len(gvks) == 0 {
		return nil, fmt.Errorf("encode %T as JSON: unknown kind: %v", o, err)
	}
	o.GetObjectKind().SetGroupVersionKind(gvks[0])
	b, err := runtime.Encode(jsonSerializer, o)
	if err != nil {
		return nil, fmt.Errorf("encode %T as JSON: %w", o, err)
	}
	return b, nil
}
