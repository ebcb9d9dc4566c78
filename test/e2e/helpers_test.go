package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volplane/volplane/test/harness/e2e"
)

// waitServing polls a gRPC server's health until it is SERVING.
func waitServing(ctx context.Context, addr string, errc <-chan error) error {
	cc, err := cluster.e2e.Dial(addr)
	if err != nil {
		return err
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		select {
		case err := <-errc:
			return fmt.Errorf("a service exited: %w", err)
		default:
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		resp, err := hc.Check(cctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && resp.Status == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%s not SERVING within 2 minutes", addr)
}

// eventually polls cond until it returns "" (met) or the timeout passes,
// then fails with the last reason.
func eventually(t *testing.T, timeout time.Duration, cond func() string) {
	t.Helper()
	e2e.Eventually(t, timeout, cond)
}

// consistently checks cond stays met ("") for the duration.
func consistently(t *testing.T, d time.Duration, cond func() string) {
	t.Helper()
	e2e.Consistently(t, d, cond)
}

// ns creates a namespace for one test; its claims are deleted afterwards.
func ns(t *testing.T) string {
	t.Helper()
	return e2e.Namespace(t, cluster.client)
}

type pvOpt func(*corev1.PersistentVolume)

func withPolicy(p corev1.PersistentVolumeReclaimPolicy) pvOpt {
	return func(v *corev1.PersistentVolume) { v.Spec.PersistentVolumeReclaimPolicy = p }
}
func withClaimRef(ns, name, uid string) pvOpt {
	return func(v *corev1.PersistentVolume) {
		v.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: ns, Name: name, UID: types.UID(uid)}
	}
}
func withAnnotation(k, val string) pvOpt {
	return func(v *corev1.PersistentVolume) {
		if v.Annotations == nil {
			v.Annotations = map[string]string{}
		}
		v.Annotations[k] = val
	}
}

// newPV builds a hostPath volume with class cls (Retain by default).
func newPV(name, size, cls string, opts ...pvOpt) *corev1.PersistentVolume {
	v := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              cls,
			PersistentVolumeSource: corev1.PersistentVolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: "/tmp/volplane-e2e/" + name},
			},
		},
	}
	for _, o := range opts {
		o(v)
	}
	return v
}

// createPV creates a hostPath volume with class cls (Retain by default) and
// deletes it when the test ends.
func createPV(t *testing.T, name, size, cls string, opts ...pvOpt) *corev1.PersistentVolume {
	t.Helper()
	v := newPV(name, size, cls, opts...)
	created, err := cluster.client.CoreV1().PersistentVolumes().Create(t.Context(), v, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create PV %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = cluster.client.CoreV1().PersistentVolumes().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return created
}

type pvcOpt func(*corev1.PersistentVolumeClaim)

func wantVolume(name string) pvcOpt {
	return func(c *corev1.PersistentVolumeClaim) { c.Spec.VolumeName = name }
}
func claimAnnotation(k, val string) pvcOpt {
	return func(c *corev1.PersistentVolumeClaim) {
		if c.Annotations == nil {
			c.Annotations = map[string]string{}
		}
		c.Annotations[k] = val
	}
}
func blockMode() pvcOpt {
	return func(c *corev1.PersistentVolumeClaim) { m := corev1.PersistentVolumeBlock; c.Spec.VolumeMode = &m }
}

// newPVC builds a ReadWriteOnce claim of class cls.
func newPVC(namespace, name, size, cls string, opts ...pvcOpt) *corev1.PersistentVolumeClaim {
	fs := make([]func(*corev1.PersistentVolumeClaim), len(opts))
	for i, o := range opts {
		fs[i] = o
	}
	return e2e.Claim(namespace, name, size, cls, fs...)
}

// createPVC creates a ReadWriteOnce claim of class cls.
func createPVC(t *testing.T, namespace, name, size, cls string, opts ...pvcOpt) *corev1.PersistentVolumeClaim {
	t.Helper()
	c := newPVC(namespace, name, size, cls, opts...)
	created, err := cluster.client.CoreV1().PersistentVolumeClaims(namespace).Create(t.Context(), c, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create PVC %s/%s: %v", namespace, name, err)
	}
	return created
}

func createClass(t *testing.T, name, provisioner string, mode storagev1.VolumeBindingMode) {
	t.Helper()
	sc := &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: name},
		Provisioner:       provisioner,
		VolumeBindingMode: &mode,
	}
	if _, err := cluster.client.StorageV1().StorageClasses().Create(t.Context(), sc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create StorageClass %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = cluster.client.StorageV1().StorageClasses().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

func getPV(t *testing.T, name string) *corev1.PersistentVolume {
	t.Helper()
	v, err := cluster.client.CoreV1().PersistentVolumes().Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	return v
}

func getPVC(t *testing.T, namespace, name string) *corev1.PersistentVolumeClaim {
	t.Helper()
	c, err := cluster.client.CoreV1().PersistentVolumeClaims(namespace).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	return c
}

// pvPhase waits until the volume has the phase.
func pvPhase(t *testing.T, name string, phase corev1.PersistentVolumePhase) *corev1.PersistentVolume {
	t.Helper()
	var v *corev1.PersistentVolume
	eventually(t, 30*time.Second, func() string {
		if v = getPV(t, name); v == nil {
			return "PV " + name + " not found"
		}
		if v.Status.Phase != phase {
			return fmt.Sprintf("PV %s is %q, want %q", name, v.Status.Phase, phase)
		}
		return ""
	})
	return v
}

// pvcPhase waits until the claim has the phase.
func pvcPhase(t *testing.T, namespace, name string, phase corev1.PersistentVolumeClaimPhase) *corev1.PersistentVolumeClaim {
	t.Helper()
	var c *corev1.PersistentVolumeClaim
	eventually(t, 30*time.Second, func() string {
		if c = getPVC(t, namespace, name); c == nil {
			return "PVC " + namespace + "/" + name + " not found"
		}
		if c.Status.Phase != phase {
			return fmt.Sprintf("PVC %s/%s is %q, want %q", namespace, name, c.Status.Phase, phase)
		}
		return ""
	})
	return c
}

// hasEvent waits for an event with the reason (and a message containing
// msg) about the object.
func hasEvent(t *testing.T, namespace, kind, name, reason, msg string) {
	t.Helper()
	sel := fields.Set{"involvedObject.kind": kind, "involvedObject.name": name}.AsSelector().String()
	eventually(t, 30*time.Second, func() string {
		list, err := cluster.client.CoreV1().Events(namespace).List(t.Context(), metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			return err.Error()
		}
		var seen []string
		for _, e := range list.Items {
			if e.Reason == reason && strings.Contains(e.Message, msg) {
				if e.Source.Component != "persistentvolume-controller" {
					return "event source is " + e.Source.Component
				}
				return ""
			}
			seen = append(seen, e.Reason+": "+e.Message)
		}
		return fmt.Sprintf("no %s event %q on %s %s; seen %q", reason, msg, kind, name, seen)
	})
}

func annotated(m metav1.ObjectMeta, k string) bool {
	_, ok := m.Annotations[k]
	return ok
}
