package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// The messages kube-controller-manager's PV controller gives an unbound
// WaitForFirstConsumer claim (emitEventForUnboundDelayBindingClaim).
const (
	WaitForFirstConsumerMessage = "waiting for first consumer to be created before binding"
	waitForPodMessage           = "waiting for pod %s to be scheduled"
	waitForPodsMessage          = "waiting for pods %s to be scheduled"
)

// PodUsing builds a pod that is never scheduled by itself (no scheduler
// runs in the tests) and mounts the claims.
func PodUsing(namespace, name string, claims ...string) *corev1.Pod {
	no := false
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken: &no,
			Containers:                   []corev1.Container{{Name: "app", Image: "busybox"}},
		},
	}
	for i, cl := range claims {
		p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{
			Name:         fmt.Sprintf("vol-%d", i),
			VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: cl}},
		})
	}
	return p
}

// EventCount sums the counts of the events about a claim with this
// reason and exact message (an event recorder counts repeats in one Event
// object).
func EventCount(t testing.TB, c kubernetes.Interface, namespace, claim, reason, message string) int32 {
	t.Helper()
	evs, err := Events(c, namespace, "PersistentVolumeClaim", claim)
	if err != nil {
		t.Fatal(err)
	}
	var n int32
	for _, e := range evs {
		if e.Reason == reason && e.Message == message {
			n += max(e.Count, 1)
		}
	}
	return n
}

// waitEventCount waits until the claim's events with the reason and one of
// the messages count more than after, and returns the message seen.
func waitEventCount(t testing.TB, c kubernetes.Interface, namespace, claim, reason string, after int32, timeout time.Duration, messages ...string) string {
	t.Helper()
	var seen string
	Eventually(t, timeout, func() string {
		var n int32
		for _, m := range messages {
			if k := EventCount(t, c, namespace, claim, reason, m); k > 0 {
				n += k
				seen = m
			}
		}
		if n > after {
			return ""
		}
		evs, _ := Events(c, namespace, "PersistentVolumeClaim", claim)
		var all []string
		for _, e := range evs {
			all = append(all, fmt.Sprintf("%s %q x%d from %s", e.Reason, e.Message, e.Count, e.Source.Component))
		}
		return fmt.Sprintf("claim %s/%s: no new %s event %q; events: %q", namespace, claim, reason, messages, all)
	})
	return seen
}

// CheckWaitForPodScheduled plays, in namespace ns, the life of
// WaitForFirstConsumer claims whose pods are never scheduled, and checks
// the events kube-controller-manager's PV controller gives them
// (emitEventForUnboundDelayBindingClaim over findNonScheduledPodsByPVC):
// WaitForFirstConsumer while no pod uses a claim; WaitForPodScheduled
// naming the pods that use it and are neither scheduled nor terminated;
// WaitForFirstConsumer again when none is left; a generic ephemeral
// volume's claim counts its pod. Every event is of type Normal, from
// component. kube-controller-manager syncs claims every 15s; timeout bounds
// each step.
func CheckWaitForPodScheduled(t *testing.T, c kubernetes.Interface, ns, component string, timeout time.Duration) {
	ctx := context.Background()
	// Pods need their namespace's default ServiceAccount, which
	// kube-controller-manager's serviceaccount controller (not running
	// here) would make.
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "default"}}
	if _, err := c.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	mode := storagev1.VolumeBindingWaitForFirstConsumer
	cls := CreateClass(t, c, &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: ns + "-wffc"},
		Provisioner:       "kubernetes.io/no-provisioner",
		VolumeBindingMode: &mode,
	})
	if _, err := c.CoreV1().PersistentVolumeClaims(ns).Create(ctx, Claim(ns, "data", "1Gi", cls.Name), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	createPod := func(p *corev1.Pod) *corev1.Pod {
		t.Helper()
		created, err := c.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return created
	}
	check := func(reason string, after int32, messages ...string) string {
		t.Helper()
		m := waitEventCount(t, c, ns, "data", reason, after, timeout, messages...)
		HasEvent(t, c, ns, "PersistentVolumeClaim", "data", reason, m, component, timeout)
		return m
	}
	wffc := kubeEvent{"WaitForFirstConsumer", WaitForFirstConsumerMessage}

	// No pod yet.
	check(wffc.reason, 0, wffc.message)
	ClaimPhase(t, c, ns, "data", corev1.ClaimPending, timeout)

	// An unscheduled pod, and one placed on a node by hand (which the
	// scheduler would have selected a node for: it does not count).
	createPod(PodUsing(ns, "web", "data"))
	pinned := PodUsing(ns, "pinned", "data")
	pinned.Spec.NodeName = "node-a"
	createPod(pinned)
	one := fmt.Sprintf(waitForPodMessage, "web")
	check("WaitForPodScheduled", 0, one)

	// Two unscheduled pods: both named, in kube-controller-manager's
	// (random) index order; volplane sorts them.
	api := createPod(PodUsing(ns, "api", "data"))
	check("WaitForPodScheduled", 0, fmt.Sprintf(waitForPodsMessage, "api,web"), fmt.Sprintf(waitForPodsMessage, "web,api"))

	// A terminated pod does not count.
	oneBefore := EventCount(t, c, ns, "data", "WaitForPodScheduled", one)
	api.Status.Phase = corev1.PodFailed
	if _, err := c.CoreV1().Pods(ns).UpdateStatus(ctx, api, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	check("WaitForPodScheduled", oneBefore, one)

	// The last unscheduled pod goes: WaitForFirstConsumer again.
	wffcBefore := EventCount(t, c, ns, "data", wffc.reason, wffc.message)
	if err := c.CoreV1().Pods(ns).Delete(ctx, "web", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	Eventually(t, timeout, func() string {
		if _, err := c.CoreV1().Pods(ns).Get(ctx, "web", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Sprintf("pod web not deleted yet (%v)", err)
		}
		return ""
	})
	check(wffc.reason, wffcBefore, wffc.message)
	ClaimPhase(t, c, ns, "data", corev1.ClaimPending, timeout)

	// A generic ephemeral volume: its claim, "<pod>-<volume>" (made by
	// the ephemeral volume controller, which does not run here), waits
	// for the pod.
	eph := PodUsing(ns, "eph")
	eph.Spec.Volumes = []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{
		VolumeClaimTemplate: &corev1.PersistentVolumeClaimTemplate{Spec: Claim(ns, "", "1Gi", cls.Name).Spec},
	}}}}
	eph = createPod(eph)
	ephClaim := Claim(ns, "eph-scratch", "1Gi", cls.Name)
	yes := true
	ephClaim.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: eph.Name, UID: eph.UID, Controller: &yes, BlockOwnerDeletion: &yes}}
	if _, err := c.CoreV1().PersistentVolumeClaims(ns).Create(ctx, ephClaim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitEventCount(t, c, ns, "eph-scratch", "WaitForPodScheduled", 0, timeout, fmt.Sprintf(waitForPodMessage, "eph"))
	HasEvent(t, c, ns, "PersistentVolumeClaim", "eph-scratch", "WaitForPodScheduled", fmt.Sprintf(waitForPodMessage, "eph"), component, timeout)

	// Every one of these events is Normal. The log shows what the
	// controller said, for comparing one with another.
	for _, claim := range []string{"data", "eph-scratch"} {
		evs, err := Events(c, ns, "PersistentVolumeClaim", claim)
		if err != nil {
			t.Fatal(err)
		}
		slices.SortFunc(evs, func(a, b corev1.Event) int { return a.FirstTimestamp.Compare(b.FirstTimestamp.Time) })
		for _, e := range evs {
			t.Logf("claim %s: %s %s %q x%d from %s", claim, e.Type, e.Reason, e.Message, e.Count, e.Source.Component)
			if (e.Reason == "WaitForPodScheduled" || e.Reason == wffc.reason) && e.Type != corev1.EventTypeNormal {
				t.Errorf("%s event of type %s, want Normal", e.Reason, e.Type)
			}
		}
	}
	// No kubelet finishes the pods: delete them at once.
	if err := c.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}, metav1.ListOptions{}); err != nil {
		t.Error(err)
	}
}

type kubeEvent struct{ reason, message string }
