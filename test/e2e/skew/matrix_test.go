package skew

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/test/harness/chaos"
	"github.com/volplane/volplane/test/harness/e2e"
)

// checkTimeout bounds each check's wait: a failure's, not a speed limit.
const checkTimeout = 90 * time.Second

// prevVersion is what hack/build-prev.sh stamps into the previous
// release's binaries (their startup log line's version).
const prevVersion = "v0.1.0-prev"

// matrix is the cluster the rows run on and what they share.
type matrix struct {
	t          *testing.T
	c          *chaos.Cluster
	head, prev string // the two releases' binary directories
	// prevCommit is the previous release's commit as its binaries'
	// startup line says it (12 hex digits).
	prevCommit string
	book       *chaos.Book
	// carried is the previous row's dynamic claim, left Bound for this
	// row to delete: a volume provisioned under one row's releases,
	// reclaimed under the next row's.
	carried *corev1.PersistentVolumeClaim
	// inFlight are the previous row's operations left in the journal
	// (the CSI driver answering Unavailable), for this row's releases to
	// finish; nil after the first and the last row.
	inFlight *inFlight
	// last is the index of the last row, which leaves nothing in flight.
	last int
	// faulted: the CSI driver runs with faults (leaveInFlight).
	faulted bool
}

// inFlight is a provisioning and a deletion (of a Released volume's
// backing volume) journaled under one row's releases and not done.
type inFlight struct {
	provision, reclaim *corev1.PersistentVolumeClaim
}

// rowState is what one row's checks pass on to the next check.
type rowState struct {
	ns       string
	prev     map[string]bool // the row's services at the previous release
	last     bool            // the matrix's last row
	static   string          // the static PersistentVolume's name
	dynamic  *corev1.PersistentVolumeClaim
	carried  *corev1.PersistentVolumeClaim
	inFlight *inFlight // the previous row's
	left     *inFlight // this row's, for the next
}

// errNotApplicable is a check with nothing to check in this row (the
// first row has no previous row's volume or operations).
var errNotApplicable = errors.New("n/a")

// check is one column of the matrix.
type check struct {
	name string
	run  func(m *matrix, ctx context.Context, st *rowState) error
}

// checks are the matrix's columns, in the order a row runs them.
var checks = []check{
	{"in-flight done", (*matrix).finishInFlight},
	{"static bind", (*matrix).staticBind},
	{"provision", (*matrix).provision},
	{"reclaim", (*matrix).reclaimOwn},
	{"reclaim prev", (*matrix).reclaimCarried},
	{"gateway", (*matrix).gatewayREST},
	{"invariants", (*matrix).invariants},
	{"leave in-flight", (*matrix).leaveInFlight},
}

// result is one row's outcome.
type result struct {
	row      row
	versions map[string]string // "prev" or "HEAD", from the service's log
	cells    []string          // per check: ok, FAIL, n/a or - (not run)
	times    []string          // per check that ran: its name and time
	errs     []string
	took     time.Duration
}

func (r result) failed() bool { return len(r.errs) > 0 }

func (r result) summary() string {
	if r.failed() {
		return "FAIL: " + strings.Join(r.errs, "; ")
	}
	return fmt.Sprintf("ok in %s (%s)", r.took.Round(100*time.Millisecond), strings.Join(r.times, ", "))
}

// run switches the cluster to row r and runs every check; after a failed
// check the row's remaining cells say "-" (not run).
func (m *matrix) run(i int, r row) result {
	ctx := m.t.Context()
	start := time.Now()
	res := result{row: r, versions: map[string]string{}}
	switched, err := m.switchTo(ctx, r)
	res.times = append(res.times, switched...)
	if err != nil {
		res.errs = append(res.errs, "switch: "+err.Error())
	}
	if err := m.restartCSI(ctx); err != nil {
		res.errs = append(res.errs, "CSI driver: "+err.Error())
	}
	for _, s := range services {
		got, err := m.runningRelease(s)
		res.versions[s] = got
		if err != nil {
			res.errs = append(res.errs, err.Error())
		} else if want := releaseName(r.prev[s]); got != want {
			res.errs = append(res.errs, fmt.Sprintf("%s runs %s, want %s", s, got, want))
		}
	}
	st := &rowState{ns: fmt.Sprintf("skew-%d", i), prev: r.prev, last: i == m.last, carried: m.carried, inFlight: m.inFlight}
	m.carried, m.inFlight = nil, nil
	for _, c := range checks {
		if res.failed() {
			res.cells = append(res.cells, "-")
			continue
		}
		t0 := time.Now()
		err := c.run(m, ctx, st)
		if errors.Is(err, errNotApplicable) {
			res.cells = append(res.cells, "n/a")
			continue
		}
		if err != nil {
			res.cells = append(res.cells, "FAIL")
			res.errs = append(res.errs, c.name+": "+err.Error())
			continue
		}
		res.cells = append(res.cells, "ok")
		res.times = append(res.times, c.name+" "+time.Since(t0).Round(100*time.Millisecond).String())
	}
	m.carried, m.inFlight = st.dynamic, st.left
	res.took = time.Since(start)
	return res
}

func releaseName(prev bool) string {
	if prev {
		return "prev"
	}
	return "HEAD"
}

// switchTo restarts, one at a time in the upgrade order, each service
// whose release differs from the row's, and waits until it serves; it
// says how long each took to stop and to serve again.
func (m *matrix) switchTo(ctx context.Context, r row) ([]string, error) {
	var took []string
	for _, s := range services {
		dir := m.head
		if r.prev[s] {
			dir = m.prev
		}
		rep := m.c.Replicas(s)[0]
		want := filepath.Join(dir, s)
		if rep.Binary() == want {
			continue
		}
		t0 := time.Now()
		rep.Stop()
		stopped := time.Since(t0)
		rep.SetBinary(want)
		if err := rep.Start(); err != nil {
			return took, err
		}
		if err := m.c.WaitServing(ctx, rep, 2*time.Minute); err != nil {
			return took, err
		}
		took = append(took, fmt.Sprintf("%s stopped in %s, serving in %s", s, stopped.Round(100*time.Millisecond),
			(time.Since(t0)-stopped).Round(100*time.Millisecond)))
	}
	return took, nil
}

// startLine finds a run's startup log line, its version and commit
// (pkg/cmdutil: msg=starting ... version=... commit=...).
var startLine = regexp.MustCompile(`msg=starting .*version=(\S+) commit=(\S+)`)

// runningRelease reads the release of service's running process from its
// log: the last run's startup line.
func (m *matrix) runningRelease(service string) (string, error) {
	rep := m.c.Replicas(service)[0]
	var last []string
	err := poll(m.t.Context(), checkTimeout, func() string {
		b, err := os.ReadFile(rep.LogPath())
		if err != nil {
			return err.Error()
		}
		runs := strings.Split(string(b), "==== "+rep.Name+": start ")
		found := startLine.FindAllStringSubmatch(runs[len(runs)-1], -1)
		if len(found) == 0 {
			return "no startup line in the current run's log yet"
		}
		last = found[len(found)-1][1:]
		return ""
	})
	if err != nil {
		return "?", fmt.Errorf("%s: %w", service, err)
	}
	return releaseName(last[0] == prevVersion && last[1] == m.prevCommit), nil
}

// staticBind binds a claim to a free hostPath volume made for it.
func (m *matrix) staticBind(ctx context.Context, st *rowState) error {
	cl := m.c.Client
	if _, err := cl.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: st.ns}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	st.static = st.ns + "-static"
	path := filepath.Join(m.c.HostPath, st.static)
	if err := os.MkdirAll(path, 0o755); err != nil {
		return err
	}
	pv := e2e.Volume(st.static, "1Gi", staticClass)
	pv.Spec.HostPath.Path = path
	if _, err := cl.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		return err
	}
	claim, err := m.claim(ctx, st.ns, "static", staticClass)
	if err != nil {
		return err
	}
	return m.bound(ctx, claim, st.static)
}

// provision has the dev CSI driver make a volume for a claim.
func (m *matrix) provision(ctx context.Context, st *rowState) error {
	claim, err := m.claim(ctx, st.ns, "dynamic", dynamicClass)
	if err != nil {
		return err
	}
	name := "pvc-" + string(claim.UID)
	if err := m.bound(ctx, claim, name); err != nil {
		return err
	}
	pv, err := m.c.Client.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != devcsi.DefaultName {
		return fmt.Errorf("volume %s is not the dev CSI driver's: %+v", name, pv.Spec.PersistentVolumeSource)
	}
	if !m.hasCSIVolume(name) {
		return fmt.Errorf("the dev CSI driver has no volume %s", name)
	}
	st.dynamic = claim
	return nil
}

// reclaimOwn provisions a second claim and deletes it: a volume made and
// reclaimed under the row's releases (provision's claim stays Bound, for
// the next row to delete).
func (m *matrix) reclaimOwn(ctx context.Context, st *rowState) error {
	claim, err := m.claim(ctx, st.ns, "deleted", dynamicClass)
	if err != nil {
		return err
	}
	if err := m.bound(ctx, claim, "pvc-"+string(claim.UID)); err != nil {
		return err
	}
	return m.deleteAndReclaim(ctx, claim)
}

// reclaimCarried deletes the claim the previous row provisioned under its
// releases.
func (m *matrix) reclaimCarried(ctx context.Context, st *rowState) error {
	if st.carried == nil {
		return errNotApplicable // the first row
	}
	return m.deleteAndReclaim(ctx, st.carried)
}

// deleteAndReclaim deletes a provisioned claim and waits until its
// volume and the driver's backing volume are gone.
func (m *matrix) deleteAndReclaim(ctx context.Context, claim *corev1.PersistentVolumeClaim) error {
	if err := m.c.Client.CoreV1().PersistentVolumeClaims(claim.Namespace).Delete(ctx, claim.Name, metav1.DeleteOptions{}); err != nil {
		return err
	}
	m.book.Deleted(claim.UID, claim.Namespace+"/"+claim.Name)
	return m.reclaimed(ctx, claim)
}

// reclaimed waits until a deleted provisioned claim's volume and the
// driver's backing volume are gone.
func (m *matrix) reclaimed(ctx context.Context, claim *corev1.PersistentVolumeClaim) error {
	name := "pvc-" + string(claim.UID)
	return poll(ctx, checkTimeout, func() string {
		pv, err := m.c.Client.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			return fmt.Sprintf("PV %s still exists (%s)", name, pv.Status.Phase)
		}
		if !apierrors.IsNotFound(err) {
			return err.Error()
		}
		if m.hasCSIVolume(name) {
			return "the CSI volume " + name + " still exists"
		}
		return ""
	})
}

// claim creates a 1Gi claim of class and books it.
func (m *matrix) claim(ctx context.Context, ns, name, class string) (*corev1.PersistentVolumeClaim, error) {
	got, err := m.c.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, e2e.Claim(ns, name, "1Gi", class), metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	m.book.Created(got, class == dynamicClass)
	return got, nil
}

// bound waits until claim is Bound to volume and volume is Bound.
func (m *matrix) bound(ctx context.Context, claim *corev1.PersistentVolumeClaim, volume string) error {
	return poll(ctx, checkTimeout, func() string {
		got, err := m.c.Client.CoreV1().PersistentVolumeClaims(claim.Namespace).Get(ctx, claim.Name, metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if got.Status.Phase != corev1.ClaimBound || got.Spec.VolumeName != volume {
			return fmt.Sprintf("claim %s/%s is %q on %q, want Bound to %s", claim.Namespace, claim.Name, got.Status.Phase, got.Spec.VolumeName, volume)
		}
		pv, err := m.c.Client.CoreV1().PersistentVolumes().Get(ctx, volume, metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if pv.Status.Phase != corev1.VolumeBound || pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.UID != claim.UID {
			return fmt.Sprintf("volume %s is %q, claimRef %v", volume, pv.Status.Phase, pv.Spec.ClaimRef)
		}
		return ""
	})
}

func (m *matrix) hasCSIVolume(name string) bool {
	vols, err := m.c.CSIVolumes()
	if err != nil {
		return true // unknown: keep waiting
	}
	for _, n := range vols {
		if n == name {
			return true
		}
	}
	return false
}

// gatewayREST asks the gateway something of every service: the watcher's
// status, the row's static claim (the binder), the drivers and operations
// (the provisioner), the reclaims (the reclaimer).
func (m *matrix) gatewayREST(ctx context.Context, st *rowState) error {
	client, err := m.gatewayClient()
	if err != nil {
		return err
	}
	return poll(ctx, checkTimeout, func() string {
		for _, p := range []struct{ path, want string }{
			{"/v1/watcher/status", ""},
			{"/v1/namespaces/" + st.ns + "/claims/static", `"volumeName":"` + st.static + `"`},
			{"/v1/drivers", `"driverName":"` + devcsi.DefaultName + `"`},
			{"/v1/provisioner/operations", ""},
			{"/v1/reclaims", ""},
		} {
			code, body, err := m.get(ctx, client, p.path)
			if err != nil {
				return p.path + ": " + err.Error()
			}
			if code != http.StatusOK || !strings.Contains(body, p.want) {
				return fmt.Sprintf("GET %s: %d %s (want 200 with %s)", p.path, code, body, p.want)
			}
			if !json.Valid([]byte(body)) {
				return fmt.Sprintf("GET %s: not JSON: %s", p.path, body)
			}
		}
		return ""
	})
}

// gatewayClient trusts the services' CA, which signed the gateway's
// serving certificate.
func (m *matrix) gatewayClient() (*http.Client, error) {
	ca, err := os.ReadFile(m.c.TLS["gateway"].CAFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("no certificate in %s", m.c.TLS["gateway"].CAFile)
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}, nil
}

// get is a GET of the gateway as the cluster's admin (its bearer token,
// which the gateway checks with a TokenReview).
func (m *matrix) get(ctx context.Context, client *http.Client, path string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.c.GatewayURL+path, nil)
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Authorization", "Bearer "+m.c.API.RESTConfig.BearerToken)
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// invariants waits until the chaos run's invariants hold of the whole
// cluster: every live claim (of every row so far) Bound to one volume, no
// backing volume without a PV or journal record, no journal record left,
// the deleted claims' volumes gone, the binder's cache equal to the API.
func (m *matrix) invariants(ctx context.Context, _ *rowState) error {
	return poll(ctx, checkTimeout, func() string {
		res, err := chaos.Check(ctx, m.c, m.book)
		if err != nil {
			return err.Error()
		}
		if f := res.Failing(); len(f) > 0 {
			return strings.Join(f, "; ")
		}
		return ""
	})
}

// poll calls cond until it returns "" or timeout passes (then the last
// reason is the error).
func poll(ctx context.Context, timeout time.Duration, cond func() string) error {
	deadline := time.Now().Add(timeout)
	for {
		last := cond()
		if last == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %s: %s", timeout, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
