package watcher

import (
	"fmt"
	"slices"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volplane/volplane/pkg/kube"
	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

// podView is all the pod informer keeps of a pod: its transform (slimPod)
// turns every *corev1.Pod into one before it is cached, so the cache holds
// about a hundred bytes per pod instead of the pod's kilobytes. It is what a
// KIND_POD event carries (watcherv1.Pod).
type podView struct {
	namespace, name string
	uid             types.UID
	resourceVersion string
	claims          []string // claim names, in volume order, each once
	nodeName        string
	phase           corev1.PodPhase
	terminated      bool
}

var (
	_ kube.Object               = (*podView)(nil)
	_ metav1.ObjectMetaAccessor = (*podView)(nil)
)

// slimPod is the pod informer's transform. It is idempotent, as client-go
// asks: a view passes through unchanged.
func slimPod(obj any) (any, error) {
	switch p := obj.(type) {
	case *podView:
		return p, nil
	case *corev1.Pod:
		return newPodView(p), nil
	}
	return obj, nil // a tombstone: its object was transformed before
}

func newPodView(p *corev1.Pod) *podView {
	return &podView{
		namespace:       p.Namespace,
		name:            p.Name,
		uid:             p.UID,
		resourceVersion: p.ResourceVersion,
		claims:          podClaims(p),
		nodeName:        p.Spec.NodeName,
		phase:           p.Status.Phase,
		terminated:      podTerminated(p),
	}
}

// podClaims lists the claims a pod's volumes use, as kube-controller-manager
// indexes pods by claim (pkg/controller/volume/common.PodPVCIndexFunc): a
// persistentVolumeClaim volume's claimName, and for a generic ephemeral
// volume the claim made for it, "<pod>-<volume>"
// (k8s.io/component-helpers/storage/ephemeral.VolumeClaimName). Each
// claim once: the index holds a pod once per claim.
func podClaims(p *corev1.Pod) []string {
	var out []string
	for i := range p.Spec.Volumes {
		v := &p.Spec.Volumes[i]
		name := ""
		switch {
		case v.PersistentVolumeClaim != nil:
			name = v.PersistentVolumeClaim.ClaimName
		case v.Ephemeral != nil:
			name = p.Name + "-" + v.Name
		}
		if name != "" && !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	return out
}

// podTerminated is k8s.io/kubernetes pkg/volume/util.IsPodTerminated, which
// the PV controller uses to leave finished pods out: phase Failed or
// Succeeded, or deleted with no container running.
func podTerminated(p *corev1.Pod) bool {
	s := &p.Status
	return s.Phase == corev1.PodFailed || s.Phase == corev1.PodSucceeded ||
		(p.DeletionTimestamp != nil && notRunning(s.InitContainerStatuses) && notRunning(s.ContainerStatuses) && notRunning(s.EphemeralContainerStatuses))
}

// notRunning reports whether every status is waiting or terminated (true
// for none).
func notRunning(statuses []corev1.ContainerStatus) bool {
	for i := range statuses {
		if statuses[i].State.Terminated == nil && statuses[i].State.Waiting == nil {
			return false
		}
	}
	return true
}

// sameView reports whether two views of a pod say the same (whatever their
// resourceVersions): an update between them is not worth an event.
func (p *podView) sameView(q *podView) bool {
	return p.namespace == q.namespace && p.name == q.name && p.uid == q.uid &&
		slices.Equal(p.claims, q.claims) && p.nodeName == q.nodeName &&
		p.phase == q.phase && p.terminated == q.terminated
}

func (p *podView) proto() *watcherv1.Pod {
	return &watcherv1.Pod{
		Namespace:  p.namespace,
		Name:       p.name,
		Uid:        string(p.uid),
		ClaimNames: p.claims,
		NodeName:   p.nodeName,
		Phase:      string(p.phase),
		Terminated: p.terminated,
	}
}

// GetObjectMeta makes the view's key and resourceVersion readable to
// client-go's cache (meta.Accessor); a fresh copy each time, as nothing
// writes through it.
func (p *podView) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Namespace: p.namespace, Name: p.name, UID: p.uid, ResourceVersion: p.resourceVersion}
}

// GetObjectKind implements runtime.Object.
func (p *podView) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject implements runtime.Object.
func (p *podView) DeepCopyObject() runtime.Object {
	c := *p
	c.claims = slices.Clone(p.claims)
	return &c
}

// Marshal encodes the view as a watcherv1.Pod (kube.EncodeProto).
func (p *podView) Marshal() ([]byte, error) { return proto.Marshal(p.proto()) }

// Unmarshal is not needed: subscribers decode watcherv1.Pod.
func (p *podView) Unmarshal([]byte) error {
	return fmt.Errorf("a pod view is decoded as %s", (&watcherv1.Pod{}).ProtoReflect().Descriptor().FullName())
}

// podJSON turns a KIND_POD event's protobuf into the canonical JSON of
// watcherv1.Pod.
func podJSON(b []byte) ([]byte, error) {
	var p watcherv1.Pod
	if err := proto.Unmarshal(b, &p); err != nil {
		return nil, fmt.Errorf("decode pod view: %w", err)
	}
	return protojson.Marshal(&p)
}
