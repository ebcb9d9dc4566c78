package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// claimEvery is how often the load of testFaults creates a claim and its
// pod.
const claimEvery = 4 * time.Second

// minFaultTime is the least time a fault's phase lasts, so that claims
// are created while each fault is on.
const minFaultTime = 10 * time.Second

// load creates, every claimEvery, a claim of the WaitForFirstConsumer
// class and a pod that writes its name on it, labelled with the fault in
// progress.
type load struct {
	ns string

	mu      sync.Mutex
	phase   string
	created map[string]string // workload name -> phase
	errs    []string
}

func (l *load) setPhase(p string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.phase = p
}

func (l *load) run(ctx context.Context) {
	tick := time.NewTicker(claimEvery)
	defer tick.Stop()
	for i := 0; ; i++ {
		l.mu.Lock()
		phase := l.phase
		l.mu.Unlock()
		name := fmt.Sprintf("w-%03d", i)
		if err := l.create(ctx, name, phase); err != nil {
			if ctx.Err() != nil {
				return
			}
			l.mu.Lock()
			l.errs = append(l.errs, fmt.Sprintf("%s (%s): %v", name, phase, err))
			l.mu.Unlock()
		} else {
			l.mu.Lock()
			l.created[name] = phase
			l.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (l *load) create(ctx context.Context, name, phase string) error {
	labels := map[string]string{"app": "fault-load", "fault": nonLabel.ReplaceAllString(phase, "-")}
	claim := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: ptrTo(classWFFC),
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}},
		},
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptrTo[int64](2),
			AutomountServiceAccountToken:  ptrTo(false),
			Containers: []corev1.Container{{
				Name: "workload", Image: c.WorkloadImage, ImagePullPolicy: corev1.PullNever,
				Args:         []string{"hold", "-write", "/data/f=" + name},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
			}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: name}}}},
		},
	}
	// The API server stays up through every fault: one retry covers a
	// blip.
	var err error
	for range 3 {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err = c.Client.CoreV1().PersistentVolumeClaims(l.ns).Create(ctx, claim, metav1.CreateOptions{})
		cancel()
		if err == nil || strings.Contains(err.Error(), "already exists") {
			break
		}
	}
	if err != nil && !strings.Contains(err.Error(), "already exists") {
		return err
	}
	for range 3 {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err = c.Client.CoreV1().Pods(l.ns).Create(ctx, pod, metav1.CreateOptions{})
		cancel()
		if err == nil || strings.Contains(err.Error(), "already exists") {
			return nil
		}
	}
	return err
}

// fault is one fault of testFaults: do starts it, and the fault is over
// when volplane's pods and the node are all Ready again.
type fault struct {
	name string
	do   func(t *testing.T)
}

// deletePods deletes volplane pods, one of each app given (the first by
// name; the driver's controller, driverController, is the driver's pod
// whose sidecar holds the leader lock: the one volplane's provisioners
// call), and waits until other pods have replaced them.
func deletePods(apps ...string) func(t *testing.T) {
	return func(t *testing.T) {
		var deleted []*corev1.Pod
		for _, app := range apps {
			deleted = append(deleted, victim(t, app))
		}
		for _, p := range deleted {
			c.Kubectl(t, "delete", "pod", "-n", p.Namespace, "--wait=false", p.Name)
		}
		waitFor(t, 3*time.Minute, func() string {
			for _, d := range deleted {
				p, err := c.Client.CoreV1().Pods(d.Namespace).Get(t.Context(), d.Name, metav1.GetOptions{})
				if err == nil && p.UID == d.UID {
					return "pod " + p.Name + " is still there"
				}
			}
			return ""
		})
	}
}

// victim is the pod of app that a fault deletes: the first by name, but
// for the driver's controller the leader, named by the holder of
// csi-provisioner's leader lock, which volplane-csi-sidecar takes.
func victim(t *testing.T, app string) *corev1.Pod {
	ns, leader := volplaneNS, ""
	if app == driverController {
		ns = driverNS
		waitFor(t, 2*time.Minute, func() string { return driverLeaderNotReady(t) })
		leader = driverLeader(t)
	}
	pods, err := c.Client.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) == 0 {
		t.Fatalf("no pod of %s", app)
	}
	sort.Slice(pods.Items, func(i, j int) bool { return pods.Items[i].Name < pods.Items[j].Name })
	for i := range pods.Items {
		if pods.Items[i].Name == leader {
			return &pods.Items[i]
		}
	}
	if app == driverController {
		t.Fatalf("no pod of %s holds the leader lock %s (holder %q)", app, driverLock, leader)
	}
	return &pods.Items[0]
}

// driverLeader is the holder of the driver's leader lock ("" for none).
func driverLeader(t testing.TB) string {
	t.Helper()
	lease, err := c.Client.CoordinationV1().Leases(driverNS).Get(t.Context(), driverLock, metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil {
		return ""
	}
	return *lease.Spec.HolderIdentity
}

// driverLeaderNotReady says why the driver's leader lock is not held by
// a Ready pod of its controller ("" when it is): after its leader pod
// goes, the other pod's sidecar takes the lock within the lock's lease.
func driverLeaderNotReady(t testing.TB) string {
	leader := driverLeader(t)
	for _, p := range listPods(t, driverNS, "app="+driverController) {
		if p.Name == leader && p.Ready {
			return ""
		}
	}
	return fmt.Sprintf("the driver's leader lock %s/%s is held by %q, not a Ready pod of %s", driverNS, driverLock, leader, driverController)
}

// restartHost restarts a host process of the cluster (hack/cluster/restart.sh).
func restartHost(name string) func(t *testing.T) {
	return func(t *testing.T) {
		cmd := exec.CommandContext(t.Context(), filepath.Join(repoRoot(t), "hack/cluster/restart.sh"), name)
		cmd.Env = append(cmd.Environ(), "VOLPLANE_CLUSTER_DIR="+clusterDir())
		out, err := cmd.CombinedOutput()
		t.Logf("hack/cluster/restart.sh %s:\n%s", name, out)
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, 3*time.Minute, func() string {
			out, err := c.Run(t.Context(), "", "get", "nodes", "-o", `jsonpath={.items[*].status.conditions[?(@.type=="Ready")].status}`)
			if err != nil || out != "True" {
				return fmt.Sprintf("node Ready: %q %v", out, err)
			}
			return ""
		})
	}
}

// testFaults: while claims are created and pods write, delete each
// volplane pod kind one at a time, and the driver's controller pod whose
// sidecar volplane calls, then two at once (a provisioner and the
// driver's pod together, as when the driver ran in the provisioner's
// pod), and restart the kubelet and the runtime; afterwards every claim created meanwhile is
// Bound, every pod reads its data back, no backing volume is left without
// a PV or a journal record, no claim or volume is bound twice.
func testFaults(t *testing.T) {
	requireVolplaneReady(t)
	ns := c.Namespace(t)
	l := &load{ns: ns, phase: "before", created: map[string]string{}}
	ctx, stop := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); l.run(ctx) }()
	defer func() { stop(); <-done }()

	faults := []fault{
		{"binder", deletePods("volplane-binder")},
		{"provisioner", deletePods("volplane-provisioner")},
		{"reclaimer", deletePods("volplane-reclaimer")},
		{"watcher", deletePods("volplane-watcher")},
		{"gateway", deletePods("volplane-gateway")},
		{"etcd member", deletePods("volplane-etcd")},
		{"driver leader pod", deletePods(driverController)},
		{"binder+provisioner", deletePods("volplane-binder", "volplane-provisioner")},
		{"provisioner+driver leader pod", deletePods("volplane-provisioner", driverController)},
		{"etcd+watcher", deletePods("volplane-etcd", "volplane-watcher")},
		{"kubelet restart", restartHost("kubelet")},
		{"containerd restart", restartHost("containerd")},
	}
	recovery := map[string]time.Duration{}
	time.Sleep(minFaultTime) // claims made before any fault: the baseline
	for _, f := range faults {
		l.setPhase(f.name)
		start := time.Now()
		f.do(t)
		requireVolplaneReady(t)
		recovery[f.name] = time.Since(start)
		t.Logf("fault %s: volplane Ready again after %v", f.name, recovery[f.name].Round(time.Second))
		if d := minFaultTime - time.Since(start); d > 0 {
			time.Sleep(d)
		}
	}
	l.setPhase("after")
	time.Sleep(minFaultTime)
	stop()
	<-done
	l.mu.Lock()
	created, errs := l.created, l.errs
	l.mu.Unlock()
	for _, e := range errs {
		t.Errorf("creating a claim or pod: %s", e)
	}

	// Every claim binds and every pod starts.
	start := time.Now()
	waitFor(t, 5*time.Minute, func() string {
		var pending []string
		for _, p := range listPods(t, ns, "app=fault-load") {
			if !p.Ready {
				pending = append(pending, p.Name)
			}
		}
		if n := len(listPods(t, ns, "app=fault-load")); n != len(created) {
			return fmt.Sprintf("%d pods of %d", n, len(created))
		}
		if len(pending) > 0 {
			return fmt.Sprintf("%d pods not Ready: %v", len(pending), pending)
		}
		return ""
	})
	t.Logf("every pod Ready %v after the last fault's phase", time.Since(start).Round(time.Second))

	claims, err := c.Client.CoreV1().PersistentVolumeClaims(ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pvs, err := c.Client.CoreV1().PersistentVolumes().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// No claim bound twice, no volume bound to two claims.
	byVolume := map[string]string{}
	bound := map[string]bool{}
	for _, cl := range claims.Items {
		if cl.Status.Phase != corev1.ClaimBound {
			continue
		}
		if other, ok := byVolume[cl.Spec.VolumeName]; ok {
			t.Errorf("volume %s is bound to claims %s and %s", cl.Spec.VolumeName, other, cl.Name)
		}
		byVolume[cl.Spec.VolumeName] = cl.Name
		bound[cl.Name] = true
	}
	claimsOf := map[string][]string{}
	for _, pv := range pvs.Items {
		if ref := pv.Spec.ClaimRef; ref != nil && ref.Namespace == ns {
			claimsOf[ref.Name] = append(claimsOf[ref.Name], pv.Name)
			for _, cl := range claims.Items {
				if cl.Name == ref.Name && ref.UID != "" && ref.UID != cl.UID {
					t.Errorf("volume %s points to claim %s of another UID", pv.Name, ref.Name)
				}
			}
		}
	}
	for claim, vols := range claimsOf {
		if len(vols) > 1 {
			t.Errorf("claim %s has %d volumes pointing to it: %v", claim, len(vols), vols)
		}
	}

	// Every pod reads its own data back.
	dataOK := map[string]bool{}
	for name := range created {
		out, err := c.Run(t.Context(), "", "exec", "-n", ns, name, "--", "volplane-workload", "cat", "/data/f")
		if err == nil && out == name {
			dataOK[name] = true
		} else {
			t.Errorf("pod %s reads %q, %v; want its name", name, out, err)
		}
	}

	// No backing volume without a PV or a journal record: wait for the
	// operations in flight to end, then every volume directory on the node
	// is a PV's.
	g := gateway(t)
	waitFor(t, 2*time.Minute, func() string {
		handles := volumeHandles(t)
		var orphans []string
		for v := range backingVolumes(t) {
			if _, ok := handles[v]; !ok {
				orphans = append(orphans, v)
			}
		}
		if len(orphans) > 0 {
			ops, _ := g.Plugin(t.Context(), "operations")
			return fmt.Sprintf("backing volumes without a PV: %v; operations in flight:\n%s", orphans, ops)
		}
		return ""
	})
	orphans := g.waitPlugin(t, "orphans", "-o", "json")
	var o struct {
		Orphans []json.RawMessage `json:"orphans"`
	}
	if err := json.Unmarshal([]byte(orphans), &o); err != nil {
		t.Errorf("kubectl volplane orphans -o json: %v: %s", err, orphans)
	} else if len(o.Orphans) > 0 {
		t.Errorf("the provisioner reports orphans: %s", orphans)
	}

	rows := [][]string{{"FAULT", "CLAIMS CREATED", "BOUND", "DATA OK", "VOLPLANE READY AFTER"}}
	for _, phase := range append(append([]string{"before"}, faultNames(faults)...), "after") {
		var n, b, d int
		for name, p := range created {
			if p != phase {
				continue
			}
			n++
			if bound[name] {
				b++
			}
			if dataOK[name] {
				d++
			}
		}
		rec := "-"
		if r, ok := recovery[phase]; ok {
			rec = r.Round(time.Second).String()
		}
		rows = append(rows, []string{phase, fmt.Sprint(n), fmt.Sprint(b), fmt.Sprint(d), rec})
	}
	t.Logf("faults with workloads running (a claim and a pod every %v):\n%s"+
		"orphans: none (%d backing volumes on the node, each a PV's); no claim or volume bound twice",
		claimEvery, table(rows), len(backingVolumes(t)))
}

func faultNames(fs []fault) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.name)
	}
	return out
}

func ptrTo[T any](v T) *T { return &v }

// nonLabel is what a label value may not hold.
var nonLabel = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)
