package cluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"iter"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volplane/volplane/test/harness/chaos"
)

const (
	// chaosConverge bounds the time from the end of the last fault until
	// every invariant of the storm holds.
	chaosConverge = 5 * time.Minute
	// chaosFaultEvery is the mean time between two faults (each wait
	// uniform in [½, 1½]× it).
	chaosFaultEvery = 10 * time.Second
	// chaosChurnEvery is how often the churn creates, deletes or
	// recreates a claim.
	chaosChurnEvery = 3 * time.Second
	// chaosMaxClaims is the most claims the churn keeps at once.
	chaosMaxClaims = 12
	// chaosDownMin and chaosDownMax bound how long a killed node stays
	// off.
	chaosDownMin, chaosDownMax = 15 * time.Second, 75 * time.Second
	// chaosSTS is the StatefulSet of the storm (spreadReplicas pods
	// spread over the nodes, each writing its name and a nonce).
	chaosSTS = "chaos"
	// chaosShort is the storm of TestMultiNode (make test-cluster-multi)
	// unless VOLPLANE_CHAOS_DURATION says otherwise.
	chaosShort = 75 * time.Second
)

// Rows of the storm's invariant table that the process-level chaos run
// (test/harness/chaos) has no name for.
const (
	invPVNoVolume    = "PVs whose CSI volume is gone"
	invReadBack      = "checksums read back"
	invUnreadable    = "data that could not be read (its pod not running)"
	invFaultsApplied = "faults"
)

// chaosSettings are the seeds and the storm's length, from
// VOLPLANE_CHAOS_SEEDS (space-separated; "1" unless set) and
// VOLPLANE_CHAOS_DURATION (chaosShort unless set), which make
// chaos-cluster sets from SEEDS (or SEED) and DURATION.
func chaosSettings(t *testing.T) ([]uint64, time.Duration) {
	seeds := []uint64{1}
	if s := strings.Fields(os.Getenv("VOLPLANE_CHAOS_SEEDS")); len(s) > 0 {
		seeds = nil
		for _, f := range s {
			n, err := strconv.ParseUint(f, 10, 64)
			if err != nil {
				t.Fatalf("VOLPLANE_CHAOS_SEEDS: %v", err)
			}
			seeds = append(seeds, n)
		}
	}
	d := chaosShort
	if s := os.Getenv("VOLPLANE_CHAOS_DURATION"); s != "" {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			t.Fatalf("VOLPLANE_CHAOS_DURATION: %v", err)
		}
	}
	return seeds, d
}

// testChaos is TestMultiNode's "chaos" (issue 37): one storm per seed
// (testStorm), then a table of the seeds.
func testChaos(t *testing.T, names []string) {
	seeds, d := chaosSettings(t)
	rows := [][]string{{"SEED", "DURATION", "FAULTS", "CLAIMS", "CHECKSUMS READ BACK", "CONVERGED AFTER", "VIOLATED INVARIANTS"}}
	for _, seed := range seeds {
		var s stormSummary
		t.Run(fmt.Sprintf("seed %d", seed), func(t *testing.T) { s = testStorm(t, names, seed, d) })
		rows = append(rows, []string{fmt.Sprint(seed), d.String(), fmt.Sprint(s.faults), fmt.Sprint(s.claims), s.readBack, s.converged, fmt.Sprint(s.violations)})
	}
	t.Logf("the storms in the cluster of %d nodes:\n%s", len(names), table(rows))
}

// stormSummary is one storm's line in testChaos's table.
type stormSummary struct {
	faults, claims, violations int
	readBack, converged        string
}

// storm is one seeded run of faults: its clock, its log and what it did.
type storm struct {
	t     *testing.T
	start time.Time
	rng   *rand.Rand
	names []string

	mu      sync.Mutex
	faults  map[string]int // kind: count
	failed  []string       // faults that could not be carried out
	nodeOff string         // the node off, "" for none
	lastEnd time.Time      // when the last fault ended
}

// ended notes that a fault has ended now.
func (s *storm) ended() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastEnd = time.Now()
}

// logf logs a line with the time since the storm began and the clock.
func (s *storm) logf(format string, args ...any) {
	now := time.Now()
	s.t.Logf("[%6.1fs %s] %s", now.Sub(s.start).Seconds(), now.UTC().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func (s *storm) count(kind string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults[kind]++
}

func (s *storm) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	s.logf("FAILED: %s", msg)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failed = append(s.failed, msg)
}

// testStorm runs one storm of seed for d: the StatefulSet chaosSTS
// writes its pods' names and a nonce, the churn (chaosChurn) creates,
// deletes and recreates claims with pods writing a payload whose
// checksum the test keeps, while faults picked by the seed strike every
// ~chaosFaultEvery: a volplane pod (or a node plugin's, which runs
// volplane-csi-sidecar) deleted with grace 0, an etcd member's pod
// deleted, kube-apiserver restarted (hack/cluster/restart.sh), or a node
// other than the first killed as by a power loss (hack/cluster/node.sh
// stop) and started again after chaosDownMin to chaosDownMax, given the
// out-of-service taint meanwhile when the seed says so and it went
// NotReady. A fault that could lose etcd's quorum for good waits: a node
// is killed, or an etcd member deleted, only while no node is off and
// all three members are Ready. After the last fault the storm waits up to
// chaosConverge for every invariant to hold, then prints the table.
func testStorm(t *testing.T, names []string, seed uint64, d time.Duration) stormSummary {
	ns := c.Namespace(t)
	nonce := randomSuffix()
	c.Apply(t, ns, spreadStatefulSet(chaosSTS, nonce))
	readIDs(t, ns, chaosSTS, nonce, spreadReplicas)
	waitFor(t, 5*time.Minute, func() string { return chaosWhole(t, names) })

	s := &storm{t: t, start: time.Now(), rng: rand.New(rand.NewPCG(seed, 37)), names: names, faults: map[string]int{}}
	s.lastEnd = s.start
	w := watchClaimVolumes(t.Context(), ns)
	ch := newChaosChurn(ns, rand.New(rand.NewPCG(seed, 5)), s)
	churnCtx, stopChurn := context.WithCancel(t.Context())
	churnDone := make(chan struct{})
	go func() { defer close(churnDone); ch.run(churnCtx) }()
	defer func() { stopChurn(); <-churnDone }()
	s.logf("storm of seed %d for %v: faults every ~%v, a claim created, deleted or recreated every %v", seed, d, chaosFaultEvery, chaosChurnEvery)

	var nodeDone sync.WaitGroup
	t.Cleanup(nodeDone.Wait) // a node off is powered on, even when the test fails
	end := s.start.Add(d)
	for {
		wait := time.Duration((0.5 + s.rng.Float64()) * float64(chaosFaultEvery))
		if time.Now().Add(wait).After(end) {
			break
		}
		select {
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		case <-time.After(wait):
		}
		s.fault(&nodeDone)
		s.ended()
	}
	s.logf("no new fault; waiting for the node off, if any, to be back")
	nodeDone.Wait()
	s.mu.Lock()
	lastFault := s.lastEnd
	s.mu.Unlock()
	s.logf("last fault over %v ago; stopping the churn", time.Since(lastFault).Round(100*time.Millisecond))
	stopChurn()
	<-churnDone
	s.logf("storm over: %s; churn: %s; waiting up to %v after the last fault for convergence", s.faultList(), ch.summary(), chaosConverge)

	converged, why := chaosConverged(t, names, ns, ch, lastFault)
	w.stop()
	res, readBack := chaosCheck(t, ns, nonce, ch, w)
	conv := chaos.Row{Invariant: chaos.InvConvergence, Info: converged.Round(100 * time.Millisecond).String()}
	if why != "" {
		conv.Count, conv.Info, conv.Examples = 1, "not within "+chaosConverge.String(), []string{why}
	}
	res.Rows = append(res.Rows, conv)
	s.mu.Lock()
	res.Rows = append(res.Rows, chaosRow(invFaultsApplied+" that could not be carried out", s.failed))
	s.mu.Unlock()
	var b strings.Builder
	res.Print(&b)
	t.Logf("chaos storm in the cluster of %d nodes, seed %d, %v: %s; %s\n\n%s\n%d violated invariant(s)",
		len(names), seed, d, s.faultList(), ch.summary(), b.String(), res.Violations())
	for _, f := range res.Failing() {
		t.Errorf("invariant violated: %s", f)
	}
	sum := stormSummary{claims: ch.total(), violations: res.Violations(), readBack: readBack, converged: conv.Info}
	s.mu.Lock()
	for _, n := range s.faults {
		sum.faults += n
	}
	s.mu.Unlock()
	return sum
}

// faultList is the storm's faults by kind, "N faults: kind xN, ...".
func (s *storm) faultList() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	kinds := make([]string, 0, len(s.faults))
	total := 0
	for k, n := range s.faults {
		kinds = append(kinds, fmt.Sprintf("%s x%d", k, n))
		total += n
	}
	sort.Strings(kinds)
	return fmt.Sprintf("%d faults: %s", total, strings.Join(kinds, ", "))
}

// fault picks one fault by the seed and strikes; a node's kill goes on
// in the background (nodeDone) while the storm continues.
func (s *storm) fault(nodeDone *sync.WaitGroup) {
	t := s.t
	r := s.rng.IntN(20)
	s.mu.Lock()
	off := s.nodeOff
	s.mu.Unlock()
	etcdWhole := off == "" && etcdReady(t) == 3
	switch {
	case r < 3 && etcdWhole:
		s.deleteEtcdMember()
	case r >= 3 && r < 7 && etcdWhole:
		var candidates []string
		kcm := kcmNode(t)
		for _, n := range s.names[1:] {
			if n != kcm {
				candidates = append(candidates, n)
			}
		}
		if len(candidates) == 0 {
			s.fail("no node to kill but the first and kube-controller-manager's (%s)", kcm)
			return
		}
		victim := candidates[s.rng.IntN(len(candidates))]
		down := chaosDownMin + time.Duration(s.rng.Int64N(int64(chaosDownMax-chaosDownMin)))
		taint := s.rng.IntN(2) == 0
		s.mu.Lock()
		s.nodeOff = victim
		s.mu.Unlock()
		nodeDone.Add(1)
		go func() {
			defer nodeDone.Done()
			s.killNode(victim, down, taint)
			s.mu.Lock()
			s.nodeOff, s.lastEnd = "", time.Now()
			s.mu.Unlock()
		}()
	case r >= 7 && r < 9:
		s.count("kube-apiserver restart")
		s.logf("fault: restart kube-apiserver (hack/cluster/restart.sh kube-apiserver)")
		if out, err := clusterScript(t.Context(), "restart.sh", "kube-apiserver"); err != nil {
			s.fail("restart.sh kube-apiserver: %v\n%s", err, out)
			return
		}
		s.logf("kube-apiserver restarted")
	default:
		// Also an etcd member's deletion or a node's kill while etcd is
		// not whole: either could cost it its quorum for good.
		s.deleteVolplanePod()
	}
}

// etcdReady is the number of etcd's Ready members (0 when the API does
// not answer).
func etcdReady(t *testing.T) int {
	list, err := c.Client.CoreV1().Pods(volplaneNS).List(t.Context(), metav1.ListOptions{LabelSelector: "app=volplane-etcd"})
	if err != nil {
		return 0
	}
	n := 0
	for i := range list.Items {
		if list.Items[i].DeletionTimestamp == nil && podReady(&list.Items[i]) {
			n++
		}
	}
	return n
}

// deleteVolplanePod deletes, with grace 0, a pod picked by the seed among
// volplane's (etcd's apart) and the node plugins' (volplane-csi-sidecar).
func (s *storm) deleteVolplanePod() {
	t := s.t
	var pods []corev1.Pod
	for _, src := range []struct{ ns, selector string }{{volplaneNS, "app!=volplane-etcd"}, {driverNS, "app=" + nodePlugin}} {
		list, err := c.Client.CoreV1().Pods(src.ns).List(t.Context(), metav1.ListOptions{LabelSelector: src.selector})
		if err != nil {
			s.fail("listing pods to delete: %v", err)
			return
		}
		for _, p := range list.Items {
			if p.DeletionTimestamp == nil && !strings.HasPrefix(p.Name, "volplane-etcd-backup") {
				pods = append(pods, p)
			}
		}
	}
	if len(pods) == 0 {
		s.fail("no volplane pod to delete")
		return
	}
	sort.Slice(pods, func(i, j int) bool { return pods[i].Name < pods[j].Name })
	p := pods[s.rng.IntN(len(pods))]
	s.count("pod deleted (grace 0)")
	s.logf("fault: delete pod %s/%s on %s, grace 0", p.Namespace, p.Name, p.Spec.NodeName)
	err := c.Client.CoreV1().Pods(p.Namespace).Delete(t.Context(), p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptrTo[int64](0)})
	if err != nil && !apierrors.IsNotFound(err) {
		s.fail("delete pod %s: %v", p.Name, err)
	}
}

// deleteEtcdMember deletes an etcd member's pod picked by the seed, with
// its grace period: the StatefulSet makes it again on an empty data
// directory and it rejoins.
func (s *storm) deleteEtcdMember() {
	t := s.t
	list, err := c.Client.CoreV1().Pods(volplaneNS).List(t.Context(), metav1.ListOptions{LabelSelector: "app=volplane-etcd"})
	if err != nil || len(list.Items) == 0 {
		s.fail("listing etcd's members: %d, %v", len(list.Items), err)
		return
	}
	sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
	p := list.Items[s.rng.IntN(len(list.Items))]
	s.count("etcd member deleted")
	s.logf("fault: delete etcd member %s", p.Name)
	if err := c.Client.CoreV1().Pods(volplaneNS).Delete(t.Context(), p.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		s.fail("delete etcd member %s: %v", p.Name, err)
	}
}

// killNode powers node off, waits down, gives it the out-of-service
// taint first if taint and it went NotReady, powers it on and removes
// the taint.
func (s *storm) killNode(node string, down time.Duration, taint bool) {
	t := s.t
	s.count("node killed")
	s.logf("fault: kill %s (hack/cluster/node.sh stop), back in %v", node, down.Round(time.Second))
	if out, err := clusterScript(t.Context(), "node.sh", "stop", node); err != nil {
		s.fail("node.sh stop %s: %v\n%s", node, err, out)
		return
	}
	off := time.Now()
	tainted := false
	for time.Since(off) < down {
		if taint && !tainted && nodeIsReady(t, node, false) == "" {
			s.logf("%s NotReady after %v: out-of-service taint", node, time.Since(off).Round(time.Second))
			if _, err := c.Run(t.Context(), "", "taint", "node", node, outOfService); err != nil {
				s.fail("taint %s: %v", node, err)
			} else {
				tainted = true
				s.count("out-of-service taint")
			}
		}
		if t.Context().Err() != nil {
			break // the test failed: power it on now
		}
		time.Sleep(time.Second)
	}
	// Powered on even when the test ends: the cluster outlives it.
	out, err := clusterScript(context.Background(), "node.sh", "start", node)
	if err != nil {
		s.fail("node.sh start %s: %v\n%s", node, err, out)
	}
	if tainted {
		// The API server may be restarting: retry.
		for i := 0; ; i++ {
			_, err := c.Run(context.Background(), "", "taint", "node", node, outOfService+"-")
			if err == nil || strings.Contains(err.Error(), "not found") || i == 30 {
				if err != nil && !strings.Contains(err.Error(), "not found") {
					s.fail("removing the taint of %s: %v", node, err)
				}
				break
			}
			time.Sleep(time.Second)
		}
	}
	// The next node's kill or etcd member's deletion waits until this
	// node's kubelet has reported since the kill: before, its pods' Ready
	// conditions may be the ones of before the kill. (Since the kill, not
	// since node.sh start returned: the kubelet reports as it starts, and
	// then only every few minutes while nothing changes.)
	started := time.Now()
	for time.Since(started) < 3*time.Minute {
		if n, err := c.Client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{}); err == nil && heartbeatSince(n, off) {
			break
		}
		time.Sleep(time.Second)
	}
	s.logf("%s powered on again after %v off, its kubelet reporting after %v", node,
		started.Sub(off).Round(time.Second), time.Since(started).Round(time.Second))
}

// heartbeatSince says whether node's kubelet reported it Ready at or
// after since.
func heartbeatSince(n *corev1.Node, since time.Time) bool {
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue && !cond.LastHeartbeatTime.Time.Before(since.Truncate(time.Second))
		}
	}
	return false
}

// kcmNode is the node of kube-controller-manager's static pod ("" when
// none is seen).
func kcmNode(t *testing.T) string {
	pods, err := c.Client.CoreV1().Pods("kube-system").List(t.Context(), metav1.ListOptions{})
	if err != nil {
		return ""
	}
	for _, p := range pods.Items {
		if strings.HasPrefix(p.Name, "kube-controller-manager-") {
			return p.Spec.NodeName
		}
	}
	return ""
}

// clusterScript runs hack/cluster/NAME args and returns its output.
func clusterScript(ctx context.Context, name string, args ...string) (string, error) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(root, "hack/cluster", name), args...)
	cmd.Env = append(cmd.Environ(), "VOLPLANE_CLUSTER_DIR="+clusterDir())
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// chaosWhole says what of the cluster is not whole ("" when it is): its
// nodes Ready, volplane's pods Ready at their counts, a node plugin
// Ready on each node.
func chaosWhole(t *testing.T, names []string) string {
	var missing []string
	for _, n := range names {
		if why := nodeIsReady(t, n, true); why != "" {
			missing = append(missing, why)
		}
	}
	if why := notReadyIn(t, volplaneNS, standaloneReplicas); why != "" {
		missing = append(missing, "volplane: "+why)
	}
	if why := notReadyIn(t, driverNS, map[string]int{nodePlugin: len(names)}); why != "" {
		missing = append(missing, "the node plugins: "+why)
	}
	return strings.Join(missing, "; ")
}

// chaosChurn creates, deletes and recreates claims of the
// WaitForFirstConsumer class, each with a pod writing a payload to
// /data/f, and reads each payload back once its pod is Ready: a payload
// read back is data the cluster has, whose checksum must match at the
// end.
type chaosChurn struct {
	ns  string
	rng *rand.Rand
	s   *storm

	mu        sync.Mutex
	next      int
	live      map[string]*claimGen // claim name: its generation now
	busy      map[string]bool      // claims being deleted or recreated
	created   int
	deleted   int
	recreated int
	wrong     []string // payloads read back wrong at once
	wg        sync.WaitGroup
}

// claimGen is one claim of the churn: a name, the payload its pod
// writes, and the payload's checksum once read back.
type claimGen struct {
	name, payload string
	uid           types.UID
	sum           string // sha256 of the payload read back; "" before
}

func newChaosChurn(ns string, rng *rand.Rand, s *storm) *chaosChurn {
	return &chaosChurn{ns: ns, rng: rng, s: s, live: map[string]*claimGen{}, busy: map[string]bool{}}
}

func (ch *chaosChurn) run(ctx context.Context) {
	tick := time.NewTicker(chaosChurnEvery)
	defer tick.Stop()
	for {
		ch.step(ctx)
		ch.confirm(ctx)
		select {
		case <-ctx.Done():
			ch.wg.Wait()
			return
		case <-tick.C:
		}
	}
}

// step creates a claim, deletes one or recreates one, as the seed says.
func (ch *chaosChurn) step(ctx context.Context) {
	ch.mu.Lock()
	var idle []string
	for name := range ch.live {
		if !ch.busy[name] {
			idle = append(idle, name)
		}
	}
	sort.Strings(idle)
	r := ch.rng.IntN(10)
	payload := fmt.Sprintf("%016x%016x", ch.rng.Uint64(), ch.rng.Uint64())
	var name string
	switch {
	case len(idle) < 4 || (r < 5 && len(ch.live) < chaosMaxClaims):
		name = fmt.Sprintf("c-%03d", ch.next)
		ch.next++
		ch.busy[name] = true
		ch.mu.Unlock()
		ch.create(ctx, name, payload)
		return
	default:
		name = idle[ch.rng.IntN(len(idle))]
		ch.busy[name] = true
	}
	recreate := r >= 8
	ch.wg.Add(1)
	ch.mu.Unlock()
	go func() {
		defer ch.wg.Done()
		ch.remove(name, recreate, payload)
	}()
}

// create makes claim name and its pod, retrying through an API server's
// restart.
func (ch *chaosChurn) create(ctx context.Context, name, payload string) {
	defer func() {
		ch.mu.Lock()
		delete(ch.busy, name)
		ch.mu.Unlock()
	}()
	claim := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "chaos-churn"}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: ptrTo(classWFFC),
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}},
		},
	}
	var uid types.UID
	err := retryAPI(ctx, func(ctx context.Context) error {
		got, err := c.Client.CoreV1().PersistentVolumeClaims(ch.ns).Create(ctx, claim, metav1.CreateOptions{})
		if err == nil {
			uid = got.UID
		}
		return err
	})
	if err != nil {
		if ctx.Err() == nil {
			ch.s.fail("create claim %s: %v", name, err)
		}
		return
	}
	g := &claimGen{name: name, payload: payload, uid: uid}
	ch.mu.Lock()
	ch.live[name] = g
	ch.created++
	ch.mu.Unlock()
	if err := retryAPI(ctx, func(ctx context.Context) error { return ch.createPod(ctx, g) }); err != nil && ctx.Err() == nil {
		ch.s.fail("create pod %s: %v", name, err)
	}
}

// createPod makes claim g's pod (none when it is there).
func (ch *chaosChurn) createPod(ctx context.Context, g *claimGen) error {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: g.name, Labels: map[string]string{"app": "chaos-churn"}},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptrTo[int64](2),
			AutomountServiceAccountToken:  ptrTo(false),
			Containers: []corev1.Container{{
				Name: "workload", Image: c.WorkloadImage, ImagePullPolicy: corev1.PullNever,
				Args:         []string{"hold", "-write", "/data/f=" + g.payload},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
			}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: g.name}}}},
		},
	}
	_, err := c.Client.CoreV1().Pods(ch.ns).Create(ctx, pod, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// remove deletes claim name and its pod; with recreate, it makes the
// claim again under the same name, with a new payload, once the old one
// is gone.
func (ch *chaosChurn) remove(name string, recreate bool, payload string) {
	ctx := ch.s.t.Context()
	defer func() {
		ch.mu.Lock()
		delete(ch.busy, name)
		ch.mu.Unlock()
	}()
	ch.mu.Lock()
	delete(ch.live, name)
	ch.deleted++
	ch.mu.Unlock()
	for _, del := range []func(context.Context) error{
		func(ctx context.Context) error {
			return c.Client.CoreV1().Pods(ch.ns).Delete(ctx, name, metav1.DeleteOptions{})
		},
		func(ctx context.Context) error {
			return c.Client.CoreV1().PersistentVolumeClaims(ch.ns).Delete(ctx, name, metav1.DeleteOptions{})
		},
	} {
		err := retryAPI(ctx, func(ctx context.Context) error {
			if err := del(ctx); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
			return nil
		})
		if err != nil {
			ch.s.fail("delete %s: %v", name, err)
			return
		}
	}
	if !recreate {
		return
	}
	// The claim goes once its pod has (the pvc-protection finalizer): a
	// pod on a node that is off holds it until the node is back or
	// tainted.
	for {
		_, err := c.Client.CoreV1().PersistentVolumeClaims(ch.ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
	ch.mu.Lock()
	ch.recreated++
	ch.mu.Unlock()
	ch.create(ctx, name, payload)
}

// confirm reads back, once, the payload of each live claim whose pod is
// Ready.
func (ch *chaosChurn) confirm(ctx context.Context) {
	ch.mu.Lock()
	var todo []*claimGen
	for _, g := range ch.live {
		if g.sum == "" && !ch.busy[g.name] {
			todo = append(todo, g)
		}
	}
	ch.mu.Unlock()
	for _, g := range todo {
		p, err := c.Client.CoreV1().Pods(ch.ns).Get(ctx, g.name, metav1.GetOptions{})
		if err != nil || !podReady(p) {
			continue
		}
		ch.s.mu.Lock()
		off := ch.s.nodeOff
		ch.s.mu.Unlock()
		if p.Spec.NodeName == off {
			continue // Ready as its node last said; the exec would hang
		}
		// A short bound: the pod's node may have just lost its power.
		ectx, cancel := context.WithTimeout(ctx, 15*time.Second)
		out, err := c.Run(ectx, "", "exec", "-n", ch.ns, g.name, "--", "volplane-workload", "cat", "/data/f")
		cancel()
		if err != nil {
			continue
		}
		ch.mu.Lock()
		if out == g.payload {
			g.sum = checksum(out)
		} else {
			ch.wrong = append(ch.wrong, fmt.Sprintf("%s read %q right after writing %q", g.name, out, g.payload))
		}
		ch.mu.Unlock()
	}
}

func (ch *chaosChurn) summary() string {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return fmt.Sprintf("%d claims created, %d deleted, %d of them made again under their name, %d live", ch.created, ch.deleted, ch.recreated, len(ch.live))
}

func (ch *chaosChurn) total() int {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return ch.created
}

// liveGens are the churn's live claims, by name.
func (ch *chaosChurn) liveGens() []*claimGen {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	out := make([]*claimGen, 0, len(ch.live))
	for _, g := range ch.live {
		out = append(out, g)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

func checksum(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// retryAPI calls f, with 10s to answer, until it succeeds, for up to a
// minute: the API server restarts within that.
func retryAPI(ctx context.Context, f func(ctx context.Context) error) error {
	deadline := time.Now().Add(time.Minute)
	for {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := f(cctx)
		cancel()
		if err == nil || apierrors.IsAlreadyExists(err) || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// claimVolumeWatch samples, every second, which volume each claim of ns
// is bound to and which claims each of the driver's PVs is bound to.
type claimVolumeWatch struct {
	mu        sync.Mutex
	volumesOf map[types.UID]map[string]bool // claim UID: volumes
	claimsOf  map[string]map[types.UID]bool // PV (name/UID): claim UIDs
	claimName map[types.UID]string
	stop      func()
	done      chan struct{}
}

func watchClaimVolumes(ctx context.Context, ns string) *claimVolumeWatch {
	ctx, cancel := context.WithCancel(ctx)
	w := &claimVolumeWatch{volumesOf: map[types.UID]map[string]bool{}, claimsOf: map[string]map[types.UID]bool{},
		claimName: map[types.UID]string{}, done: make(chan struct{})}
	w.stop = func() { cancel(); <-w.done }
	go func() {
		defer close(w.done)
		for {
			w.sample(ctx, ns)
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
	}()
	return w
}

func (w *claimVolumeWatch) sample(ctx context.Context, ns string) {
	claims, err := c.Client.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	pvs, err := c.Client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, cl := range claims.Items {
		if cl.Spec.VolumeName == "" {
			continue
		}
		addTo(w.volumesOf, cl.UID, cl.Spec.VolumeName)
		w.claimName[cl.UID] = cl.Namespace + "/" + cl.Name
	}
	for _, pv := range pvs.Items {
		if ref := pv.Spec.ClaimRef; ref != nil && ref.UID != "" && pv.Spec.CSI != nil && pv.Spec.CSI.Driver == devDriverName {
			addTo(w.claimsOf, pv.Name+"/"+string(pv.UID), ref.UID)
			if _, ok := w.claimName[ref.UID]; !ok {
				w.claimName[ref.UID] = ref.Namespace + "/" + ref.Name
			}
		}
	}
}

func addTo[K, V comparable](m map[K]map[V]bool, k K, v V) {
	if m[k] == nil {
		m[k] = map[V]bool{}
	}
	m[k][v] = true
}

// chaosConverged recreates the pods of live claims that the taint
// deleted and waits, up to chaosConverge from lastFault, until the
// cluster is whole, the StatefulSet's pods and every live claim's pod
// Ready, every live claim Bound, every CSI volume a PV's and every PV's
// CSI volume there, and the journal empty. It returns how long that took
// after lastFault, or what still did not hold.
func chaosConverged(t *testing.T, names []string, ns string, ch *chaosChurn, lastFault time.Time) (time.Duration, string) {
	for {
		why := chaosPending(t, names, ns, ch)
		if why == "" {
			return time.Since(lastFault), ""
		}
		if time.Since(lastFault) > chaosConverge {
			return time.Since(lastFault), why
		}
		select {
		case <-t.Context().Done():
			return 0, t.Context().Err().Error()
		case <-time.After(time.Second):
		}
	}
}

// chaosPending says what is not converged yet ("" when all is).
func chaosPending(t *testing.T, names []string, ns string, ch *chaosChurn) string {
	if why := chaosWhole(t, names); why != "" {
		return why
	}
	for i := range spreadReplicas {
		p, err := c.Client.CoreV1().Pods(ns).Get(t.Context(), fmt.Sprintf("%s-%d", chaosSTS, i), metav1.GetOptions{})
		if err != nil || !podReady(p) {
			return fmt.Sprintf("pod %s-%d not Ready (%v)", chaosSTS, i, err)
		}
	}
	bound := boundVolumes(t, ns)
	for _, g := range ch.liveGens() {
		if err := ch.createPod(t.Context(), g); err != nil {
			return fmt.Sprintf("pod %s: %v", g.name, err)
		}
		if _, ok := bound[g.name]; !ok {
			return fmt.Sprintf("claim %s not Bound", g.name)
		}
		p, err := c.Client.CoreV1().Pods(ns).Get(t.Context(), g.name, metav1.GetOptions{})
		if err != nil || !podReady(p) {
			return fmt.Sprintf("pod %s not Ready (%v)", g.name, err)
		}
	}
	if released := releasedPVs(t); len(released) > 0 {
		return fmt.Sprintf("PVs Released or Failed %v", released)
	}
	orphans, lost := csiAgainstPVs(t, names)
	if len(orphans) > 0 || len(lost) > 0 {
		return fmt.Sprintf("CSI volumes without a PV %v, PVs without their CSI volume %v", orphans, lost)
	}
	keys, err := journalRecords(t)
	if err != nil {
		return "reading the journal: " + err.Error()
	}
	if len(keys) > 0 {
		return fmt.Sprintf("journal records %v", keys)
	}
	return ""
}

// journalRecords are the keys of the journal's provisioning and reclaim
// records in volplane's etcd (the chaos run's InvJournalLeft).
func journalRecords(t *testing.T) ([]string, error) {
	var keys []string
	for _, kind := range []string{"provision", "reclaim"} {
		kvs, err := etcdRange(t, "/volplane/journal/"+kind+"/", true)
		if err != nil {
			return nil, err
		}
		keys = append(keys, slices.Collect(mapKeys(kvs))...)
	}
	sort.Strings(keys)
	return keys, nil
}

func mapKeys[V any](m map[string]V) iter.Seq[string] {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// releasedPVs are the dev driver's PVs of the policy Delete Released or
// Failed: their claims are gone, and their reclaim is not over.
func releasedPVs(t *testing.T) []string {
	pvs, err := c.Client.CoreV1().PersistentVolumes().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, pv := range pvs.Items {
		if pv.Spec.CSI != nil && pv.Spec.CSI.Driver == devDriverName && pv.Spec.PersistentVolumeReclaimPolicy == corev1.PersistentVolumeReclaimDelete &&
			(pv.Status.Phase == corev1.VolumeReleased || pv.Status.Phase == corev1.VolumeFailed) {
			out = append(out, pv.Name+" "+string(pv.Status.Phase))
		}
	}
	sort.Strings(out)
	return out
}

// nodeCSIVolumes reads the dev driver's volumes from every node's state
// files (hack/cluster/nodes.sh: each node's root under the cluster's
// directory): ID to name.
func nodeCSIVolumes(t *testing.T, names []string) map[string]string {
	out := map[string]string{}
	for _, n := range names {
		files, err := filepath.Glob(filepath.Join(clusterDir(), "nodes", n, "root", devDriverRoot, "state", "volumes", "*.json"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			b, err := os.ReadFile(f)
			if os.IsNotExist(err) {
				continue
			}
			var v driverVolume
			if err == nil {
				err = json.Unmarshal(b, &v)
			}
			if err != nil {
				t.Fatalf("the driver's state file %s: %v", f, err)
			}
			out[v.ID] = v.Name
		}
	}
	return out
}

// csiAgainstPVs are the CSI volumes no PV names (ID (name)) and the PVs
// whose CSI volume no node has.
func csiAgainstPVs(t *testing.T, names []string) (orphans, lost []string) {
	vols := nodeCSIVolumes(t, names)
	handles := volumeHandles(t)
	for id, name := range vols {
		if _, ok := handles[id]; !ok {
			orphans = append(orphans, id+" ("+name+")")
		}
	}
	for h, pv := range handles {
		if _, ok := vols[h]; !ok {
			lost = append(lost, pv+" ("+h+")")
		}
	}
	sort.Strings(orphans)
	sort.Strings(lost)
	return orphans, lost
}

// chaosRow is a row of count violations with up to three examples.
func chaosRow(invariant string, bad []string) chaos.Row {
	sort.Strings(bad)
	ex := bad
	if len(ex) > 3 {
		ex = append(slices.Clone(ex[:3]), fmt.Sprintf("and %d more", len(bad)-3))
	}
	return chaos.Row{Invariant: invariant, Count: len(bad), Examples: ex}
}

// chaosCheck reads every checksum back (the StatefulSet's files, the
// payloads of live claims) and checks the claims and volumes: the
// invariant table, and "N of M" checksums read back.
func chaosCheck(t *testing.T, ns, nonce string, ch *chaosChurn, w *claimVolumeWatch) (chaos.Result, string) {
	var res chaos.Result
	var lostData, unreadable []string
	read, want := 0, 0
	readAs := func(pod, path, text string) {
		want++
		out, err := c.Run(t.Context(), "", "exec", "-n", ns, pod, "--", "volplane-workload", "cat", path)
		if err != nil {
			// No answer is not an answer: a pod that does not run (the
			// cluster did not converge) says nothing of its data.
			if p, perr := c.Client.CoreV1().Pods(ns).Get(t.Context(), pod, metav1.GetOptions{}); perr != nil || !podReady(p) {
				unreadable = append(unreadable, fmt.Sprintf("%s:%s (%v)", pod, path, errOrEmpty(err)))
				return
			}
		}
		if err != nil || checksum(out) != checksum(text) {
			lostData = append(lostData, fmt.Sprintf("%s:%s reads %q %v, want %q", pod, path, out, errOrEmpty(err), text))
			return
		}
		read++
	}
	for i := range spreadReplicas {
		pod := fmt.Sprintf("%s-%d", chaosSTS, i)
		readAs(pod, "/data/id", pod+" "+nonce)
	}
	ch.mu.Lock()
	lostData = append(lostData, ch.wrong...)
	ch.mu.Unlock()
	for _, g := range ch.liveGens() {
		if g.sum == "" {
			// Never read back during the storm: data the cluster was
			// not known to have. Checked when its pod runs, not lost
			// when it does not.
			p, err := c.Client.CoreV1().Pods(ns).Get(t.Context(), g.name, metav1.GetOptions{})
			if err != nil || !podReady(p) {
				continue
			}
		}
		readAs(g.name, "/data/f", g.payload)
	}
	readBack := fmt.Sprintf("%d of %d", read, want)
	res.Rows = append(res.Rows, chaosRow(chaos.InvDataLost, lostData))
	res.Rows = append(res.Rows, chaosRow(invUnreadable, unreadable))
	res.Rows = append(res.Rows, chaos.Row{Invariant: invReadBack, Info: readBack})

	w.mu.Lock()
	var twoVolumes, twoClaims []string
	for uid, vols := range w.volumesOf {
		if len(vols) > 1 {
			twoVolumes = append(twoVolumes, fmt.Sprintf("%s: %v", w.claimName[uid], slices.Sorted(mapKeys(vols))))
		}
	}
	for pv, uids := range w.claimsOf {
		if len(uids) > 1 {
			var claims []string
			for uid := range uids {
				claims = append(claims, w.claimName[uid]+" ("+string(uid)+")")
			}
			sort.Strings(claims)
			twoClaims = append(twoClaims, fmt.Sprintf("%s: %v", pv, claims))
		}
	}
	w.mu.Unlock()
	res.Rows = append(res.Rows, chaosRow(chaos.InvClaimTwoVolumes+" (seen during the run)", twoVolumes))
	res.Rows = append(res.Rows, chaosRow(chaos.InvVolumeTwoClaims+" (seen during the run)", twoClaims))

	bound := boundVolumes(t, ns)
	var notBound []string
	for _, g := range ch.liveGens() {
		if _, ok := bound[g.name]; !ok {
			notBound = append(notBound, g.name)
		}
	}
	for i := range spreadReplicas {
		if name := fmt.Sprintf("data-%s-%d", chaosSTS, i); bound[name] == "" {
			notBound = append(notBound, name)
		}
	}
	res.Rows = append(res.Rows, chaosRow(chaos.InvClaimNotBound, notBound))

	orphans, lost := csiAgainstPVs(t, nodeNames(t))
	journal, jerr := journalRecords(t)
	var uncovered []string
	for _, o := range orphans {
		covered := false
		for _, k := range journal {
			if strings.HasSuffix(o, "("+k[strings.LastIndex(k, "/")+1:]+")") {
				covered = true
			}
		}
		if !covered {
			if jerr != nil {
				o += " (journal unread: " + jerr.Error() + ")"
			}
			uncovered = append(uncovered, o)
		}
	}
	res.Rows = append(res.Rows, chaosRow(chaos.InvOrphanVolumes, uncovered))
	res.Rows = append(res.Rows, chaosRow(chaos.InvDeletedLeft, releasedPVs(t)))
	res.Rows = append(res.Rows, chaosRow(invPVNoVolume, lost))
	left := journal
	if jerr != nil {
		left = append(left, "journal unread: "+jerr.Error())
	}
	res.Rows = append(res.Rows, chaosRow(chaos.InvJournalLeft, left))
	return res, readBack
}

// nodeNames are the cluster's nodes.
func nodeNames(t *testing.T) []string {
	list, err := c.Client.CoreV1().Nodes().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, n := range list.Items {
		out = append(out, n.Name)
	}
	sort.Strings(out)
	return out
}
