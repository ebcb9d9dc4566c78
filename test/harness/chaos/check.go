package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/kube"
	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
)

// Book is what a run did, for the checks: the claims it made and deleted,
// and the marker files it wrote into bound volumes. Safe for concurrent
// use.
type Book struct {
	mu      sync.Mutex
	static  map[types.UID]string // claim UID: namespace/name
	dynamic map[types.UID]string
	deleted map[types.UID]string
	markers map[types.UID]marker
	// recreated: a claim made under the name of a deleted one, by UID,
	// to the deleted one's UID.
	recreated map[types.UID]types.UID
}

// marker is a file written into a claim's volume while the claim was
// Bound to it: as long as the claim lives, the file must stay.
type marker struct {
	claim  string // namespace/name
	volume string
	path   string
}

// NewBook returns an empty Book.
func NewBook() *Book {
	return &Book{static: map[types.UID]string{}, dynamic: map[types.UID]string{}, deleted: map[types.UID]string{}, markers: map[types.UID]marker{},
		recreated: map[types.UID]types.UID{}}
}

// Created records a claim the run made; dynamic says it asks for a
// provisioned volume (of DynamicClass, whose volumes are deleted with
// their claims, or of RetainClass).
func (b *Book) Created(c *corev1.PersistentVolumeClaim, dynamic bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if dynamic {
		b.dynamic[c.UID] = c.Namespace + "/" + c.Name
	} else {
		b.static[c.UID] = c.Namespace + "/" + c.Name
	}
}

// Deleted records a claim the run deleted.
func (b *Book) Deleted(uid types.UID, key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.deleted[uid] = key
}

// Recreated records that claim uid was made under the name of the
// deleted claim old.
func (b *Book) Recreated(uid, old types.UID) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.recreated[uid] = old
}

// Recreations is how many claims were made under a deleted one's name.
func (b *Book) Recreations() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.recreated)
}

// Counts says how many claims the run made and deleted.
func (b *Book) Counts() (static, dynamic, deleted, markers int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.static), len(b.dynamic), len(b.deleted), len(b.markers)
}

// VolumeDir is where the volume's data lives on this machine: a hostPath
// volume's path, or the dev CSI driver's directory of a CSI volume; "" for
// another kind.
func (c *Cluster) VolumeDir(pv *corev1.PersistentVolume) string {
	switch {
	case pv.Spec.HostPath != nil:
		return pv.Spec.HostPath.Path
	case pv.Spec.CSI != nil:
		return filepath.Join(c.CSIRoot, "volumes", pv.Spec.CSI.VolumeHandle)
	}
	return ""
}

// MarkBound writes a marker file into the volume of every live claim
// that is Bound and has none yet: the claim's UID, in a file named after
// it. The claim and volume are re-read from the API right before, so a
// marker is written only while the claim is Bound to that volume.
func (b *Book) MarkBound(ctx context.Context, c *Cluster) error {
	claims, err := c.Client.CoreV1().PersistentVolumeClaims(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for i := range claims.Items {
		cl := &claims.Items[i]
		b.mu.Lock()
		_, done := b.markers[cl.UID]
		b.mu.Unlock()
		if done || cl.Status.Phase != corev1.ClaimBound || cl.DeletionTimestamp != nil || cl.Spec.VolumeName == "" {
			continue
		}
		pv, err := c.Client.CoreV1().PersistentVolumes().Get(ctx, cl.Spec.VolumeName, metav1.GetOptions{})
		if err != nil || pv.Status.Phase != corev1.VolumeBound || pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.UID != cl.UID {
			continue
		}
		dir := c.VolumeDir(pv)
		if dir == "" {
			continue
		}
		path := filepath.Join(dir, "chaos-marker-"+string(cl.UID))
		if err := os.WriteFile(path, []byte(cl.UID), 0o644); err != nil {
			continue // the directory is not there (yet): next pass
		}
		b.mu.Lock()
		b.markers[cl.UID] = marker{claim: cl.Namespace + "/" + cl.Name, volume: pv.Name, path: path}
		b.mu.Unlock()
	}
	return nil
}

// Row is one invariant of the table.
type Row struct {
	// Invariant names what is checked.
	Invariant string
	// Count is how many objects break it (0 holds).
	Count int
	// Examples name a few of them.
	Examples []string
	// Info, when set, is the row's value instead of a count (a
	// measurement, not a violation).
	Info string
}

// Result is the invariant table.
type Result struct {
	Rows []Row
}

// Violations is the number of rows that do not hold.
func (r Result) Violations() int {
	n := 0
	for _, row := range r.Rows {
		if row.Count > 0 {
			n++
		}
	}
	return n
}

// Failing names the rows that do not hold.
func (r Result) Failing() []string {
	var out []string
	for _, row := range r.Rows {
		if row.Count > 0 {
			out = append(out, fmt.Sprintf("%s: %d (%s)", row.Invariant, row.Count, strings.Join(row.Examples, "; ")))
		}
	}
	return out
}

// Print writes the table.
func (r Result) Print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "INVARIANT\tVIOLATIONS\tEXAMPLES")
	for _, row := range r.Rows {
		v := fmt.Sprint(row.Count)
		if row.Info != "" {
			v = row.Info
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", row.Invariant, v, strings.Join(row.Examples, "; "))
	}
	tw.Flush()
}

func (r *Result) add(invariant string, bad []string) {
	sort.Strings(bad)
	ex := bad
	if len(ex) > 3 {
		ex = append(slices.Clone(ex[:3]), fmt.Sprintf("and %d more", len(bad)-3))
	}
	r.Rows = append(r.Rows, Row{Invariant: invariant, Count: len(bad), Examples: ex})
}

// Invariant names, in the table's order.
const (
	InvClaimTwoVolumes    = "claims bound to two volumes"
	InvVolumeTwoClaims    = "volumes bound to two claims"
	InvClaimNotBound      = "live claims not Bound"
	InvOrphanVolumes      = "CSI volumes with neither PV nor journal record"
	InvDeletedLeft        = "deleted claims' volumes left (Delete)"
	InvRecycleNotDone     = "Recycle volumes left Released or Failed"
	InvJournalLeft        = "journal records left (provision, reclaim)"
	InvDataLost           = "data of a live claim deleted or scrubbed"
	InvBinderCache        = "binder caches differing from the API"
	InvFlips              = "Released/Failed->Bound flips seen by a watch"
	InvConvergence        = "time to converge after the last fault"
	provisionJournalKey   = "/volplane/journal/provision/"
	reclaimJournalKey     = "/volplane/journal/reclaim/"
	provisionedNamePrefix = "pvc-"
)

// Check checks every invariant that holds of a converged cluster once
// (the flips and the convergence time are the run's, added by Run).
func Check(ctx context.Context, c *Cluster, b *Book) (Result, error) {
	var res Result
	claimList, err := c.Client.CoreV1().PersistentVolumeClaims(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return res, fmt.Errorf("list claims: %w", err)
	}
	pvList, err := c.Client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return res, fmt.Errorf("list volumes: %w", err)
	}
	claims := map[types.UID]*corev1.PersistentVolumeClaim{}
	for i := range claimList.Items {
		claims[claimList.Items[i].UID] = &claimList.Items[i]
	}
	pvs := map[string]*corev1.PersistentVolume{}
	for i := range pvList.Items {
		pvs[pvList.Items[i].Name] = &pvList.Items[i]
	}

	// Bound twice, either way.
	var two, twoClaims, notBound []string
	boundTo := map[types.UID][]string{}
	for _, pv := range pvs {
		if ref := pv.Spec.ClaimRef; ref != nil && ref.UID != "" && pv.Status.Phase == corev1.VolumeBound {
			boundTo[ref.UID] = append(boundTo[ref.UID], pv.Name)
		}
	}
	askedBy := map[string][]string{}
	for _, cl := range claims {
		if vs := boundTo[cl.UID]; len(vs) > 1 {
			sort.Strings(vs)
			two = append(two, fmt.Sprintf("%s/%s: %s", cl.Namespace, cl.Name, strings.Join(vs, ",")))
		}
		if cl.Spec.VolumeName != "" && cl.Annotations[kube.AnnBindCompleted] != "" {
			askedBy[cl.Spec.VolumeName] = append(askedBy[cl.Spec.VolumeName], cl.Namespace+"/"+cl.Name)
		}
		if cl.DeletionTimestamp == nil && cl.Status.Phase != corev1.ClaimBound {
			notBound = append(notBound, fmt.Sprintf("%s/%s %s", cl.Namespace, cl.Name, phaseOr(string(cl.Status.Phase))))
		}
	}
	for v, cs := range askedBy {
		if len(cs) > 1 {
			sort.Strings(cs)
			twoClaims = append(twoClaims, v+": "+strings.Join(cs, ","))
		}
	}
	res.add(InvClaimTwoVolumes, two)
	res.add(InvVolumeTwoClaims, twoClaims)
	res.add(InvClaimNotBound, notBound)

	// The driver's volumes against the PVs and the journal.
	journal, err := c.journalNames(ctx)
	if err != nil {
		return res, err
	}
	vols, err := c.CSIVolumes()
	if err != nil {
		return res, err
	}
	handles := map[string]bool{}
	for _, pv := range pvs {
		if pv.Spec.CSI != nil {
			handles[pv.Spec.CSI.VolumeHandle] = true
		}
	}
	var orphans []string
	byName := map[string]bool{}
	for id, name := range vols {
		byName[name] = true
		if !handles[id] && !journal[name] {
			orphans = append(orphans, name+" ("+id+")")
		}
	}
	res.add(InvOrphanVolumes, orphans)

	var left []string
	b.mu.Lock()
	for uid, key := range b.deleted {
		if _, dyn := b.dynamic[uid]; !dyn {
			continue
		}
		if pv := pvs[provisionedNamePrefix+string(uid)]; pv != nil && pv.Spec.StorageClassName == RetainClass {
			continue // Retain: kept, for a rebind or an administrator
		}
		if _, live := claims[uid]; live {
			continue // its deletion is not over (a finalizer)
		}
		name := provisionedNamePrefix + string(uid)
		if pvs[name] != nil {
			left = append(left, fmt.Sprintf("PV %s of %s (%s)", name, key, pvs[name].Status.Phase))
		}
		if byName[name] {
			left = append(left, fmt.Sprintf("CSI volume %s of %s", name, key))
		}
	}
	b.mu.Unlock()
	res.add(InvDeletedLeft, left)

	var recycle []string
	for _, pv := range pvs {
		if pv.Spec.PersistentVolumeReclaimPolicy == corev1.PersistentVolumeReclaimRecycle &&
			(pv.Status.Phase == corev1.VolumeReleased || pv.Status.Phase == corev1.VolumeFailed) {
			recycle = append(recycle, fmt.Sprintf("%s %s: %s", pv.Name, pv.Status.Phase, pv.Status.Message))
		}
	}
	res.add(InvRecycleNotDone, recycle)

	var recs []string
	for n := range journal {
		recs = append(recs, n)
	}
	res.add(InvJournalLeft, recs)

	// Markers of live claims.
	var lost []string
	b.mu.Lock()
	for uid, m := range b.markers {
		cl := claims[uid]
		if cl == nil || cl.DeletionTimestamp != nil {
			continue
		}
		if cl.Spec.VolumeName != m.volume {
			lost = append(lost, fmt.Sprintf("%s moved from %s to %q", m.claim, m.volume, cl.Spec.VolumeName))
			continue
		}
		if _, err := os.Stat(m.path); err != nil {
			lost = append(lost, fmt.Sprintf("%s: marker in %s gone", m.claim, m.volume))
		}
	}
	b.mu.Unlock()
	res.add(InvDataLost, lost)

	// Every binder's cache, through its own API.
	var caches []string
	for _, r := range c.Replicas("binder") {
		diff, err := c.binderDiff(ctx, r, claims, pvs)
		if err != nil {
			diff = []string{err.Error()}
		}
		for _, d := range diff {
			caches = append(caches, r.Name+": "+d)
		}
	}
	res.add(InvBinderCache, caches)
	return res, nil
}

func phaseOr(p string) string {
	if p == "" {
		return "(no phase)"
	}
	return p
}

// JournalNames is journalNames, for the tests that check the journal
// themselves (test/e2e/standalone).
func (c *Cluster) JournalNames(ctx context.Context) (map[string]bool, error) {
	return c.journalNames(ctx)
}

// journalNames lists the journal records in etcd of provisionings and of
// reclaims (whose record is also the journal of a backing volume's
// deletion), by volume name.
func (c *Cluster) journalNames(ctx context.Context) (map[string]bool, error) {
	cli, err := c.EtcdClient()
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	out := map[string]bool{}
	for _, prefix := range []string{provisionJournalKey, reclaimJournalKey} {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		resp, err := cli.Get(cctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		cancel()
		if err != nil {
			return nil, fmt.Errorf("read the journal from etcd: %w", err)
		}
		for _, kv := range resp.Kvs {
			out[strings.TrimPrefix(string(kv.Key), prefix)] = true
		}
	}
	return out, nil
}

// CSIVolumeStates reads the dev CSI driver's volumes from its state
// files, by ID, each as the driver records it (name, capacity, node,
// parameters, source): what CreateVolume asked for, for comparisons.
func (c *Cluster) CSIVolumeStates() (map[string]map[string]any, error) {
	dir := filepath.Join(c.CSIRoot, "state", "volumes")
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	out := map[string]map[string]any{}
	for _, e := range entries {
		raw, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if !strings.HasSuffix(e.Name(), ".json") || errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		var v map[string]any
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, fmt.Errorf("CSI driver state %s: %w", e.Name(), err)
		}
		id, _ := v["id"].(string)
		out[id] = v
	}
	return out, nil
}

// CSIVolumes lists the dev CSI driver's volumes from its state files: ID
// to name.
func (c *Cluster) CSIVolumes() (map[string]string, error) {
	dir := filepath.Join(c.CSIRoot, "state", "volumes")
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return map[string]string{}, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		raw, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if errors.Is(err, os.ErrNotExist) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, err
		}
		var v struct {
			ID   string `json:"id"`
			Name string `json:"name"`
		}
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, fmt.Errorf("CSI driver state %s: %w", e.Name(), err)
		}
		out[v.ID] = v.Name
	}
	return out, nil
}

// binderDiff compares one binder replica's cache, read through its own
// ListClaims and ListVolumes, with the API's objects: the same keys, UIDs
// and resourceVersions.
func (c *Cluster) binderDiff(ctx context.Context, r *Replica, claims map[types.UID]*corev1.PersistentVolumeClaim, pvs map[string]*corev1.PersistentVolume) ([]string, error) {
	cc, err := grpcutil.Dial(r.Addr, c.TLS[Client])
	if err != nil {
		return nil, err
	}
	defer cc.Close()
	bc := binderv1.NewBinderServiceClient(cc)
	want := map[string]string{}
	for _, cl := range claims {
		want["claim "+cl.Namespace+"/"+cl.Name] = string(cl.UID) + "@" + cl.ResourceVersion
	}
	for _, pv := range pvs {
		want["volume "+pv.Name] = string(pv.UID) + "@" + pv.ResourceVersion
	}
	got := map[string]string{}
	token := ""
	for {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		resp, err := bc.ListClaims(cctx, &binderv1.ListClaimsRequest{PageSize: 5000, PageToken: token})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("ListClaims: %w", err)
		}
		for _, cl := range resp.GetClaims() {
			got["claim "+cl.GetNamespace()+"/"+cl.GetName()] = cl.GetUid() + "@" + cl.GetResourceVersion()
		}
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
	}
	for {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		resp, err := bc.ListVolumes(cctx, &binderv1.ListVolumesRequest{PageSize: 5000, PageToken: token})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("ListVolumes: %w", err)
		}
		for _, v := range resp.GetVolumes() {
			got["volume "+v.GetName()] = v.GetUid() + "@" + v.GetResourceVersion()
		}
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
	}
	var diff []string
	for k, w := range want {
		if g, ok := got[k]; !ok {
			diff = append(diff, k+" missing")
		} else if g != w {
			diff = append(diff, fmt.Sprintf("%s is %s, the API has %s", k, g, w))
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			diff = append(diff, fmt.Sprintf("%s (%s) is not in the API (a zombie)", k, g))
		}
	}
	sort.Strings(diff)
	return diff, nil
}
