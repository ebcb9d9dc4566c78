package standalone

import (
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/test/harness/chaos"
	"github.com/volplane/volplane/test/harness/devenv"
	"github.com/volplane/volplane/test/harness/e2e"
)

// TestSlowRetryAndMetricsParity runs two scenarios of issue 36 with
// external-provisioner v6.3.0 and then with volplane's standalone
// provisioner and reclaimer, on the same dev driver beside the same
// kube-controller-manager, and compares what each did:
//
//   - the slow retry of an infeasible request: a Block claim, which the
//     dev driver refuses with InvalidArgument. Each is watched for how
//     often it looks at the claim again (its claim queue's
//     workqueue_retries_total) and how often it calls CreateVolume (its
//     Provisioning and ProvisioningFailed Events), before and after the
//     StorageClass is replaced; no timing is asserted;
//   - the library's metrics after that, a provisioning and a deletion,
//     scraped from csi-provisioner's --http-endpoint and from volplane's
//     provisioner and reclaimer (--debug-address): the same families,
//     help, types, label names and counts.
//
// A cluster of its own: volplane's provisioner runs with
// --retry-interval-max 5m (csi-provisioner v6.3.0 waits 5m whatever its
// flag says), where TestStandalone's runs with 5s.
func TestSlowRetryAndMetricsParity(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the services, kube-controller-manager and csi-provisioner as processes")
	}
	kcmBin, epBin := findKCM(), findCSIProvisioner()
	if kcmBin == "" || epBin == "" {
		t.Skip("no kube-controller-manager or csi-provisioner v6.3.0 (VOLPLANE_KUBE_CONTROLLER_MANAGER, VOLPLANE_CSI_PROVISIONER)")
	}
	if _, err := devenv.FindKubeAPIServer(); err != nil {
		t.Skip(err)
	}
	debug := map[string]string{}
	for _, s := range []string{"provisioner", "reclaimer", "csi-provisioner"} {
		a, err := devenv.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		debug[s] = a
	}
	x := startParityCluster(t, kcmBin, map[string][]string{
		"provisioner-1": {"--retry-interval-max", "5m", "--debug-address", debug["provisioner"]},
		"reclaimer-1":   {"--debug-address", debug["reclaimer"]},
	})

	// external-provisioner alone on the driver: volplane's provisioner and
	// reclaimer are stopped, so that it also deletes.
	ours := append(x.c.Replicas("provisioner"), x.c.Replicas("reclaimer")...)
	for _, r := range ours {
		r.Stop()
	}
	ep, err := devenv.StartProcess(x.c.Dir, "csi-provisioner", epBin, "--csi-address", x.c.CSI.Addr, "--kubeconfig", x.c.API.Kubeconfig,
		"--timeout", "10s", "--http-endpoint", debug["csi-provisioner"], "--v", "2")
	if err != nil {
		t.Fatal(err)
	}
	epMetrics := "http://" + debug["csi-provisioner"] + "/metrics"
	theirs := x.slowRetry("ep", epMetrics, "claims")
	x.provisionAndDelete("lib-ep")
	theirLib := libFamilies(t, epMetrics)
	ep.Stop()

	for _, r := range ours {
		if err := r.Start(); err != nil {
			t.Fatal(err)
		}
		if err := x.c.WaitServing(t.Context(), r, 2*time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	vpMetrics := "http://" + debug["provisioner"] + "/metrics"
	mine := x.slowRetry("vp", vpMetrics, "standalone-claims")
	x.provisionAndDelete("lib-vp")
	myLib := libFamilies(t, vpMetrics)
	for name, f := range libFamilies(t, "http://"+debug["reclaimer"]+"/metrics") {
		myLib[name] = f
	}

	if !slices.Equal(theirs, mine) {
		t.Errorf("the slow retry differs:\nexternal-provisioner: %q\nvolplane:             %q", theirs, mine)
	}
	for _, d := range diffLib(theirLib, myLib) {
		t.Error(d)
	}
	t.Logf("slow retry, both: %q", mine)
	t.Logf("library metrics, both: %s", describeLib(myLib))
}

// startParityCluster starts the standalone cluster (one watcher,
// provisioner and reclaimer, with args) and kube-controller-manager's
// binder, as TestStandalone does, and the namespace and classes.
func startParityCluster(t *testing.T, kcmBin string, args map[string][]string) *env {
	t.Helper()
	bin := t.TempDir()
	if err := chaos.Build(t.Context(), bin); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	c, err := chaos.StartCluster(t.Context(), chaos.ClusterOptions{Dir: dir, BinDir: bin, Watchers: 1, Provisioners: 1, Reclaimers: 1,
		Standalone: true, Args: args, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	kcm, err := devenv.StartProcess(dir, "kube-controller-manager", kcmBin, "--kubeconfig", c.API.Kubeconfig,
		"--controllers", "persistentvolume-binder-controller,persistentvolumeclaim-protection-controller,persistentvolume-protection-controller",
		"--leader-elect=false", "--secure-port=0", "--v=2")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kcm.Stop)
	t.Cleanup(func() {
		if t.Failed() {
			dumpLogs(t, dir)
		}
	})
	x := &env{t: t, c: c, kcm: kcm}
	x.setup()
	return x
}

// slowRetry makes a Block claim of a class of its own (suffix who), which
// the dev driver refuses as InvalidArgument, and returns what the
// provisioner did, checkpoint by checkpoint: how many attempts (its own
// Normal Provisioning and Warning ProvisioningFailed Events; not
// kube-controller-manager's, which may say ProvisioningFailed when its
// write of the claim conflicts) after the refusal, after three more looks
// at the claim (queue's workqueue_retries_total on metricsURL), after the
// class is replaced, and after one more look; then the Events' messages.
func (x *env) slowRetry(who, metricsURL, queue string) []string {
	x.t.Helper()
	name := "slow-" + who
	sc := x.slowClass(name)
	block := corev1.PersistentVolumeBlock
	cl := e2e.Claim(namespace, name, "1Gi", sc.Name, func(c *corev1.PersistentVolumeClaim) { c.Spec.VolumeMode = &block })
	cl, err := x.c.Client.CoreV1().PersistentVolumeClaims(namespace).Create(x.t.Context(), cl, metav1.CreateOptions{})
	if err != nil {
		x.t.Fatal(err)
	}
	var out []string
	attempts := func(when string, n int32) {
		e2e.Eventually(x.t, 2*time.Minute, func() string {
			if got := x.countOwn(name, "ProvisioningFailed"); got < n {
				return fmt.Sprintf("%d ProvisioningFailed Events of %s, waiting for %d", got, name, n)
			}
			return ""
		})
		out = append(out, fmt.Sprintf("%s: Provisioning %d, ProvisioningFailed %d", when, x.countOwn(name, "Provisioning"), x.countOwn(name, "ProvisioningFailed")))
	}
	// looks waits until the claim's queue retried n more times since base
	// (each look that does not call CreateVolume is one, and so is each
	// refused attempt); the backoff keeps growing, as upstream's.
	looks := func(when string, base float64, n int) {
		e2e.Eventually(x.t, 4*time.Minute, func() string {
			if got := queueRetries(x.t, metricsURL, queue); got < base+float64(n) {
				return fmt.Sprintf("workqueue_retries_total{name=%q} %v, waiting for %v", queue, got, base+float64(n))
			}
			return ""
		})
		out = append(out, fmt.Sprintf("%s: Provisioning %d, ProvisioningFailed %d", when, x.countOwn(name, "Provisioning"), x.countOwn(name, "ProvisioningFailed")))
	}
	attempts("refused", 1)
	looks("three looks later", queueRetries(x.t, metricsURL, queue), 3)
	base := queueRetries(x.t, metricsURL, queue)
	x.replaceClass(sc)
	attempts("class replaced", 2)
	// The refused attempt with the new class, and one look after it.
	looks("a look after the second refusal", base, 2)
	evs, err := e2e.Events(x.c.Client, namespace, "PersistentVolumeClaim", name)
	if err != nil {
		x.t.Fatal(err)
	}
	var msgs []string
	for _, e := range evs {
		x.t.Logf("%s: event %s %s from %s, count %d: %s", who, e.Type, e.Reason, e.Source.Component, e.Count, e.Message)
		if strings.HasPrefix(e.Source.Component, devcsi.DefaultName+"_") {
			msgs = append(msgs, e.Reason+": "+strings.NewReplacer(name, "NAME", string(cl.UID), "UID").Replace(e.Message))
		}
	}
	slices.Sort(msgs)
	x.deleteClaim(cl)
	_ = x.c.Client.StorageV1().StorageClasses().Delete(x.t.Context(), sc.Name, metav1.DeleteOptions{})
	return append(out, msgs...)
}

// countOwn counts the claim's Events of reason from the provisioner
// ("<driver>_<host>_<uuid>", csi-provisioner's and volplane's), as
// aggregated by the API server.
func (x *env) countOwn(claim, reason string) int32 {
	x.t.Helper()
	evs, err := e2e.Events(x.c.Client, namespace, "PersistentVolumeClaim", claim)
	if err != nil {
		x.t.Fatal(err)
	}
	var n int32
	for _, e := range evs {
		if e.Reason == reason && strings.HasPrefix(e.Source.Component, devcsi.DefaultName+"_") {
			n += max(e.Count, 1)
		}
	}
	return n
}

// slowClass creates the Immediate, Delete class name of the dev driver.
func (x *env) slowClass(name string) *storagev1.StorageClass {
	del := corev1.PersistentVolumeReclaimDelete
	return e2e.CreateClass(x.t, x.c.Client, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: devcsi.DefaultName, ReclaimPolicy: &del})
}

// replaceClass deletes sc and creates it again (a new UID), as a user
// fixing a class's parameters must.
func (x *env) replaceClass(sc *storagev1.StorageClass) {
	x.t.Helper()
	if err := x.c.Client.StorageV1().StorageClasses().Delete(x.t.Context(), sc.Name, metav1.DeleteOptions{}); err != nil {
		x.t.Fatal(err)
	}
	e2e.Eventually(x.t, 30*time.Second, func() string {
		if _, err := x.c.Client.StorageV1().StorageClasses().Get(x.t.Context(), sc.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Sprintf("class %s still there: %v", sc.Name, err)
		}
		return ""
	})
	again := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: sc.Name}, Provisioner: sc.Provisioner, ReclaimPolicy: sc.ReclaimPolicy,
		VolumeBindingMode: sc.VolumeBindingMode}
	if _, err := x.c.Client.StorageV1().StorageClasses().Create(x.t.Context(), again, metav1.CreateOptions{}); err != nil {
		x.t.Fatal(err)
	}
}

// provisionAndDelete provisions a claim of classDelete and deletes it,
// waiting until its PV and backing volume are gone.
func (x *env) provisionAndDelete(name string) {
	x.t.Helper()
	cl := x.claim(name, classDelete, nil)
	pv := x.bound(cl, corev1.PersistentVolumeReclaimDelete)
	x.deleteClaim(cl)
	x.gone(pv.Name)
}

// scrapeFamilies reads the metric families served at url.
func scrapeFamilies(t testing.TB, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("%s: %v", url, err)
	}
	return fams
}

// queueRetries is workqueue_retries_total of queue at url.
func queueRetries(t testing.TB, url, queue string) float64 {
	t.Helper()
	for _, m := range scrapeFamilies(t, url)["workqueue_retries_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "name" && l.GetValue() == queue {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// libFamilies are the library's families (controller_persistentvolume*)
// at url.
func libFamilies(t testing.TB, url string) map[string]*dto.MetricFamily {
	t.Helper()
	out := map[string]*dto.MetricFamily{}
	for name, f := range scrapeFamilies(t, url) {
		if strings.HasPrefix(name, "controller_persistentvolume") {
			out[name] = f
		}
	}
	return out
}

// slowSuffix makes the two runs' slow classes one name.
var slowSuffix = regexp.MustCompile(`^slow-(ep|vp)$`)

// libSeries is a family's series as "{labels} value", the slow class's
// name made the same for both runs, histograms by their count.
//
// Of the failed_total families only the slow class's provisioning
// failures are compared, and as "at least the two refusals": the rest
// depends on timing alone. csi-provisioner v6.3.0 counts a failed
// deletion when a second sync of a volume it just deleted finds the PV
// gone (controller.go:1641-1645, "Failed to delete persistentvolume ...
// not found"), and a failed provisioning when it looks at a claim in the
// instant its class is deleted; volplane's reclaimer deletes once.
func libSeries(f *dto.MetricFamily) []string {
	var out []string
	failed := strings.HasSuffix(f.GetName(), "_failed_total")
	for _, m := range f.GetMetric() {
		var labels []string
		slow := false
		for _, l := range m.GetLabel() {
			v := slowSuffix.ReplaceAllString(l.GetValue(), "slow-X")
			slow = slow || v == "slow-X"
			labels = append(labels, l.GetName()+"="+v)
		}
		sort.Strings(labels)
		v := m.GetCounter().GetValue()
		if f.GetType() == dto.MetricType_HISTOGRAM {
			v = float64(m.GetHistogram().GetSampleCount())
		}
		switch {
		case failed && !slow:
			continue
		case failed && v >= 2:
			v = 2
		}
		out = append(out, fmt.Sprintf("{%s} %v", strings.Join(labels, ","), v))
	}
	sort.Strings(out)
	return out
}

// diffLib lists how volplane's library families differ from
// external-provisioner's: a family missing or extra, its type or help,
// its series (label names and values, counts).
func diffLib(theirs, ours map[string]*dto.MetricFamily) []string {
	var out []string
	for name, t := range theirs {
		o, ok := ours[name]
		switch {
		case !ok && len(libSeries(t)) == 0:
			// Only timing-dependent failures (see libSeries).
		case !ok:
			out = append(out, fmt.Sprintf("volplane lacks %s (external-provisioner: %q)", name, libSeries(t)))
		case o.GetType() != t.GetType() || o.GetHelp() != t.GetHelp():
			out = append(out, fmt.Sprintf("%s: type %v help %q, external-provisioner's %v %q", name, o.GetType(), o.GetHelp(), t.GetType(), t.GetHelp()))
		case countedAgain[name] && onceEach(libSeries(o)) && atLeast(libSeries(t), libSeries(o)):
			// external-provisioner counted a claim again (see countedAgain).
		case !slices.Equal(libSeries(t), libSeries(o)):
			out = append(out, fmt.Sprintf("%s: volplane %q, external-provisioner %q", name, libSeries(o), libSeries(t)))
		}
	}
	for name, o := range ours {
		if _, ok := theirs[name]; !ok {
			out = append(out, fmt.Sprintf("volplane has %s, external-provisioner not: %q", name, libSeries(o)))
		}
	}
	if len(theirs) == 0 {
		out = append(out, "external-provisioner served none of the library's metrics")
	}
	return out
}

// describeLib is the families and their series, for the log.
func describeLib(fams map[string]*dto.MetricFamily) string {
	var names []string
	for n := range fams {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, "\n  %s %q", n, libSeries(fams[n]))
	}
	return b.String()
}

// countedAgain are the families external-provisioner counts once more
// when it syncs a claim a second time before its informer has the PV it
// made: under load it provisions again, the driver answers from its
// idempotency and the PV's creation finds the same PV (CI, 2026-12-07:
// "successfully created PV pvc-db02f133-... for PVC lib-ep" twice). For
// these volplane must count each provisioned claim exactly once, and
// external-provisioner at least once, with the same labels.
var countedAgain = map[string]bool{
	"controller_persistentvolumeclaim_provision_total":            true,
	"controller_persistentvolumeclaim_provision_duration_seconds": true,
}

// onceEach reports whether every series (libSeries' "{labels} count")
// counts 1.
func onceEach(series []string) bool {
	for _, s := range series {
		if !strings.HasSuffix(s, "} 1") {
			return false
		}
	}
	return len(series) > 0
}

// atLeast reports whether theirs has the same series as ours, each
// counting at least as many.
func atLeast(theirs, ours []string) bool {
	if len(theirs) != len(ours) {
		return false
	}
	for i := range ours {
		tl, tv, _ := strings.Cut(theirs[i], "} ")
		ol, ov, _ := strings.Cut(ours[i], "} ")
		t, err1 := strconv.ParseFloat(tv, 64)
		o, err2 := strconv.ParseFloat(ov, 64)
		if tl != ol || err1 != nil || err2 != nil || t < o {
			return false
		}
	}
	return true
}

// Only external-provisioner may count a claim again: volplane counting it
// twice, or fewer than external-provisioner's labels, still differs.
func TestDiffLibToleratesOnlyTheReferenceCountingAgain(t *testing.T) {
	fam := func(name string, v float64) map[string]*dto.MetricFamily {
		n, c, l, val := name, dto.MetricType_COUNTER, "class", "sa-delete"
		return map[string]*dto.MetricFamily{name: {Name: &n, Type: &c, Metric: []*dto.Metric{{
			Label: []*dto.LabelPair{{Name: &l, Value: &val}}, Counter: &dto.Counter{Value: &v}}}}}
	}
	const total = "controller_persistentvolumeclaim_provision_total"
	if d := diffLib(fam(total, 2), fam(total, 1)); len(d) != 0 {
		t.Errorf("external-provisioner counting a claim again: %q, want no difference", d)
	}
	if d := diffLib(fam(total, 1), fam(total, 2)); len(d) == 0 {
		t.Error("volplane counting a claim twice: no difference")
	}
	const deletes = "controller_persistentvolume_delete_total"
	if d := diffLib(fam(deletes, 2), fam(deletes, 1)); len(d) == 0 {
		t.Error("a family not in countedAgain with other counts: no difference")
	}
}
