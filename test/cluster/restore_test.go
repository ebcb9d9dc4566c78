package cluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// restoreDrill is TestCluster's phase etcd-restore: docs/etcd.md's backup
// and restore, run as an operator would after losing every member. The
// base's backup (on by default: a CronJob exporting volplane's keys into
// the Secret volplane-etcd-backup, its certificate volplane-certs'), run
// by a Job of it while a reclaim is in flight (the provisioner scaled to
// 0, so the reclaimer's journal record waits) and with a marker key no
// replica writes; every member's pod killed at once as by a power loss,
// which loses nothing (powerLoss); every etcd pod deleted at once, so
// every member's data (an emptyDir) is gone and the three bootstrap a
// new, empty cluster; the restore Job of docs/etcd.md, from the Secret;
// then the marker and the journal record back, the provisioner back, the
// reclaim finished with no volume leaked, every claim bound before still
// Bound, and a new claim bound.
type restoreDrill struct {
	ns          string
	marker      string
	gone        string // the PV whose reclaim is in flight at the snapshot
	keep        map[string]string
	provisioner int // the provisioner's replicas before the drill
}

// testRestoreDrill runs the drill's steps in order, on one namespace, and
// logs a row per step (what it saw and how long it took) as the phases'
// steps do.
func testRestoreDrill(t *testing.T) {
	d := &restoreDrill{marker: "/volplane/drill/" + randomSuffix(), keep: map[string]string{}}
	steps := []step{
		{"claims bound; the base's backup CronJob there", d.setUp},
		{"a reclaim in flight: provisioner at 0, a claim deleted", d.reclaimInFlight},
		{"an export into the Secret by a Job of the CronJob, with a marker key", d.backup},
		{"every etcd pod's processes killed at once (a power loss): data kept", d.powerLoss},
		{"every etcd pod deleted at once: every member's data gone", d.destroy},
		{"docs/etcd.md's restore Job, from the Secret", d.restore},
		{"marker and journal record back; provisioner back; reclaim done", d.check},
		{"claims of before Bound, a new claim binds, nothing leaked", d.after},
		{"drill's Jobs and marker deleted", d.cleanup},
	}
	rows := [][]string{{"STEP", "TOOK", "WHAT WAS SEEN"}}
	defer func() { t.Logf("etcd restore drill:\n%s", table(rows)) }()
	for _, st := range steps {
		began := time.Now()
		saw := st.f(t)
		rows = append(rows, []string{st.name, time.Since(began).Round(time.Second).String(), saw})
		if t.Failed() {
			return
		}
	}
}

func (d *restoreDrill) setUp(t *testing.T) string {
	requireVolplaneReady(t)
	d.ns = c.Namespace(t)
	c.Kubectl(t, "-n", volplaneNS, "get", "cronjob/volplane-etcd-backup", "secret/volplane-etcd-backup")
	t.Cleanup(func() { // on a failure too, so that the phases after it find no drill's object
		for _, obj := range []string{"job/volplane-etcd-drill-backup", "job/volplane-etcd-restore"} {
			if out, err := c.Run(context.Background(), "", "-n", volplaneNS, "delete", obj, "--ignore-not-found", "--wait=true"); err != nil {
				t.Errorf("deleting %s: %v %s", obj, err, out)
			}
		}
	})
	for i := range 3 {
		name := fmt.Sprintf("keep-%d", i)
		createClaim(t, d.ns, name)
		d.keep[name] = waitClaimBound(t, d.ns, name, 3*time.Minute)
	}
	createClaim(t, d.ns, "gone")
	d.gone = waitClaimBound(t, d.ns, "gone", 3*time.Minute)
	return fmt.Sprintf("CronJob and Secret volplane-etcd-backup there (the base's); claims keep-0..2 and gone Bound (gone's PV %s)", d.gone)
}

func (d *restoreDrill) reclaimInFlight(t *testing.T) string {
	dep, err := c.Client.AppsV1().Deployments(volplaneNS).Get(t.Context(), "volplane-provisioner", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d.provisioner = int(*dep.Spec.Replicas)
	c.Kubectl(t, "-n", volplaneNS, "scale", "deployment/volplane-provisioner", "--replicas=0")
	t.Cleanup(func() { // should a step fail before check scales it back (t's context is done by now)
		if out, err := c.Run(context.Background(), "", "-n", volplaneNS, "scale", "deployment/volplane-provisioner", "--replicas="+strconv.Itoa(d.provisioner)); err != nil {
			t.Errorf("scaling the provisioner back: %v %s", err, out)
		}
	})
	waitFor(t, 2*time.Minute, func() string {
		if n := len(listPods(t, volplaneNS, "app=volplane-provisioner")); n > 0 {
			return fmt.Sprintf("%d provisioner pods left", n)
		}
		return ""
	})
	c.Kubectl(t, "-n", d.ns, "delete", "pvc", "gone", "--wait=false")
	waitFor(t, 2*time.Minute, func() string { return journalRecordOf(t, d.gone) })
	return fmt.Sprintf("provisioner 0/%d; the journal holds the reclaim of %s", d.provisioner, d.gone)
}

func (d *restoreDrill) backup(t *testing.T) string {
	if err := etcdPut(t, d.marker, "written before the snapshot"); err != nil {
		t.Fatalf("put %s: %v", d.marker, err)
	}
	// The CronJob's Job, as kubectl create job --from=cronjob makes it,
	// but not owned by the CronJob, whose controller would delete it with
	// its oldest once past its history limit, maybe before its log is read.
	var job map[string]any
	if err := json.Unmarshal([]byte(c.Kubectl(t, "-n", volplaneNS, "create", "job", "volplane-etcd-drill-backup",
		"--from=cronjob/volplane-etcd-backup", "--dry-run=client", "-o", "json")), &job); err != nil {
		t.Fatal(err)
	}
	delete(job["metadata"].(map[string]any), "ownerReferences")
	manifest, err := json.Marshal(job)
	if err != nil {
		t.Fatal(err)
	}
	c.Apply(t, volplaneNS, string(manifest))
	log := jobLog(t, "volplane-etcd-drill-backup")
	m := regexp.MustCompile(`etcd keys exported.*`).FindString(log)
	if m == "" {
		t.Fatalf("the backup Job's log says no export:\n%s", log)
	}
	return m
}

func (d *restoreDrill) destroy(t *testing.T) string {
	oldPods := map[string]types.UID{}
	pods, err := c.Client.CoreV1().Pods(volplaneNS).List(t.Context(), metav1.ListOptions{LabelSelector: "app=volplane-etcd"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		oldPods[p.Name] = p.UID
	}
	began := time.Now()
	c.Kubectl(t, "-n", volplaneNS, "delete", "pod", "-l", "app=volplane-etcd", "--wait=false")
	waitFor(t, 5*time.Minute, func() string {
		pods, err := c.Client.CoreV1().Pods(volplaneNS).List(t.Context(), metav1.ListOptions{LabelSelector: "app=volplane-etcd"})
		if err != nil {
			return err.Error()
		}
		fresh := 0
		for _, p := range pods.Items {
			if p.UID != oldPods[p.Name] && p.DeletionTimestamp == nil && podReady(&p) {
				fresh++
			}
		}
		if fresh != len(oldPods) {
			return fmt.Sprintf("%d of %d new etcd members Ready", fresh, len(oldPods))
		}
		return ""
	})
	took := time.Since(began).Round(time.Second)
	var kvs map[string]string
	waitFor(t, 2*time.Minute, func() string { // the new members' leader elected
		var err error
		kvs, err = etcdRange(t, d.marker, false)
		return errOrEmpty(err)
	})
	if _, ok := kvs[d.marker]; ok {
		t.Fatalf("%s is still there after every etcd pod was deleted: the members' data was not destroyed", d.marker)
	}
	return fmt.Sprintf("%d new members Ready after %v, the marker gone: an empty cluster", len(oldPods), took)
}

// restoreJob is docs/etcd.md's restore Job, from the Secret of the
// backups.
func restoreJob(t *testing.T) string {
	image := workloadImage(t, upgradeComponent{"etcd", "statefulset", "volplane-etcd"})
	return fmt.Sprintf(`apiVersion: batch/v1
kind: Job
metadata: {name: volplane-etcd-restore, namespace: volplane-system}
spec:
  backoffLimit: 3
  template:
    metadata: {labels: {app: volplane-etcd-backup}}
    spec:
      restartPolicy: OnFailure
      serviceAccountName: volplane-etcd-backup
      priorityClassName: volplane-critical
      securityContext: {runAsNonRoot: true, runAsUser: 65532, runAsGroup: 65532, fsGroup: 65532, seccompProfile: {type: RuntimeDefault}}
      containers:
        - name: restore
          image: %s
          imagePullPolicy: IfNotPresent
          securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}
          command:
            - /usr/local/bin/volplane-etcd-backup
            - --restore-secret=volplane-etcd-backup
            - --secret-namespace=volplane-system
            - --etcd-endpoints=https://volplane-etcd-0.volplane-etcd.volplane-system.svc:2379,https://volplane-etcd-1.volplane-etcd.volplane-system.svc:2379,https://volplane-etcd-2.volplane-etcd.volplane-system.svc:2379
            - --etcd-cacert=/etc/volplane/tls/ca.crt
            - --etcd-cert=/etc/volplane/tls/tls.crt
            - --etcd-key=/etc/volplane/tls/tls.key
          volumeMounts: [{name: tls, mountPath: /etc/volplane/tls, readOnly: true}]
      volumes:
        - {name: tls, secret: {secretName: volplane-etcd-backup-tls}}
`, image)
}

func (d *restoreDrill) restore(t *testing.T) string {
	c.Apply(t, volplaneNS, restoreJob(t))
	log := jobLog(t, "volplane-etcd-restore")
	if !strings.Contains(log, "etcd snapshot restored") {
		t.Fatalf("the restore Job's log does not say it restored:\n%s", log)
	}
	m := regexp.MustCompile(`written[=":]+(\d+)`).FindStringSubmatch(log)
	if m == nil || m[1] == "0" {
		t.Fatalf("the restore wrote nothing back into the empty cluster:\n%s", log)
	}
	line := log
	if i := strings.Index(log, "snapshot="); i >= 0 {
		line = log[i:]
	}
	return "restored: " + strings.TrimSpace(strings.SplitN(line, "\n", 2)[0])
}

func (d *restoreDrill) check(t *testing.T) string {
	kvs, err := etcdRange(t, d.marker, false)
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := kvs[d.marker]; !ok || v != "written before the snapshot" {
		t.Fatalf("%s after the restore: %q (there: %v), want the value written before the snapshot", d.marker, v, ok)
	}
	if msg := journalRecordOf(t, d.gone); msg != "" {
		t.Fatalf("after the restore: %s", msg)
	}
	c.Kubectl(t, "-n", volplaneNS, "scale", "deployment/volplane-provisioner", "--replicas="+strconv.Itoa(d.provisioner))
	waitFor(t, 5*time.Minute, func() string { return volplaneNotReady(t) })
	waitFor(t, 5*time.Minute, func() string {
		_, err := c.Client.CoreV1().PersistentVolumes().Get(t.Context(), d.gone, metav1.GetOptions{})
		if err == nil {
			return "PV " + d.gone + " still there"
		}
		for h, pv := range volumeHandles(t) {
			if pv == d.gone {
				return "PV " + d.gone + "'s volume " + h + " still there"
			}
		}
		return ""
	})
	return fmt.Sprintf("marker back; the reclaim of %s in the journal; provisioner %d/%d Ready; PV and volume gone", d.gone, d.provisioner, d.provisioner)
}

func (d *restoreDrill) after(t *testing.T) string {
	for name, pv := range d.keep {
		claim, err := c.Client.CoreV1().PersistentVolumeClaims(d.ns).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if claim.Status.Phase != corev1.ClaimBound || claim.Spec.VolumeName != pv {
			t.Errorf("claim %s: %s to %q, want Bound to %s as before the drill", name, claim.Status.Phase, claim.Spec.VolumeName, pv)
		}
	}
	createClaim(t, d.ns, "new")
	pv := waitClaimBound(t, d.ns, "new", 3*time.Minute)
	waitFor(t, 3*time.Minute, func() string {
		_, problems := driverVolumesAgainstPVs(t)
		return strings.Join(problems, "; ")
	})
	return fmt.Sprintf("keep-0..2 Bound to their PVs; claim new Bound to %s; every driver volume has its PV", pv)
}

func (d *restoreDrill) cleanup(t *testing.T) string {
	if err := etcdDelete(t, d.marker); err != nil {
		t.Error(err)
	}
	c.Kubectl(t, "-n", volplaneNS, "delete", "job", "volplane-etcd-drill-backup", "volplane-etcd-restore", "--ignore-not-found", "--wait=true")
	return "marker and the drill's Jobs deleted (the CronJob and its Secret are the base's)"
}

// journalRecordOf says why volplane's etcd has no journal record of pv
// ("" once it has one): a key under /volplane/journal/ ending in its name.
func journalRecordOf(t *testing.T, pv string) string {
	kvs, err := etcdRange(t, "/volplane/journal/", true)
	if err != nil {
		return err.Error()
	}
	var keys []string
	for k := range kvs {
		if strings.HasSuffix(k, "/"+pv) {
			return ""
		}
		keys = append(keys, k)
	}
	return fmt.Sprintf("no journal record of %s among %q", pv, keys)
}

// etcdCall posts body to path of volplane's etcd's JSON API (etcd's gRPC
// gateway, /v3/kv/...) as the backup job is its client: its certificate
// (volplane-etcd-backup-tls), the first member's address, and decodes
// the answer into out.
func etcdCall(t *testing.T, path string, body, out any) error {
	t.Helper()
	s, err := c.Client.CoreV1().Secrets(volplaneNS).Get(t.Context(), "volplane-etcd-backup-tls", metav1.GetOptions{})
	if err != nil {
		return err
	}
	cert, err := tls.X509KeyPair(s.Data["tls.crt"], s.Data["tls.key"])
	if err != nil {
		return err
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(s.Data["ca.crt"])
	const member = "volplane-etcd-0"
	p, err := c.Client.CoreV1().Pods(volplaneNS).Get(t.Context(), member, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if p.Status.PodIP == "" {
		return fmt.Errorf("etcd member %s has no address yet", member)
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		Certificates: []tls.Certificate{cert}, RootCAs: roots, MinVersion: tls.VersionTLS12,
		ServerName: member + ".volplane-etcd.volplane-system.svc",
	}}}
	defer hc.CloseIdleConnections()
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	resp, err := hc.Post("https://"+net.JoinHostPort(p.Status.PodIP, "2379")+path, "application/json", bytes.NewReader(b))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("etcd %s: %s: %s", path, resp.Status, raw)
	}
	return json.Unmarshal(raw, out)
}

// etcdRange reads key (every key under it, with prefix) from volplane's
// etcd: key to value.
func etcdRange(t *testing.T, key string, prefix bool) (map[string]string, error) {
	req := map[string]any{"key": []byte(key)}
	if prefix {
		req["range_end"] = []byte(clientv3.GetPrefixRangeEnd(key))
	}
	var resp struct {
		Kvs []struct{ Key, Value []byte } `json:"kvs"`
	}
	if err := etcdCall(t, "/v3/kv/range", req, &resp); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = string(kv.Value)
	}
	return out, nil
}

// etcdPut writes key=value into volplane's etcd, etcdDelete removes key.
func etcdPut(t *testing.T, key, value string) error {
	return etcdCall(t, "/v3/kv/put", map[string]any{"key": []byte(key), "value": []byte(value)}, &struct{}{})
}

func etcdDelete(t *testing.T, key string) error {
	return etcdCall(t, "/v3/kv/deleterange", map[string]any{"key": []byte(key)}, &struct{}{})
}

// jobLog waits for Job name of volplane-system to complete, returns its
// pods' log and deletes it.
func jobLog(t *testing.T, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	out, err := c.Run(ctx, "", "-n", volplaneNS, "wait", "--for=condition=complete", "--timeout=3m", "job/"+name)
	log, _ := c.Run(t.Context(), "", "-n", volplaneNS, "logs", "job/"+name)
	if err != nil {
		t.Fatalf("Job %s did not complete: %v %s\nits log:\n%s", name, err, out, log)
	}
	// Gone with its pod, which would count as a volplane pod not Ready.
	c.Kubectl(t, "-n", volplaneNS, "delete", "job", name, "--cascade=foreground", "--wait=true")
	return log
}

// createClaim creates a 1Mi claim of the dev driver's Immediate class.
func createClaim(t *testing.T, ns, name string) {
	t.Helper()
	claim := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: ptrTo(classImmediate),
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}},
		},
	}
	if _, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Create(t.Context(), claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitClaimBound waits for claim ns/name to be Bound and returns its PV.
func waitClaimBound(t *testing.T, ns, name string, timeout time.Duration) string {
	t.Helper()
	var pv string
	waitFor(t, timeout, func() string {
		claim, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if claim.Status.Phase != corev1.ClaimBound {
			return fmt.Sprintf("claim %s/%s is %s", ns, name, claim.Status.Phase)
		}
		pv = claim.Spec.VolumeName
		return ""
	})
	return pv
}
