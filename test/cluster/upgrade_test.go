package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
)

// restGapBound is the longest the REST API (the gateway) may be
// unavailable during an upgrade step: docs/operations.md states it.
const restGapBound = 10 * time.Second

// restPollEvery is how often the gateway's /readyz is polled.
const restPollEvery = 200 * time.Millisecond

// churnEvery is how often the upgrade's load creates a claim (and deletes
// the oldest bound one once a few are alive).
const churnEvery = 2 * time.Second

// upgradeComponent is one of volplane's services as the upgrade rolls it:
// its workload's kind and name.
type upgradeComponent struct{ name, kind, workload string }

// upgradeOrder is docs/operations.md's upgrade order (the skew matrix's),
// etcd left out: both releases run one etcd image.
var upgradeOrder = []upgradeComponent{
	{"watcher", "statefulset", "volplane-watcher"},
	{"provisioner", "deployment", "volplane-provisioner"},
	{"reclaimer", "statefulset", "volplane-reclaimer"},
	{"binder", "statefulset", "volplane-binder"},
	{"gateway", "deployment", "volplane-gateway"},
}

// prevLacks names the components the previous release cannot run in this
// cluster, and why: they stay at HEAD through the phase.
var prevLacks = map[string]string{
	// 468427a's provisioner calls drivers only at --csi-endpoint; the
	// cluster's driver is served through volplane-csi-sidecar
	// (--discover-sidecars, added after it).
	"provisioner": "no --discover-sidecars in the previous release",
}

// testUpgrade is TestCluster's phase upgrade: with a claim created and a
// bound one deleted every churnEvery and the gateway polled every
// restPollEvery, volplane goes to the previous release, then up to HEAD
// one component at a time in the documented order, then back down the
// same way in reverse, then to HEAD again for the phases after it: by
// `helm upgrade --install --take-ownership` of deploy/helm/volplane when
// $VOLPLANE_HELM names a helm (make test-cluster sets it; the cluster
// test's one Helm install), else by images as the other steps. Each
// step adds a replica to a StatefulSet whose pods write to their
// (WaitForFirstConsumer) volumes, and checks: no claim bound twice, no
// volume leaked, the REST API's longest gap within restGapBound; it logs
// its row of the table as it ends. At the end every pod of the StatefulSet
// reads its own data and every claim alive is Bound.
func testUpgrade(t *testing.T) {
	prev := os.Getenv("VOLPLANE_PREV_IMAGE")
	if prev == "" {
		t.Skip("VOLPLANE_PREV_IMAGE (the previous release's image, hack/cluster/build.sh) is not set: make test-cluster sets it")
	}
	requireVolplaneReady(t)
	head := workloadImage(t, upgradeOrder[0])
	ns := c.Namespace(t)
	nonce := randomSuffix()
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	u := &upgradeRun{ns: ns, step: "start", stats: map[string]*stepStats{"start": {}}, bound: map[string]bool{}, created: map[string]time.Time{}}
	var wg sync.WaitGroup
	wg.Go(func() { u.pollREST(ctx, t, gatewayTLS(t)) })
	wg.Go(func() { u.churn(ctx) })
	defer func() { stop(); wg.Wait() }()

	rows := [][]string{upgradeHeader}
	replicas := 0
	run := func(label string, comps []upgradeComponent, image, version string) {
		replicas++
		row := u.step1(t, label, comps, image, version, replicas, nonce)
		rows = append(rows, row)
		t.Logf("step %s done:\n%s", label, table([][]string{upgradeHeader, row}))
	}
	defer func() {
		t.Logf("upgrade from %s to %s and back, with claims in flight:\n%s", prev, head, table(rows))
		if t.Failed() { // the phases after this one run at HEAD
			for _, comp := range upgradeOrder {
				setImage(t, comp, head)
			}
		}
	}()

	reversed := slices.Clone(upgradeOrder)
	slices.Reverse(reversed)
	run("install prev", upgradeOrder, prev, "prev")
	for i, comp := range upgradeOrder {
		run(fmt.Sprintf("upgrade %d", i+1), []upgradeComponent{comp}, head, "HEAD")
	}
	for i, comp := range reversed {
		run(fmt.Sprintf("rollback %d", i+1), []upgradeComponent{comp}, prev, "prev")
	}
	if helm := os.Getenv("VOLPLANE_HELM"); helm != "" {
		// docs/operations.md's last step: the new manifests applied, here
		// as the chart (docs/helm.md), which takes over the objects
		// kubectl applied: the one Helm install of the cluster test.
		replicas++
		row := u.helmStep(t, helm, head, replicas, nonce)
		rows = append(rows, row)
		t.Logf("step %s done:\n%s", row[0], table([][]string{upgradeHeader, row}))
	} else {
		run("back to HEAD", upgradeOrder, head, "HEAD")
	}
	stop()
	wg.Wait()
	u.finish(t)
	lines := readIDs(t, ns, upgradeSTS, nonce, replicas)
	t.Logf("StatefulSet %s, a replica added per step, each on a volume provisioned then:\n  %s", upgradeSTS, strings.Join(lines, "\n  "))
	c.Kubectl(t, "-n", ns, "delete", "statefulset", upgradeSTS, "--wait=true")
}

// upgradeSTS is the StatefulSet the upgrade grows by a replica per step.
const upgradeSTS = "upg"

// upgradeHeader is the header of the upgrade's table.
var upgradeHeader = []string{"STEP", "COMPONENT", "VERSION", "CREATED", "BOUND", "DELETED", "LONGEST BIND WAIT",
	"LONGEST REST GAP", "LEAKS", "DOUBLE BINDS", "REPLICAS READY", "TOOK"}

// step1 is one step of the upgrade: comps set to image (all of them at
// once, each rolled out), the StatefulSet grown to replicas with its new
// pod Ready, the checks, and the step's row of the table.
func (u *upgradeRun) step1(t *testing.T, label string, comps []upgradeComponent, image, version string, replicas int, nonce string) []string {
	t.Helper()
	return u.stepWith(t, label, comps, version, replicas, nonce, func() {
		for _, comp := range comps {
			if _, ok := prevLacks[comp.name]; !ok {
				setImage(t, comp, image)
			}
		}
	})
}

// helmStep is the upgrade's last step: every component to HEAD's image
// by `helm upgrade --install` of deploy/helm/volplane with the values
// that render deploy/overlays/one-node (deploy/chart_test.go: no dev
// driver, deploy/helm/one-node-values.yaml), taking
// over the objects kubectl applied.
func (u *upgradeRun) helmStep(t *testing.T, helm, head string, replicas int, nonce string) []string {
	t.Helper()
	_, tag, _ := strings.Cut(head, ":")
	return u.stepWith(t, "back to HEAD (helm upgrade --install)", upgradeOrder, "HEAD", replicas, nonce, func() {
		cmd := exec.CommandContext(t.Context(), helm, "upgrade", "--install", "volplane", filepath.Join(repoRoot(t), "deploy/helm/volplane"),
			"--kubeconfig", c.Kubeconfig, "-n", volplaneNS, "--take-ownership", "--server-side=true", "--force-conflicts",
			"--set", "provisioner.devDriver.enabled=false", "--set", "image.tag="+tag, "--timeout=5m",
			"-f", filepath.Join(repoRoot(t), "deploy/helm/one-node-values.yaml"))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("helm upgrade --install: %v\n%s", err, out)
		}
		t.Logf("helm upgrade --install volplane deploy/helm/volplane --take-ownership --set provisioner.devDriver.enabled=false,image.tag=%s -f deploy/helm/one-node-values.yaml:\n%s", tag, out)
		checkHelmOwns(t)
	})
}

// checkHelmOwns checks that the release volplane now owns every
// component's workload: Helm's annotation on each, which a later `helm
// upgrade` or `helm uninstall` acts on.
func checkHelmOwns(t *testing.T) {
	t.Helper()
	for _, comp := range upgradeOrder {
		got := strings.TrimSpace(c.Kubectl(t, "-n", volplaneNS, "get", comp.kind, comp.workload,
			"-o", `jsonpath={.metadata.annotations.meta\.helm\.sh/release-name}`))
		if got != "volplane" {
			t.Errorf("%s/%s after helm upgrade --install --take-ownership: annotation meta.helm.sh/release-name is %q, want \"volplane\"", comp.kind, comp.workload, got)
		}
	}
}

// stepWith runs one step whose change is do: the workloads of comps
// rolled out after it, the StatefulSet grown to replicas with its new pod
// Ready, the checks, and the step's row of the table.
func (u *upgradeRun) stepWith(t *testing.T, label string, comps []upgradeComponent, version string, replicas int, nonce string, do func()) []string {
	t.Helper()
	began := time.Now()
	u.begin(label)
	do()
	if replicas == 1 {
		c.Apply(t, u.ns, statefulSet(upgradeSTS, classWFFC, nonce, 1))
	} else {
		c.Kubectl(t, "-n", u.ns, "scale", "statefulset", upgradeSTS, fmt.Sprintf("--replicas=%d", replicas))
	}
	for _, comp := range comps {
		c.Kubectl(t, "-n", volplaneNS, "rollout", "status", comp.kind+"/"+comp.workload, "--timeout=5m")
	}
	requireVolplaneReady(t)
	c.WaitPodReady(t, u.ns, fmt.Sprintf("%s-%d", upgradeSTS, replicas-1), 3*time.Minute)
	time.Sleep(2 * churnEvery) // claims made with the step's versions in place
	leaks, doubles := u.check(t)
	s := u.end(label)
	names := make([]string, 0, len(comps))
	for _, comp := range comps {
		n := comp.name
		if why, ok := prevLacks[n]; ok {
			n += " (HEAD throughout: " + why + ")"
		}
		names = append(names, n)
	}
	if s.gap > restGapBound {
		t.Errorf("step %s: the REST API was unavailable for %v, more than the bound %v", label, s.gap, restGapBound)
	}
	return []string{label, strings.Join(names, ", "), version, fmt.Sprint(s.created), fmt.Sprint(s.bound),
		fmt.Sprint(s.deleted), s.bindWait.Round(time.Second).String(), s.gap.Round(10 * time.Millisecond).String(),
		fmt.Sprint(leaks), fmt.Sprint(doubles), fmt.Sprint(replicas), time.Since(began).Round(time.Second).String()}
}

// workloadImage is the volplane image comp's workload runs.
func workloadImage(t testing.TB, comp upgradeComponent) string {
	t.Helper()
	return c.Kubectl(t, "-n", volplaneNS, "get", comp.kind, comp.workload, "-o",
		"jsonpath={.spec.template.spec.containers[0].image}")
}

// setImage sets every container of comp's workload that runs a volplane
// image to image, as `kubectl set image` would.
func setImage(t testing.TB, comp upgradeComponent, image string) {
	t.Helper()
	apps := c.Client.AppsV1()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		switch comp.kind {
		case "statefulset":
			o, err := apps.StatefulSets(volplaneNS).Get(t.Context(), comp.workload, metav1.GetOptions{})
			if err != nil {
				return err
			}
			retag(o.Spec.Template.Spec.Containers, image)
			_, err = apps.StatefulSets(volplaneNS).Update(t.Context(), o, metav1.UpdateOptions{})
			return err
		default:
			o, err := apps.Deployments(volplaneNS).Get(t.Context(), comp.workload, metav1.GetOptions{})
			if err != nil {
				return err
			}
			retag(o.Spec.Template.Spec.Containers, image)
			_, err = apps.Deployments(volplaneNS).Update(t.Context(), o, metav1.UpdateOptions{})
			return err
		}
	})
	if err != nil {
		t.Fatalf("setting %s's image to %s: %v", comp.workload, image, err)
	}
}

// retag sets the image of the containers that run volplane's image.
func retag(cs []corev1.Container, image string) {
	repo, _, _ := strings.Cut(image, ":")
	for i := range cs {
		if strings.HasPrefix(cs[i].Image, repo+":") {
			cs[i].Image = image
		}
	}
}

// gatewayTLS is a client configuration that trusts the gateway's
// certificate when dialled at a pod's address (the certificate names
// localhost and the Service, not pod addresses).
func gatewayTLS(t testing.TB) *tls.Config {
	t.Helper()
	ca := c.Kubectl(t, "-n", volplaneNS, "get", "secret", "volplane-gateway-tls", "-o", `jsonpath={.data.ca\.crt}`)
	pem, err := decodeBase64(ca)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	return &tls.Config{RootCAs: pool, ServerName: "localhost"}
}

// stepStats is what the upgrade's load saw during one step.
type stepStats struct {
	created, bound, deleted int
	gap                     time.Duration // the longest the REST API was unavailable
	bindWait                time.Duration // the longest a claim bound in the step waited
}

// upgradeRun is the load and the REST poller of testUpgrade, by step.
type upgradeRun struct {
	ns string

	mu      sync.Mutex
	step    string
	stats   map[string]*stepStats
	lastOK  time.Time            // the gateway's last 200
	bound   map[string]bool      // claims seen Bound
	created map[string]time.Time // when each claim was created
	alive   []string             // claims created and not deleted, oldest first
	deleted []string
	errs    []string
}

// begin starts a step: its gap counts from the last answer before it.
func (u *upgradeRun) begin(step string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.step = step
	u.stats[step] = &stepStats{}
}

// end ends a step and returns what was seen during it.
func (u *upgradeRun) end(step string) stepStats {
	u.mu.Lock()
	defer u.mu.Unlock()
	// A gap still open at the step's end counts too.
	if !u.lastOK.IsZero() {
		if g := time.Since(u.lastOK); g > u.stats[step].gap {
			u.stats[step].gap = g
		}
	}
	u.step = step + " (over)"
	u.stats[u.step] = &stepStats{}
	return *u.stats[step]
}

// pollREST asks the gateway's Ready replicas for /readyz every
// restPollEvery, as the gateway's Service would route a request, and
// records the longest time between two 200s in the step in progress.
func (u *upgradeRun) pollREST(ctx context.Context, t *testing.T, cfg *tls.Config) {
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}}
	tick := time.NewTicker(restPollEvery)
	defer tick.Stop()
	for {
		if u.restUp(ctx, client) {
			now := time.Now()
			u.mu.Lock()
			if !u.lastOK.IsZero() {
				if g := now.Sub(u.lastOK); g > u.stats[u.step].gap {
					u.stats[u.step].gap = g
				}
			}
			u.lastOK = now
			u.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// restUp says whether one Ready gateway pod answers /readyz with 200.
func (u *upgradeRun) restUp(ctx context.Context, client *http.Client) bool {
	pods, err := c.Client.CoreV1().Pods(volplaneNS).List(ctx, metav1.ListOptions{LabelSelector: "app=volplane-gateway"})
	if err != nil {
		return false
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil || p.Status.PodIP == "" || !podReady(&p) {
			continue
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+p.Status.PodIP+":8443/readyz", nil)
		if err != nil {
			continue
		}
		resp, err := client.Do(req)
		if err != nil {
			continue
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return true
		}
	}
	return false
}

// podReady is the pod's Ready condition.
func podReady(p *corev1.Pod) bool {
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// churn creates a claim of the Immediate class every churnEvery, and
// deletes the oldest claim once it is Bound and three are alive.
func (u *upgradeRun) churn(ctx context.Context) {
	tick := time.NewTicker(churnEvery)
	defer tick.Stop()
	for i := 0; ; i++ {
		u.churnOnce(ctx, fmt.Sprintf("u-%03d", i))
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// churnOnce creates the claim name, counts the claims newly Bound, and
// deletes the oldest alive claim when it is Bound.
func (u *upgradeRun) churnOnce(ctx context.Context, name string) {
	claims := c.Client.CoreV1().PersistentVolumeClaims(u.ns)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := claims.Create(cctx, upgradeClaim(name), metav1.CreateOptions{})
	list, lerr := claims.List(cctx, metav1.ListOptions{})
	u.mu.Lock()
	defer u.mu.Unlock()
	st := u.stats[u.step]
	if err != nil {
		if ctx.Err() == nil {
			u.errs = append(u.errs, fmt.Sprintf("creating claim %s (%s): %v", name, u.step, err))
		}
	} else {
		st.created++
		u.alive = append(u.alive, name)
		u.created[name] = time.Now()
	}
	if lerr != nil {
		return
	}
	for _, cl := range list.Items {
		if cl.Status.Phase == corev1.ClaimBound && !u.bound[cl.Name] {
			u.bound[cl.Name] = true
			st.bound++
			if at, ok := u.created[cl.Name]; ok {
				st.bindWait = max(st.bindWait, time.Since(at))
			}
		}
	}
	if len(u.alive) < 3 || !u.bound[u.alive[0]] {
		return
	}
	oldest := u.alive[0]
	if err := claims.Delete(cctx, oldest, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		if ctx.Err() == nil {
			u.errs = append(u.errs, fmt.Sprintf("deleting claim %s (%s): %v", oldest, u.step, err))
		}
		return
	}
	u.alive = u.alive[1:]
	u.deleted = append(u.deleted, oldest)
	st.deleted++
}

// upgradeClaim is a 1Mi claim of the Immediate class.
func upgradeClaim(name string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "upgrade-load"}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: ptrTo(classImmediate),
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}},
		},
	}
}

// check counts the volumes bound twice now (a volume two claims name, a
// claim two PVs name) and, after the deletions in flight had a minute to
// end, the driver's volumes no PV names and the PVs whose volume the
// driver lacks.
func (u *upgradeRun) check(t *testing.T) (leaks, doubles int) {
	t.Helper()
	for _, p := range doubleBinds(t, u.ns) {
		t.Error(p)
		doubles++
	}
	var problems []string
	deadline := time.Now().Add(time.Minute)
	for {
		_, problems = driverVolumesAgainstPVs(t)
		if len(problems) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	for _, p := range problems {
		t.Error(p)
	}
	return len(problems), doubles
}

// doubleBinds lists the volumes bound to two claims of ns and the claims
// two PVs point to.
func doubleBinds(t testing.TB, ns string) []string {
	t.Helper()
	claims, err := c.Client.CoreV1().PersistentVolumeClaims(ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pvs, err := c.Client.CoreV1().PersistentVolumes().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	byVolume := map[string]string{}
	for _, cl := range claims.Items {
		if cl.Status.Phase != corev1.ClaimBound {
			continue
		}
		if other, ok := byVolume[cl.Spec.VolumeName]; ok {
			out = append(out, fmt.Sprintf("volume %s is bound to claims %s and %s", cl.Spec.VolumeName, other, cl.Name))
		}
		byVolume[cl.Spec.VolumeName] = cl.Name
	}
	pvsOf := map[string][]string{}
	for _, pv := range pvs.Items {
		if ref := pv.Spec.ClaimRef; ref != nil && ref.Namespace == ns && pv.Status.Phase == corev1.VolumeBound {
			pvsOf[ref.Name] = append(pvsOf[ref.Name], pv.Name)
		}
	}
	for claim, names := range pvsOf {
		if len(names) > 1 {
			out = append(out, fmt.Sprintf("claim %s has %d bound volumes pointing to it: %v", claim, len(names), names))
		}
	}
	return out
}

// finish checks the end state: no error creating or deleting, every claim
// alive Bound (none stuck), every deleted claim gone with its PV, no
// orphan the provisioner reports.
func (u *upgradeRun) finish(t *testing.T) {
	u.mu.Lock()
	alive, deleted, errs := slices.Clone(u.alive), slices.Clone(u.deleted), slices.Clone(u.errs)
	u.mu.Unlock()
	for _, e := range errs {
		t.Error(e)
	}
	waitFor(t, 3*time.Minute, func() string {
		var stuck []string
		for _, name := range alive {
			if p := claimPhase(t, u.ns, name); p != string(corev1.ClaimBound) {
				stuck = append(stuck, name+" "+p)
			}
		}
		pvs, err := c.Client.CoreV1().PersistentVolumes().List(t.Context(), metav1.ListOptions{})
		if err != nil {
			return err.Error()
		}
		for _, pv := range pvs.Items {
			if ref := pv.Spec.ClaimRef; ref != nil && ref.Namespace == u.ns && slices.Contains(deleted, ref.Name) {
				stuck = append(stuck, "PV "+pv.Name+" of deleted claim "+ref.Name+" "+string(pv.Status.Phase))
			}
		}
		if len(stuck) > 0 {
			return fmt.Sprintf("claims not Bound or PVs of deleted claims left: %v", stuck)
		}
		return ""
	})
	if _, problems := driverVolumesAgainstPVs(t); len(problems) > 0 {
		t.Errorf("volumes leaked or lost: %v", problems)
	}
	t.Logf("%d claims created, %d deleted: every claim left Bound, every deleted claim's PV and volume gone", len(alive)+len(deleted), len(deleted))
}
