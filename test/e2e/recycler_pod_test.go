package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/volplane/volplane/gateway"
	"github.com/volplane/volplane/pkg/kube"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
	"github.com/volplane/volplane/services/reclaimer"
)

// The shared reclaimer recycles node-locally and leaves NFS volumes to a
// reclaimer in pod mode: these tests start their own and hand it the
// volume as the binder would.

// releasedNFS makes a Released NFS volume with policy Recycle (bound to
// claim n/data, which is then deleted).
func releasedNFS(t *testing.T, n, name, size string) *corev1.PersistentVolume {
	t.Helper()
	cls := "recycler-pod-" + n
	createPV(t, name, size, cls, withNFS("nfs.example", "/exports/"+name), withPolicy(corev1.PersistentVolumeReclaimRecycle))
	bindAndRelease(t, n, name, cls)
	// The shared (node-local) reclaimer leaves it alone.
	waitReclaim(t, reclaimerClient(t, cluster.reclaimerAddr), name, reclaimerv1.State_STATE_SKIPPED)
	return getPV(t, name)
}

func handOver(t *testing.T, c reclaimerv1.ReclaimerServiceClient, v *corev1.PersistentVolume) *reclaimerv1.Reclaim {
	t.Helper()
	b, err := kube.EncodeProto(v)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Reclaim(t.Context(), &reclaimerv1.ReclaimRequest{VolumeName: v.Name, VolumeUid: string(v.UID), Volume: b})
	if err != nil {
		t.Fatalf("Reclaim %s: %v", v.Name, err)
	}
	return resp.Reclaim
}

// waitPod waits for the recycler pod of the volume.
func waitPod(t *testing.T, namespace, volume string) *corev1.Pod {
	t.Helper()
	var p *corev1.Pod
	eventually(t, 30*time.Second, func() string {
		var err error
		if p, err = cluster.client.CoreV1().Pods(namespace).Get(t.Context(), "recycler-for-"+volume, metav1.GetOptions{}); err != nil {
			return err.Error()
		}
		return ""
	})
	return p
}

// finishPod sets the pod's status as a kubelet would when it ends.
func finishPod(t *testing.T, p *corev1.Pod, phase corev1.PodPhase, exitCode int32) {
	t.Helper()
	p = p.DeepCopy()
	now := metav1.Now()
	p.Status.Phase = phase
	p.Status.StartTime = &now
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{
		Name: p.Spec.Containers[0].Name, Image: p.Spec.Containers[0].Image, ImageID: "docker-pullable://busybox@sha256:0",
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: exitCode, StartedAt: now, FinishedAt: now, Reason: map[bool]string{true: "Completed", false: "Error"}[exitCode == 0]}},
	}}
	if _, err := cluster.client.CoreV1().Pods(p.Namespace).UpdateStatus(t.Context(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("set pod %s/%s %s: %v", p.Namespace, p.Name, phase, err)
	}
}

func podGone(t *testing.T, namespace, name string) {
	t.Helper()
	eventually(t, 30*time.Second, func() string {
		if _, err := cluster.client.CoreV1().Pods(namespace).Get(t.Context(), name, metav1.GetOptions{}); err == nil {
			return "pod " + name + " still exists"
		}
		return ""
	})
}

// Recycler-pod mode creates the pod Kubernetes would, forwards its Events,
// and follows its status: Failed fails the volume (VolumeFailedRecycle) and
// a retry starts a new pod; Succeeded makes the volume Available
// (VolumeRecycled). The pod is deleted either way.
func TestRecyclerPod(t *testing.T) {
	n := recyclerNamespace(t)
	r := startReclaimer(t, "reclaimer-pod-"+n, reclaimer.Options{RecyclerNamespace: n, RetryIntervalStart: 500 * time.Millisecond,
		RecyclerMinimumTimeout: 2 * time.Minute, RecyclerTimeoutIncrement: time.Minute})
	v := releasedNFS(t, n, n+"-pv", "5Gi")
	if rec := handOver(t, r.client, v); rec.Method != reclaimerv1.Method_METHOD_RECYCLER_POD {
		t.Fatalf("record %v", rec)
	}

	p := waitPod(t, n, v.Name)
	c := p.Spec.Containers[0]
	switch {
	case c.Image != reclaimer.DefaultRecyclerImage || !slices.Equal(c.Command, []string{"/usr/local/bin/reclaimer", "scrub", "/scrub"}) || len(c.Args) != 0:
		t.Errorf("container %+v", c)
	case len(c.VolumeMounts) == 0 || c.VolumeMounts[0].Name != "vol" || c.VolumeMounts[0].MountPath != "/scrub":
		t.Errorf("mounts %+v", c.VolumeMounts)
	case p.Spec.Volumes[0].NFS == nil || p.Spec.Volumes[0].NFS.Server != "nfs.example" || p.Spec.Volumes[0].NFS.Path != "/exports/"+v.Name:
		t.Errorf("volumes %+v", p.Spec.Volumes)
	case p.Spec.RestartPolicy != corev1.RestartPolicyNever || p.Spec.ActiveDeadlineSeconds == nil || *p.Spec.ActiveDeadlineSeconds != 300:
		t.Errorf("restart policy %s, deadline %v (5Gi at 1m per GiB)", p.Spec.RestartPolicy, p.Spec.ActiveDeadlineSeconds)
	}
	consistently(t, time.Second, func() string {
		if got := getPV(t, v.Name); got.Status.Phase != corev1.VolumeReleased {
			return "the volume left Released before the pod ran: " + string(got.Status.Phase)
		}
		return ""
	})

	// The pod's Events are repeated on the volume.
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: n, Name: p.Name + ".pulling"},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: n, Name: p.Name, UID: p.UID},
		Reason:         "Pulling", Message: "Pulling image \"busybox\"", Type: corev1.EventTypeNormal,
		Source: corev1.EventSource{Component: "kubelet"},
	}
	if _, err := cluster.client.CoreV1().Events(n).Create(t.Context(), ev, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	hasEvent(t, "default", "PersistentVolume", v.Name, kube.EventRecyclerPod, `Recycler pod: Pulling image "busybox"`)

	finishPod(t, p, corev1.PodFailed, 1)
	failed := pvPhase(t, v.Name, corev1.VolumeFailed)
	if !strings.HasPrefix(failed.Status.Message, "Recycle failed: recycler pod "+n+"/recycler-for-"+v.Name+" failed") {
		t.Errorf("status message %q", failed.Status.Message)
	}
	hasEvent(t, "default", "PersistentVolume", v.Name, kube.EventVolumeFailedRecycle, "Recycle failed: ")

	// The retry (after the backoff) runs a new pod; it succeeds.
	var next *corev1.Pod
	eventually(t, 30*time.Second, func() string {
		got, err := cluster.client.CoreV1().Pods(n).Get(t.Context(), p.Name, metav1.GetOptions{})
		if err != nil || got.UID == p.UID {
			return fmt.Sprintf("no new recycler pod yet (%v)", err)
		}
		next = got
		return ""
	})
	finishPod(t, next, corev1.PodSucceeded, 0)
	done := pvPhase(t, v.Name, corev1.VolumeAvailable)
	if done.Spec.ClaimRef != nil || done.Status.Message != "" {
		t.Errorf("recycled volume: claimRef %+v, message %q", done.Spec.ClaimRef, done.Status.Message)
	}
	hasEvent(t, "default", "PersistentVolume", v.Name, kube.EventVolumeRecycled, "Volume recycled")
	podGone(t, n, p.Name)
	waitReclaim(t, r.client, v.Name, reclaimerv1.State_STATE_SUCCEEDED)
}

// A Failed reclaim retried through the REST gateway at once, not after its
// (here hour-long) backoff; the errors are the ones the API promises.
func TestRecyclerPodRetryThroughTheGateway(t *testing.T) {
	n := recyclerNamespace(t)
	r := startReclaimer(t, "reclaimer-retry-"+n, reclaimer.Options{RecyclerNamespace: n, RetryIntervalStart: time.Hour, RetryIntervalMax: time.Hour})
	h, closeAll, err := gateway.NewHandler(context.Background(), gateway.Options{BinderAddress: cluster.binderAddr, ReclaimerAddress: r.addr, TLS: cluster.e2e.TLS("gateway"), Auth: gatewayAuth()})
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll()
	srv := httptest.NewServer(h)
	defer srv.Close()

	v := releasedNFS(t, n, n+"-pv", "1Gi")
	handOver(t, r.client, v)
	first := waitPod(t, n, v.Name)
	if code, body := post(t, srv.URL+"/v1/reclaims/"+v.Name+":retry"); code != http.StatusConflict || !strings.Contains(fmt.Sprint(body["message"]), "only a FAILED reclaim can be retried") {
		t.Errorf("retry of a running reclaim: %d %v", code, body)
	}
	finishPod(t, first, corev1.PodFailed, 1)
	pvPhase(t, v.Name, corev1.VolumeFailed)

	eventually(t, 30*time.Second, func() string {
		code, body := getJSON(t, srv.URL+"/v1/reclaims/"+v.Name)
		rec, _ := body["reclaim"].(map[string]any)
		if code != http.StatusOK || rec["state"] != "STATE_FAILED" || rec["nextAttemptTime"] == nil {
			return fmt.Sprintf("GET reclaim: %d %v", code, body)
		}
		return ""
	})
	if code, body := getJSON(t, srv.URL+"/v1/reclaims?state=STATE_FAILED"); code != http.StatusOK || !strings.Contains(fmt.Sprint(body["reclaims"]), v.Name) {
		t.Errorf("list of FAILED reclaims: %d %v", code, body)
	}
	code, body := post(t, srv.URL+"/v1/reclaims/"+v.Name+":retry")
	if rec, _ := body["reclaim"].(map[string]any); code != http.StatusOK || rec["state"] != "STATE_PENDING" {
		t.Fatalf("retry: %d %v", code, body)
	}
	eventually(t, 30*time.Second, func() string {
		got, err := cluster.client.CoreV1().Pods(n).Get(t.Context(), first.Name, metav1.GetOptions{})
		if err != nil || got.UID == first.UID {
			return fmt.Sprintf("no new recycler pod after the retry (%v)", err)
		}
		finishPod(t, got, corev1.PodSucceeded, 0)
		return ""
	})
	pvPhase(t, v.Name, corev1.VolumeAvailable)

	// Nothing to retry and no volume to decide from: the state forbids it.
	if code, body := post(t, srv.URL+"/v1/reclaims/nope:retry"); code != http.StatusConflict {
		t.Errorf("retry of an unknown reclaim: %d %v, want 409", code, body)
	}
	if code, body := getJSON(t, srv.URL+"/v1/reclaims/nope"); code != http.StatusNotFound {
		t.Errorf("unknown reclaim: %d %v", code, body)
	}
	if code, body := getJSON(t, srv.URL+"/v1/reclaims?state=STATE_BOGUS"); code != http.StatusBadRequest {
		t.Errorf("bad state: %d %v", code, body)
	}
}

func post(t *testing.T, url string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp := adminDo(t, req)
	defer resp.Body.Close()
	var m map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		t.Fatalf("POST %s: %d, not JSON: %v", url, resp.StatusCode, err)
	}
	return resp.StatusCode, m
}

// Two replicas asked for the same volume at once act once: one recycler
// pod, one VolumeRecycled, and both report the same owner.
func TestRecyclerPodTwoReplicasActOnce(t *testing.T) {
	n := recyclerNamespace(t)
	a := startReclaimer(t, "reclaimer-a-"+n, reclaimer.Options{RecyclerNamespace: n})
	b := startReclaimer(t, "reclaimer-b-"+n, reclaimer.Options{RecyclerNamespace: n})
	w, err := cluster.client.CoreV1().Pods(n).Watch(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	v := releasedNFS(t, n, n+"-pv", "1Gi")
	var wg sync.WaitGroup
	owners := make([]string, 2)
	for i, r := range []*testReclaimer{a, b} {
		wg.Go(func() { owners[i] = handOver(t, r.client, v).Owner })
	}
	wg.Wait()
	if owners[0] == "" || owners[0] != owners[1] {
		t.Fatalf("owners %q: want one, the same for both", owners)
	}
	p := waitPod(t, n, v.Name)
	finishPod(t, p, corev1.PodSucceeded, 0)
	pvPhase(t, v.Name, corev1.VolumeAvailable)

	added := 0
	for stop := time.After(2 * time.Second); ; {
		select {
		case e := <-w.ResultChan():
			if e.Type == watch.Added {
				added++
			}
			continue
		case <-stop:
		}
		break
	}
	if added != 1 {
		t.Errorf("%d recycler pods created, want 1", added)
	}
	list, err := cluster.client.CoreV1().Events("default").List(t.Context(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + v.Name + ",reason=" + kube.EventVolumeRecycled})
	if err != nil || len(list.Items) != 1 || list.Items[0].Count != 1 {
		t.Errorf("VolumeRecycled events: %+v %v", list, err)
	}
}

// A reclaimer that stops mid-reclaim leaves it in the journal; a restarted
// one takes it over and resumes: it watches the recycler pod the first one
// started instead of starting another.
func TestRecyclerPodRestartedReclaimerResumes(t *testing.T) {
	n := recyclerNamespace(t)
	first := startReclaimer(t, "reclaimer-first-"+n, reclaimer.Options{RecyclerNamespace: n})
	v := releasedNFS(t, n, n+"-pv", "1Gi")
	handOver(t, first.client, v)
	p := waitPod(t, n, v.Name)
	waitReclaim(t, first.client, v.Name, reclaimerv1.State_STATE_RUNNING)
	first.stop()

	second := startReclaimer(t, "reclaimer-second-"+n, reclaimer.Options{RecyclerNamespace: n, TakeoverPeriod: 500 * time.Millisecond})
	eventually(t, 30*time.Second, func() string {
		resp, err := second.client.GetReclaim(t.Context(), &reclaimerv1.GetReclaimRequest{VolumeName: v.Name})
		if err != nil {
			return err.Error()
		}
		if r := resp.Reclaim; r.Owner != "reclaimer-second-"+n || r.RecyclerPodUid != string(p.UID) {
			return fmt.Sprintf("not taken over: %v", r)
		}
		return ""
	})
	finishPod(t, p, corev1.PodSucceeded, 0)
	pvPhase(t, v.Name, corev1.VolumeAvailable)
	podGone(t, n, p.Name)
	waitReclaim(t, second.client, v.Name, reclaimerv1.State_STATE_SUCCEEDED)
}
