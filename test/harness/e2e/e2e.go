// Package e2e holds what volplane's end-to-end tests share: polling
// helpers and the Kubernetes objects and checks they use, against a real
// kube-apiserver (test/harness/devenv).
package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
)

// Eventually polls cond until it returns "" (met) or the timeout passes,
// then fails the test with the last reason.
func Eventually(t testing.TB, timeout time.Duration, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		last := cond()
		if last == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %s: %s", timeout, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Consistently checks that cond stays met ("") for d.
func Consistently(t testing.TB, d time.Duration, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if why := cond(); why != "" {
			t.Fatalf("condition broke: %s", why)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Namespace creates a namespace named after the test and, when the test
// ends, deletes its claims (no kube-controller-manager empties a deleted
// namespace here).
func Namespace(t testing.TB, c kubernetes.Interface) string {
	t.Helper()
	name := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(name) > 50 {
		name = name[:50]
	}
	name = strings.Trim(name, "-") + fmt.Sprintf("-%d", time.Now().UnixNano()%100000)
	if _, err := c.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.CoreV1().PersistentVolumeClaims(name).DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{})
	})
	return name
}

// Claim builds a ReadWriteOnce claim of class cls asking for size.
func Claim(namespace, name, size, cls string, opts ...func(*corev1.PersistentVolumeClaim)) *corev1.PersistentVolumeClaim {
	c := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: &cls,
			Resources: corev1.VolumeResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)},
			},
		},
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Volume builds a free ReadWriteOnce hostPath volume of class cls and
// size, reclaim policy Retain.
func Volume(name, size, cls string) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName:              cls,
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/tmp/" + name}},
		},
	}
}

// CreateClass creates a StorageClass and deletes it when the test ends.
func CreateClass(t testing.TB, c kubernetes.Interface, sc *storagev1.StorageClass) *storagev1.StorageClass {
	t.Helper()
	if sc.VolumeBindingMode == nil {
		m := storagev1.VolumeBindingImmediate
		sc.VolumeBindingMode = &m
	}
	created, err := c.StorageV1().StorageClasses().Create(context.Background(), sc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create StorageClass %s: %v", sc.Name, err)
	}
	t.Cleanup(func() {
		_ = c.StorageV1().StorageClasses().Delete(context.Background(), sc.Name, metav1.DeleteOptions{})
	})
	return created
}

// ClaimPhase waits until the claim has the phase and returns it.
func ClaimPhase(t testing.TB, c kubernetes.Interface, namespace, name string, phase corev1.PersistentVolumeClaimPhase, timeout time.Duration) *corev1.PersistentVolumeClaim {
	t.Helper()
	var pvc *corev1.PersistentVolumeClaim
	Eventually(t, timeout, func() string {
		var err error
		if pvc, err = c.CoreV1().PersistentVolumeClaims(namespace).Get(context.Background(), name, metav1.GetOptions{}); err != nil {
			return err.Error()
		}
		if pvc.Status.Phase != phase {
			return fmt.Sprintf("PVC %s/%s is %q, want %q", namespace, name, pvc.Status.Phase, phase)
		}
		return ""
	})
	return pvc
}

// VolumePhase waits until the volume has the phase and returns it.
func VolumePhase(t testing.TB, c kubernetes.Interface, name string, phase corev1.PersistentVolumePhase, timeout time.Duration) *corev1.PersistentVolume {
	t.Helper()
	var pv *corev1.PersistentVolume
	Eventually(t, timeout, func() string {
		var err error
		if pv, err = c.CoreV1().PersistentVolumes().Get(context.Background(), name, metav1.GetOptions{}); err != nil {
			return err.Error()
		}
		if pv.Status.Phase != phase {
			return fmt.Sprintf("PV %s is %q, want %q", name, pv.Status.Phase, phase)
		}
		return ""
	})
	return pv
}

// Events lists "Reason: message" of the events about an object.
func Events(c kubernetes.Interface, namespace, kind, name string) ([]corev1.Event, error) {
	sel := fields.Set{"involvedObject.kind": kind, "involvedObject.name": name}.AsSelector().String()
	list, err := c.CoreV1().Events(namespace).List(context.Background(), metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		return nil, err
	}
	return list.Items, nil
}

// HasEvent waits for an event with the reason, a message containing msg,
// and (when not empty) the source component, about the object. A
// component ending in "_" is a prefix: external-provisioner's components
// are "<driver>_<host>_<uuid>".
func HasEvent(t testing.TB, c kubernetes.Interface, namespace, kind, name, reason, msg, component string, timeout time.Duration) {
	t.Helper()
	Eventually(t, timeout, func() string {
		evs, err := Events(c, namespace, kind, name)
		if err != nil {
			return err.Error()
		}
		var seen []string
		for _, e := range evs {
			if e.Reason == reason && strings.Contains(e.Message, msg) {
				if component != "" && e.Source.Component != component &&
					!(strings.HasSuffix(component, "_") && strings.HasPrefix(e.Source.Component, component)) {
					return fmt.Sprintf("%s event from %q, want %q", reason, e.Source.Component, component)
				}
				return ""
			}
			seen = append(seen, e.Reason+": "+e.Message)
		}
		return fmt.Sprintf("no %s event %q on %s %s; seen %q", reason, msg, kind, name, seen)
	})
}
