package cluster

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// outOfService is the taint Kubernetes documents for a non-graceful node
// shutdown: the node's pods are deleted at once, force-deleted by the pod
// garbage collector, and their volumes detached, so that a StatefulSet's
// pods are made again elsewhere.
const outOfService = "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"

// The phases of the load while a node is killed: the claims created in
// each are counted apart.
const (
	phaseBefore   = "before"
	phaseKilled   = "node killed, not yet NotReady"
	phaseTainted  = "NotReady, out-of-service taint"
	phaseNodeBack = "node back"
)

// nodeScript runs hack/cluster/node.sh action node (stop: a power loss;
// start: the power back).
func nodeScript(t *testing.T, action, node string) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), filepath.Join(repoRoot(t), "hack/cluster/node.sh"), action, node)
	cmd.Env = append(cmd.Environ(), "VOLPLANE_CLUSTER_DIR="+clusterDir())
	out, err := cmd.CombinedOutput()
	t.Logf("hack/cluster/node.sh %s %s:\n%s", action, node, out)
	if err != nil {
		t.Fatalf("hack/cluster/node.sh %s %s: %v", action, node, err)
	}
}

// bindClock samples the claims and pods of ns every half second and keeps
// when each claim was first seen Bound and which pods were seen Ready
// (they wrote their data).
type bindClock struct {
	mu    sync.Mutex
	bound map[string]time.Time
	ran   map[string]bool
}

func watchBinds(ctx context.Context, ns string) *bindClock {
	b := &bindClock{bound: map[string]time.Time{}, ran: map[string]bool{}}
	go func() {
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			claims, err := c.Client.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{})
			now := time.Now()
			if err == nil {
				b.mu.Lock()
				for _, cl := range claims.Items {
					if _, ok := b.bound[cl.Name]; !ok && cl.Status.Phase == corev1.ClaimBound {
						b.bound[cl.Name] = now
					}
				}
				b.mu.Unlock()
			}
			pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			if err == nil {
				b.mu.Lock()
				for _, p := range pods.Items {
					for _, cond := range p.Status.Conditions {
						if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
							b.ran[p.Name] = true
						}
					}
				}
				b.mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return b
}

// firstBound is the earliest time a claim of phase was seen Bound (zero
// for none).
func (b *bindClock) firstBound(l *load, phase string) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	var first time.Time
	for name, p := range l.created {
		if at, ok := b.bound[name]; ok && p == phase && (first.IsZero() || at.Before(first)) {
			first = at
		}
	}
	return first
}

// eventsSince are the reasons and messages of the Events of the objects
// called name in ns last seen at or after since, one a line.
func eventsSince(t *testing.T, ns, name string, since time.Time) string {
	list, err := c.Client.CoreV1().Events(ns).List(t.Context(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, e := range list.Items {
		last := e.LastTimestamp.Time
		if e.EventTime.After(last) {
			last = e.EventTime.Time
		}
		if !last.Before(since.Truncate(time.Second)) {
			lines = append(lines, fmt.Sprintf("%s %s: %s", e.InvolvedObject.Kind, e.Reason, e.Message))
		}
	}
	sort.Strings(lines)
	return strings.Join(slices.Compact(lines), "\n")
}

// killVictim picks the node to kill: one holding an etcd member, not the
// one running kube-controller-manager's static pod (without it nothing
// would notice the node is gone), with the most of volplane's pods (ties
// by name).
func killVictim(t *testing.T, names []string) string {
	kcm := ""
	pods, err := c.Client.CoreV1().Pods("kube-system").List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if strings.HasPrefix(p.Name, "kube-controller-manager-") {
			kcm = p.Spec.NodeName
		}
	}
	count := map[string]int{}
	for app := range standaloneReplicas {
		for _, n := range podNodes(t, app) {
			count[n]++
		}
	}
	etcd := podNodes(t, "volplane-etcd")
	var candidates []string
	for _, n := range names {
		if n != kcm && slices.Contains(etcd, n) {
			candidates = append(candidates, n)
		}
	}
	if len(candidates) == 0 {
		t.Fatalf("no node with an etcd member but %s (kube-controller-manager's): etcd's members are on %v", kcm, etcd)
	}
	sort.SliceStable(candidates, func(i, j int) bool { return count[candidates[i]] > count[candidates[j]] })
	t.Logf("volplane's pods per node %v, etcd's members on %v, kube-controller-manager on %s: kill %s",
		count, etcd, kcm, candidates[0])
	return candidates[0]
}

// nodeIsReady says whether node's Ready condition is want ("" when it
// is).
func nodeIsReady(t *testing.T, node string, want bool) string {
	n, err := c.Client.CoreV1().Nodes().Get(t.Context(), node, metav1.GetOptions{})
	if err != nil {
		return err.Error()
	}
	if nodeReady(*n) != want {
		return fmt.Sprintf("node %s Ready=%v, want %v", node, !want, want)
	}
	return ""
}

// podsOn are the pods of ns bound to node, terminating ones included,
// finished ones (a Job's that has run) not.
func podsOn(t *testing.T, ns, node string) []string {
	pods, err := c.Client.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue // a Job's pod that has run (the etcd backup's): nothing on the node to move
		}
		out = append(out, p.Name)
	}
	sort.Strings(out)
	return out
}

// boundVolumes maps each Bound claim of ns to its PV.
func boundVolumes(t *testing.T, ns string) map[string]string {
	claims, err := c.Client.CoreV1().PersistentVolumeClaims(ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, cl := range claims.Items {
		if cl.Status.Phase == corev1.ClaimBound {
			out[cl.Name] = cl.Spec.VolumeName
		}
	}
	return out
}

// waitingOn are the claims of ns not Bound whose selected node is node,
// with the first's Events and its pod's since since.
func waitingOn(t *testing.T, ns, node string, since time.Time) (names []string, events string) {
	claims, err := c.Client.CoreV1().PersistentVolumeClaims(ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cl := range claims.Items {
		if cl.Status.Phase != corev1.ClaimBound && cl.Annotations["volume.kubernetes.io/selected-node"] == node {
			names = append(names, cl.Name)
		}
	}
	sort.Strings(names)
	if len(names) > 0 {
		events = eventsSince(t, ns, names[0], since)
	}
	return names, events
}

// pendingPods are the pods of ns matching selector that no node holds,
// with the Events of the first since since.
func pendingPods(t *testing.T, ns, selector string, since time.Time) (names []string, events string) {
	pods, err := c.Client.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && p.Spec.NodeName == "" {
			names = append(names, p.Name)
		}
	}
	sort.Strings(names)
	if len(names) > 0 {
		events = eventsSince(t, ns, names[0], since)
	}
	return names, events
}

// etcdJoinLines are the lines of the etcd member now on node that say how
// it started and joined.
func etcdJoinLines(t *testing.T, node string) string {
	pods, err := c.Client.CoreV1().Pods(volplaneNS).List(t.Context(), metav1.ListOptions{
		LabelSelector: "app=volplane-etcd", FieldSelector: "spec.nodeName=" + node})
	if err != nil || len(pods.Items) != 1 {
		return fmt.Sprintf("no one etcd member on %s: %d pods, %v", node, len(pods.Items), err)
	}
	out, err := c.Run(t.Context(), "", "logs", "-n", volplaneNS, pods.Items[0].Name)
	if err != nil {
		return err.Error()
	}
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		for _, s := range []string{"msg=starting", `"msg":"starting"`, "former self", "as a learner", "promoted", "etcd member ready"} {
			if strings.Contains(l, s) {
				lines = append(lines, l)
				break
			}
		}
	}
	return pods.Items[0].Name + ":\n" + strings.Join(lines, "\n")
}

// testKillNode is TestMultiNode's "kill a node": while the load of
// testFaults creates a claim and a pod every claimEvery, and once one of
// its pods runs there, a node holding an etcd member and volplane's
// replicas (and, one node a zone, a whole zone) loses its power
// (hack/cluster/node.sh stop: its link down, its kubelet, kube-proxy,
// containerd, shims and pods SIGKILLed). Once the node is NotReady it gets
// the out-of-service taint, as Kubernetes documents for a non-graceful
// shutdown: its pods are force-deleted, volplane's are made again on the
// other nodes where the spread allows (etcd stays at two members, a
// quorum: its third has no other node), and claims keep binding on the
// other nodes; claims and pods that need the dead node's volumes wait,
// and their Events are logged. Then the node comes back (node.sh start,
// the taint removed): volplane is whole again (the etcd member on an
// empty data directory rejoins), every claim is Bound (the spread
// StatefulSet's in spreadNS to the volumes they had), the StatefulSet
// reads its data back, and every load pod reads its own data (those the
// taint deleted made again on their volumes). A table gives each phase's
// claims and how soon the first was bound.
func testKillNode(t *testing.T, names []string, spreadNS string) {
	victim := killVictim(t, names)
	spreadBefore := boundVolumes(t, spreadNS)
	ns := c.Namespace(t)
	l := &load{ns: ns, phase: phaseBefore, created: map[string]string{}}
	ctx, stop := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); l.run(ctx) }()
	defer func() { stop(); <-done }()
	clock := watchBinds(ctx, ns)
	off := false
	t.Cleanup(func() {
		if off {
			t.Logf("the test ends with %s off: powering it on", victim)
			cmd := exec.Command(filepath.Join(repoRoot(t), "hack/cluster/node.sh"), "start", victim)
			cmd.Env = append(cmd.Environ(), "VOLPLANE_CLUSTER_DIR="+clusterDir())
			out, err := cmd.CombinedOutput()
			t.Logf("hack/cluster/node.sh start %s: %v\n%s", victim, err, out)
			c.Run(context.Background(), "", "taint", "node", victim, outOfService+"-")
		}
	})
	// Before the kill, a pod of the load runs on the victim: its claim's
	// volume is there, and the taint will delete it.
	waitFor(t, 2*time.Minute, func() string {
		pods, err := c.Client.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{FieldSelector: "spec.nodeName=" + victim})
		if err != nil {
			return err.Error()
		}
		for _, p := range pods.Items {
			for _, cond := range p.Status.Conditions {
				if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
					return ""
				}
			}
		}
		return "no pod of the load Ready on " + victim + " yet"
	})

	phaseStart := map[string]time.Time{}
	setPhase := func(p string) {
		phaseStart[p] = time.Now()
		l.setPhase(p)
	}
	setPhase(phaseKilled)
	killAt := time.Now()
	off = true
	nodeScript(t, "stop", victim)
	waitFor(t, 3*time.Minute, func() string { return nodeIsReady(t, victim, false) })
	notReady := time.Since(killAt)
	t.Logf("%s NotReady %v after the kill", victim, notReady.Round(time.Second))

	setPhase(phaseTainted)
	c.Kubectl(t, "taint", "node", victim, outOfService)
	want := maps(standaloneReplicas, "volplane-etcd", 2)
	waitFor(t, 3*time.Minute, func() string {
		for _, n := range []string{volplaneNS, ns} {
			if on := podsOn(t, n, victim); len(on) > 0 {
				return fmt.Sprintf("pods of %s still on %s: %v", n, victim, on)
			}
		}
		return readyCounts(t, want)
	})
	replaced := time.Since(killAt)
	t.Logf("volplane's and the load's pods on %s deleted, volplane's made again elsewhere %v after the kill: kubectl get pods -n %s -o wide:\n%s",
		victim, replaced.Round(time.Second), volplaneNS, c.Kubectl(t, "get", "pods", "-n", volplaneNS, "-o", "wide"))
	// etcd keeps a quorum: each remaining member's /readyz (etcd's, with
	// its linearizable read) answers ok.
	for _, p := range readyPods(t, "volplane-etcd") {
		code, body, err := httpGet(t.Context(), "http://"+p.IP+":2381/readyz?verbose")
		if err != nil {
			t.Logf("etcd member %s's /readyz not reached from the host: %v", p.Name, err)
			continue
		}
		if code != 200 {
			t.Errorf("etcd member %s's /readyz after the kill: %d\n%s", p.Name, code, body)
			continue
		}
		t.Logf("etcd member %s's /readyz?verbose, %s dead:\n%s", p.Name, victim, strings.TrimSpace(body))
	}
	if pending, events := pendingPods(t, volplaneNS, "", killAt); len(pending) > 0 {
		t.Logf("volplane's pods without a node (the spread's required anti-affinity): %v; %s's Events since the kill:\n%s", pending, pending[0], events)
	}
	// Claims keep binding: one created since the taint is Bound.
	waitFor(t, 2*time.Minute, func() string {
		if clock.firstBound(l, phaseTainted).IsZero() {
			return "no claim created since the taint is Bound"
		}
		return ""
	})
	// What waits for the dead node: the spread StatefulSet's pods whose
	// volumes are there, the load's claims the scheduler sent there
	// before it was NotReady.
	var pending []string
	var events string
	waitFor(t, time.Minute, func() string {
		pending, events = pendingPods(t, spreadNS, "app=spread", killAt)
		if len(pending) == 0 || !strings.Contains(events, "FailedScheduling") {
			return fmt.Sprintf("no pod of the spread StatefulSet waits for %s with a FailedScheduling Event: %v %s", victim, pending, events)
		}
		return ""
	})
	t.Logf("the spread StatefulSet's pods waiting for %s (their volumes are there): %v; %s's Events since the kill:\n%s",
		victim, pending, pending[0], events)
	claim := "data-" + pending[0]
	t.Logf("claim %s's Events since the kill (Bound, its volume on %s): %q", claim, victim, eventsSince(t, spreadNS, claim, killAt))
	selected, why := claimForDeadNode(t, ns, victim, killAt)
	t.Logf("claim %s, its selected node %s dead, waits: %s", selected, victim, why)
	if waiting, events := waitingOn(t, ns, victim, killAt); len(waiting) > 0 {
		t.Logf("the load's claims not Bound whose selected node is %s: %v; the Events of %s and its pod since the kill:\n%s",
			victim, waiting, waiting[0], events)
	} else {
		t.Logf("no claim of the load waits for %s", victim)
	}

	setPhase(phaseNodeBack)
	nodeScript(t, "start", victim)
	off = false
	c.Kubectl(t, "taint", "node", victim, outOfService+"-")
	waitFor(t, 3*time.Minute, func() string { return nodeIsReady(t, victim, true) })
	ready := time.Since(phaseStart[phaseNodeBack])
	waitFor(t, 5*time.Minute, func() string { return notReadyIn(t, volplaneNS, standaloneReplicas) })
	whole := time.Since(phaseStart[phaseNodeBack])
	t.Logf("%s Ready %v after its start, volplane whole after %v: kubectl get pods -n %s -o wide:\n%s", victim,
		ready.Round(time.Second), whole.Round(time.Second), volplaneNS, c.Kubectl(t, "get", "pods", "-n", volplaneNS, "-o", "wide"))
	t.Logf("the etcd member back on %s:\n%s", victim, etcdJoinLines(t, victim))
	readSpread(t, spreadNS)
	for claim, pv := range spreadBefore {
		if got := boundVolumes(t, spreadNS)[claim]; got != pv {
			t.Errorf("claim %s of the spread StatefulSet: Bound to %q after the node's return, %q before the kill", claim, got, pv)
		}
	}
	if pv := waitClaimBound(t, ns, selected, 5*time.Minute); pv != "" {
		t.Logf("claim %s, whose selected node is back, Bound to %s", selected, pv)
	}
	// The load runs on until a claim of this phase is Bound.
	waitFor(t, 2*time.Minute, func() string {
		if clock.firstBound(l, phaseNodeBack).IsZero() {
			return "no claim created since the node's return is Bound"
		}
		return ""
	})
	stop()
	<-done
	checkLoadAfterKill(t, l, clock, victim, killAt, phaseStart)
}

// checkLoadAfterKill waits until every claim of the load is Bound, makes
// again the pods the taint deleted, checks that every pod reads its own
// data, and logs the table of the phases.
func checkLoadAfterKill(t *testing.T, l *load, clock *bindClock, victim string, killAt time.Time, phaseStart map[string]time.Time) {
	l.mu.Lock()
	created, errs := l.created, l.errs
	l.mu.Unlock()
	for _, e := range errs {
		t.Errorf("creating a claim or pod: %s", e)
	}
	// The pods the taint deleted (they were on the dead node) are made
	// again first: a claim whose selected node was the dead one may wait
	// for a consumer again. One whose first self ran must find the data
	// it wrote; one that never ran writes "NAME again".
	clock.mu.Lock()
	ran := map[string]bool{}
	for p := range clock.ran {
		ran[p] = true
	}
	clock.mu.Unlock()
	var again []string
	for name := range created {
		if _, err := c.Client.CoreV1().Pods(l.ns).Get(t.Context(), name, metav1.GetOptions{}); err == nil {
			continue
		}
		again = append(again, name)
		c.Apply(t, l.ns, loadPod(name, name+" again"))
	}
	sort.Strings(again)
	t.Logf("the load's pods the taint deleted, made again: %v", again)
	if len(again) == 0 {
		t.Errorf("no pod of the load was deleted by the taint: one ran on %s before the kill", victim)
	}
	waitFor(t, 3*time.Minute, func() string {
		bound := boundVolumes(t, l.ns)
		var pending []string
		for name := range created {
			if _, ok := bound[name]; !ok {
				pending = append(pending, name)
			}
		}
		sort.Strings(pending)
		if len(pending) > 0 {
			return fmt.Sprintf("claims not Bound: %v", pending)
		}
		return ""
	})
	dataOK := map[string]bool{}
	for name := range created {
		c.WaitPodReady(t, l.ns, name, 3*time.Minute)
		out, err := c.Run(t.Context(), "", "exec", "-n", l.ns, name, "--", "volplane-workload", "cat", "/data/f")
		switch {
		case err == nil && out == name:
			dataOK[name] = true
		case err == nil && out == name+" again" && !ran[name]:
			dataOK[name] = true // its first pod never ran: nothing to lose
		default:
			t.Errorf("pod %s reads %q, %v; want %q (its first pod ran: %v)", name, out, err, name, ran[name])
		}
	}
	rows := [][]string{{"FAULT: KILL " + victim, "CLAIMS CREATED", "BOUND", "DATA READ BACK", "FIRST BOUND AFTER"}}
	bound := boundVolumes(t, l.ns)
	var total [3]int // since the kill: created, bound, read back
	for _, phase := range []string{phaseBefore, phaseKilled, phaseTainted, phaseNodeBack} {
		var n, b, d int
		for name, p := range created {
			if p != phase {
				continue
			}
			n++
			if _, ok := bound[name]; ok {
				b++
			}
			if dataOK[name] {
				d++
			}
		}
		first := "-"
		if start, ok := phaseStart[phase]; ok {
			if f := clock.firstBound(l, phase); !f.IsZero() {
				first = f.Sub(start).Round(100*time.Millisecond).String() + " (phase start)"
			}
		}
		rows = append(rows, []string{phase, fmt.Sprint(n), fmt.Sprint(b), fmt.Sprint(d), first})
		if phase != phaseBefore {
			total[0] += n
			total[1] += b
			total[2] += d
		}
	}
	served := "never"
	var first time.Time
	for _, p := range []string{phaseKilled, phaseTainted, phaseNodeBack} {
		if f := clock.firstBound(l, p); !f.IsZero() && (first.IsZero() || f.Before(first)) {
			first = f
		}
	}
	if !first.IsZero() {
		served = first.Sub(killAt).Round(100 * time.Millisecond).String()
	}
	rows = append(rows, []string{"all since the kill", fmt.Sprint(total[0]), fmt.Sprint(total[1]), fmt.Sprint(total[2]), served + " (the kill)"})
	t.Logf("a node killed with claims in flight (a claim and a pod every %v); volplane served again (the first claim created since the kill Bound) %s after the kill:\n%s",
		claimEvery, served, table(rows))
}

// loadPod is the load's pod name on its claim, writing text unless its
// file is there.
func loadPod(name, text string) string {
	return fmt.Sprintf(`
apiVersion: v1
kind: Pod
metadata: {name: %[1]s, labels: {app: fault-load}}
spec:
  terminationGracePeriodSeconds: 2
  automountServiceAccountToken: false
  containers:
    - name: workload
      image: %[2]s
      imagePullPolicy: Never
      args: [hold, -write, %[3]q]
      volumeMounts: [{name: data, mountPath: /data}]
  volumes: [{name: data, persistentVolumeClaim: {claimName: %[1]s}}]
`, name, c.WorkloadImage, "/data/f="+text)
}
