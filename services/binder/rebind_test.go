package binder

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/pkg/kube"
	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
)

// rebindClass is class "c" (provisioner "p", Immediate) with the rebind
// policy, none when policy is "".
func rebindClass(policy string) *storagev1.StorageClass {
	sc := class("c", "p", storagev1.VolumeBindingImmediate, false)
	if policy != "" {
		sc.Annotations = map[string]string{AnnRebindReleased: policy}
	}
	return sc
}

// fakeJournal holds reclaim records of the volumes named.
type fakeJournal struct {
	records map[string]bool
	err     error
}

func journalOf(volumes ...string) *fakeJournal {
	j := &fakeJournal{records: map[string]bool{}}
	for _, v := range volumes {
		j.records[v] = true
	}
	return j
}

func (j *fakeJournal) Get(_ context.Context, kind, name string) (coord.Record, bool, error) {
	if j.err != nil {
		return coord.Record{}, false, j.err
	}
	if kind != "reclaim" || !j.records[name] {
		return coord.Record{}, false, nil
	}
	return coord.Record{Kind: kind, Name: name, Holder: "reclaimer-1"}, true, nil
}

// The rebind rows of decide: which Released volume a recreated claim gets
// back, and what explain says when the policy allowed one that is not.
func TestDecideRebind(t *testing.T) {
	released := func(uid types.UID, p corev1.PersistentVolumeReclaimPolicy) func(*corev1.PersistentVolume) {
		return func(v *corev1.PersistentVolume) {
			v.Spec.ClaimRef = &corev1.ObjectReference{Namespace: "ns", Name: "data", UID: uid}
			v.Spec.PersistentVolumeReclaimPolicy = p
			v.Status.Phase = corev1.VolumeReleased
		}
	}
	retained := released("uid-old", corev1.PersistentVolumeReclaimRetain)
	on := func(v *corev1.PersistentVolume) { annotate(v, AnnRebindReleased, RebindSameClaimName) }
	rwx := func(c *corev1.PersistentVolumeClaim) {
		c.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}
	}
	block := func(c *corev1.PersistentVolumeClaim) { m := corev1.PersistentVolumeBlock; c.Spec.VolumeMode = &m }
	onNode := func(n string) func(*corev1.PersistentVolume) {
		return func(v *corev1.PersistentVolume) {
			v.Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: []string{n}}}}}}}
		}
	}
	selected := func(n string) func(*corev1.PersistentVolumeClaim) {
		return func(c *corev1.PersistentVolumeClaim) { annotate(c, kube.AnnSelectedNode, n) }
	}
	deleting := func(v *corev1.PersistentVolume) { now := metav1.Now(); v.DeletionTimestamp = &now }
	imm := storagev1.VolumeBindingImmediate
	for _, tc := range []struct {
		name    string
		classes []*storagev1.StorageClass
		volumes []*corev1.PersistentVolume
		claim   *corev1.PersistentVolumeClaim
		nodes   map[string]map[string]string // readable nodes' labels
		what    binderv1.Decision
		volume  string
		note    string // in why, "" for none at all
	}{
		{name: "policy on the class: rebound",
			classes: []*storagev1.StorageClass{rebindClass(RebindSameClaimName)},
			volumes: []*corev1.PersistentVolume{vol("old", "1Gi", retained), vol("free", "1Gi")}, claim: claimWith("1Gi"),
			what: binderv1.Decision_DECISION_REBIND, volume: "old"},
		{name: "policy on the volume, class without one: rebound",
			classes: []*storagev1.StorageClass{rebindClass("")},
			volumes: []*corev1.PersistentVolume{vol("old", "1Gi", retained, on)}, claim: claimWith("1Gi"),
			what: binderv1.Decision_DECISION_REBIND, volume: "old"},
		{name: "policy on the volume, no class at all: rebound",
			volumes: []*corev1.PersistentVolume{vol("old", "1Gi", retained, on)}, claim: claimWith("1Gi"),
			what: binderv1.Decision_DECISION_REBIND, volume: "old"},
		{name: "a larger volume with more access modes: rebound",
			volumes: []*corev1.PersistentVolume{vol("old", "10Gi", retained, on, func(v *corev1.PersistentVolume) {
				v.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce, corev1.ReadWriteMany}
			})}, claim: claimWith("1Gi", rwx),
			what: binderv1.Decision_DECISION_REBIND, volume: "old"},
		{name: "policy off: the free volume, as Kubernetes",
			classes: []*storagev1.StorageClass{rebindClass("")},
			volumes: []*corev1.PersistentVolume{vol("old", "1Gi", retained), vol("free", "1Gi")}, claim: claimWith("1Gi"),
			what: binderv1.Decision_DECISION_BIND, volume: "free"},
		{name: "an unknown policy value is Never",
			classes: []*storagev1.StorageClass{rebindClass("Always")},
			volumes: []*corev1.PersistentVolume{vol("old", "1Gi", retained)}, claim: claimWith("1Gi"),
			what: binderv1.Decision_DECISION_PROVISION},
		{name: "Never on the volume wins over the class",
			classes: []*storagev1.StorageClass{rebindClass(RebindSameClaimName)},
			volumes: []*corev1.PersistentVolume{vol("old", "1Gi", retained, func(v *corev1.PersistentVolume) { annotate(v, AnnRebindReleased, RebindNever) })},
			claim:   claimWith("1Gi"),
			what:    binderv1.Decision_DECISION_PROVISION},
		{name: "another name",
			volumes: []*corev1.PersistentVolume{vol("old", "1Gi", retained, on)}, claim: claimWith("1Gi", func(c *corev1.PersistentVolumeClaim) { c.Name = "data-1" }),
			what: binderv1.Decision_DECISION_PROVISION},
		{name: "another namespace",
			volumes: []*corev1.PersistentVolume{vol("old", "1Gi", retained, on)}, claim: claimWith("1Gi", func(c *corev1.PersistentVolumeClaim) { c.Namespace = "other" }),
			what: binderv1.Decision_DECISION_PROVISION},
		{name: "too small",
			volumes: []*corev1.PersistentVolume{vol("old", "1Gi", retained, on)}, claim: claimWith("2Gi"),
			what: binderv1.Decision_DECISION_PROVISION, note: "capacity 1Gi is less than the 2Gi requested"},
		{name: "lacks an access mode",
			volumes: []*corev1.PersistentVolume{vol("old", "1Gi", retained, on)}, claim: claimWith("1Gi", rwx),
			what: binderv1.Decision_DECISION_PROVISION, note: "lack ReadWriteMany"},
		{name: "another class",
			volumes: []*corev1.PersistentVolume{vol("old", "1Gi", retained, on, pvClass("slow"))}, claim: claimWith("1Gi"),
			what: binderv1.Decision_DECISION_PROVISION, note: `storage class "slow", the claim asks for "c"`},
		{name: "another volume mode",
			volumes: []*corev1.PersistentVolume{vol("old", "1Gi", retained, on)}, claim: claimWith("1Gi", block),
			what: binderv1.Decision_DECISION_PROVISION, note: "volume mode Filesystem, the claim asks for Block"},
		{name: "the claim's selector",
			volumes: []*corev1.PersistentVolume{vol("old", "1Gi", retained, on)}, claim: claimWith("1Gi", labelSelector),
			what: binderv1.Decision_DECISION_PROVISION, note: "do not match the claim's selector"},
		{name: "Recycle: its data may be scrubbed",
			volumes: []*corev1.PersistentVolume{vol("old", "1Gi", released("uid-old", corev1.PersistentVolumeReclaimRecycle), on)}, claim: claimWith("1Gi"),
			what: binderv1.Decision_DECISION_PROVISION, note: "its reclaim policy is Recycle"},
		{name: "Delete: its data may be deleted",
			volumes: []*corev1.PersistentVolume{vol("old", "1Gi", released("uid-old", corev1.PersistentVolumeReclaimDelete), on)}, claim: claimWith("1Gi"),
			what: binderv1.Decision_DECISION_PROVISION, note: "its reclaim policy is Delete"},
		{name: "Failed, not Released",
			volumes: []*corev1.PersistentVolume{vol("old", "1Gi", retained, on, pvPhase(corev1.VolumeFailed))}, claim: claimWith("1Gi"),
			what: binderv1.Decision_DECISION_PROVISION},
		{name: "being deleted",
			volumes: []*corev1.PersistentVolume{vol("old", "1Gi", retained, on, deleting)}, claim: claimWith("1Gi"),
			what: binderv1.Decision_DECISION_PROVISION, note: "it is being deleted"},
		{name: "two volumes Released from claims of this name: neither",
			volumes: []*corev1.PersistentVolume{vol("old-a", "1Gi", retained, on), vol("old-b", "1Gi", released("uid-older", corev1.PersistentVolumeReclaimRetain), on)},
			claim:   claimWith("1Gi"),
			what:    binderv1.Decision_DECISION_PROVISION, note: "volumes old-a, old-b were all Released"},
		{name: "the claim names the Released volume: rebound",
			volumes: []*corev1.PersistentVolume{vol("old", "1Gi", retained, on)}, claim: claimWith("1Gi", volumeName("old")),
			what: binderv1.Decision_DECISION_REBIND, volume: "old"},
		{name: "the claim names another volume: that one",
			volumes: []*corev1.PersistentVolume{vol("old", "1Gi", retained, on), vol("other", "1Gi")}, claim: claimWith("1Gi", volumeName("other")),
			what: binderv1.Decision_DECISION_BIND, volume: "other"},
		{name: "the claim names the Released volume, policy off: taken, as Kubernetes",
			volumes: []*corev1.PersistentVolume{vol("old", "1Gi", retained)}, claim: claimWith("1Gi", volumeName("old")),
			what: binderv1.Decision_DECISION_VOLUME_TAKEN, volume: "old"},
		{name: "interrupted rebind (claimRef names this claim already): finished",
			volumes: []*corev1.PersistentVolume{vol("old", "1Gi", released("uid-data", corev1.PersistentVolumeReclaimRetain), on)}, claim: claimWith("1Gi"),
			what: binderv1.Decision_DECISION_REBIND, volume: "old"},
		{name: "a bound claim is never rebound (its volume Released: Kubernetes' branch)",
			volumes: []*corev1.PersistentVolume{vol("old", "1Gi", released("uid-data", corev1.PersistentVolumeReclaimRetain), on)},
			claim: claimWith("1Gi", volumeName("old"), func(c *corev1.PersistentVolumeClaim) {
				annotate(c, kube.AnnBindCompleted, "yes")
			}),
			what: binderv1.Decision_DECISION_BOUND, volume: "old"},
		{name: "selected node the volume's affinity admits: rebound",
			classes: []*storagev1.StorageClass{class("c", "p", storagev1.VolumeBindingWaitForFirstConsumer, false)},
			volumes: []*corev1.PersistentVolume{vol("old", "1Gi", retained, on, onNode("n1"))}, claim: claimWith("1Gi", selected("n1")),
			nodes: map[string]map[string]string{"n1": {"kubernetes.io/hostname": "n1"}},
			what:  binderv1.Decision_DECISION_REBIND, volume: "old"},
		{name: "WaitForFirstConsumer, no node yet: rebound (the scheduler then follows the volume)",
			classes: []*storagev1.StorageClass{class("c", "p", storagev1.VolumeBindingWaitForFirstConsumer, false)},
			volumes: []*corev1.PersistentVolume{vol("old", "1Gi", retained, on, onNode("n1"))}, claim: claimWith("1Gi"),
			what: binderv1.Decision_DECISION_REBIND, volume: "old"},
		{name: "selected node the volume's affinity excludes: not rebound",
			classes: []*storagev1.StorageClass{class("c", "p", storagev1.VolumeBindingWaitForFirstConsumer, false)},
			volumes: []*corev1.PersistentVolume{vol("old", "1Gi", retained, on, onNode("n1"))}, claim: claimWith("1Gi", selected("n2")),
			nodes: map[string]map[string]string{"n2": {"kubernetes.io/hostname": "n2"}},
			what:  binderv1.Decision_DECISION_PROVISION, note: `its node affinity excludes the claim's selected node "n2"`},
		{name: "selected node that cannot be read: not rebound",
			classes: []*storagev1.StorageClass{class("c", "p", storagev1.VolumeBindingWaitForFirstConsumer, false)},
			volumes: []*corev1.PersistentVolume{vol("old", "1Gi", retained, on, onNode("n1"))}, claim: claimWith("1Gi", selected("n1")),
			what: binderv1.Decision_DECISION_PROVISION, note: `the claim's selected node "n1" cannot be read`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, pods := newStore(), newPodIndex()
			s.putClass(class("c", "p", imm, false))
			for _, sc := range tc.classes {
				s.putClass(sc)
			}
			for _, v := range tc.volumes {
				s.putVolume(v)
			}
			nodes := func(n string) map[string]string { return tc.nodes[n] }
			d, err := decide(tc.claim, syncView{s, pods, nodes, newReservations(nil, s)})
			if err != nil {
				t.Fatal(err)
			}
			if d.what != tc.what || (tc.volume != "" && name(d.volume) != tc.volume) {
				t.Fatalf("decided %v %s (%s), want %v %s", d.what, name(d.volume), d.why, tc.what, tc.volume)
			}
			// Without a policy that allows a rebind, explain says nothing
			// more than it says without this feature.
			noted := strings.Contains(d.why, "Released from an earlier claim") || strings.Contains(d.why, "were all Released")
			if d.what != binderv1.Decision_DECISION_REBIND && noted != (tc.note != "") {
				t.Errorf("why %q, want a note: %v", d.why, tc.note != "")
			}
			if tc.note != "" && !strings.Contains(d.why, tc.note) {
				t.Errorf("why %q, want %q in it", d.why, tc.note)
			}
		})
	}
}

// strictVolumes makes the fake API server check a PersistentVolume
// update's resourceVersion, as the real one does, and count the updates
// that succeeded.
func strictVolumes(client *fake.Clientset) *int {
	var mu sync.Mutex
	n := new(int)
	client.PrependReactor("update", "persistentvolumes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		v := a.(k8stesting.UpdateAction).GetObject().(*corev1.PersistentVolume).DeepCopy()
		gvr := corev1.SchemeGroupVersion.WithResource("persistentvolumes")
		obj, err := client.Tracker().Get(gvr, "", v.Name)
		if err != nil {
			return true, nil, err
		}
		cur := obj.(*corev1.PersistentVolume)
		if v.ResourceVersion != cur.ResourceVersion {
			return true, nil, apierrors.NewConflict(corev1.Resource("persistentvolumes"), v.Name,
				errors.New("the object has been modified; please apply your changes to the latest version and try again"))
		}
		rv, _ := strconv.Atoi(cur.ResourceVersion)
		v.ResourceVersion = strconv.Itoa(rv + 1)
		if err := client.Tracker().Update(gvr, v, ""); err != nil {
			return true, nil, err
		}
		if a.GetSubresource() == "" {
			*n++
		}
		return true, v, nil
	})
	return n
}

// Two binders (two replicas whose ownership overlapped for a moment, or a
// worker acting on a stale cache) rebind the same Released volume to the
// recreated claim at once: the volume's resourceVersion lets exactly one
// write its claimRef; the other writes nothing more and records nothing.
func TestRebindRaceOneWins(t *testing.T) {
	ctx := t.Context()
	client := fake.NewClientset()
	updates := strictVolumes(client)
	volume := vol("old", "1Gi", func(v *corev1.PersistentVolume) {
		v.Spec.ClaimRef = &corev1.ObjectReference{Namespace: "ns", Name: "data", UID: "uid-old"}
		v.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimRetain
		v.Status.Phase = corev1.VolumeReleased
		annotate(v, AnnRebindReleased, RebindSameClaimName)
	})
	claim := claimWith("1Gi")
	if _, err := client.CoreV1().PersistentVolumes().Create(ctx, volume, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().PersistentVolumeClaims("ns").Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	const binders = 2
	var (
		cs        [binders]*controller
		recorders [binders]*record.FakeRecorder
		errs      [binders]error
		wg        sync.WaitGroup
		start     = make(chan struct{})
	)
	for i := range cs {
		recorders[i] = record.NewFakeRecorder(10)
		cs[i] = newController(slog.New(slog.NewTextHandler(io.Discard, nil)), client, recorders[i])
		cs[i].journal = journalOf()
		cs[i].store.putClass(class("c", "p", storagev1.VolumeBindingImmediate, false))
		cs[i].store.putVolume(volume.DeepCopy())
		cs[i].store.putClaim(claim.DeepCopy())
		cs[i].Synced()
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[i] = cs[i].syncClaim(ctx, cs[i].store.claim("ns/data"))
		}()
	}
	close(start)
	wg.Wait()
	if *updates != 1 {
		t.Fatalf("%d claimRef writes succeeded, want 1", *updates)
	}
	won := 0
	for i, err := range errs {
		switch {
		case err == nil:
			won++
			if got := reasons(recorders[i]); !slices.Equal(got, []string{EventVolumeRebound, EventVolumeRebound}) {
				t.Errorf("the winner recorded %q", got)
			}
		case apierrors.IsConflict(err):
			if got := reasons(recorders[i]); len(got) != 0 {
				t.Errorf("the loser recorded %q", got)
			}
		default:
			t.Errorf("binder %d: %v", i, err)
		}
	}
	if won != 1 {
		t.Fatalf("%d binders succeeded (%v), want 1", won, errs)
	}
	v, err := client.CoreV1().PersistentVolumes().Get(ctx, "old", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if v.Status.Phase != corev1.VolumeBound || v.Spec.ClaimRef.UID != claim.UID {
		t.Fatalf("volume %s, claimRef %+v", v.Status.Phase, v.Spec.ClaimRef)
	}
}

// A binder whose cache still holds an earlier incarnation of the claim
// (deleted and created again meanwhile) rebinds nothing: the claim is read
// from the API server first, and the one it holds is gone.
func TestRebindStaleIncarnation(t *testing.T) {
	ctx := t.Context()
	client := fake.NewClientset()
	updates := strictVolumes(client)
	volume := vol("old", "1Gi", func(v *corev1.PersistentVolume) {
		v.Spec.ClaimRef = &corev1.ObjectReference{Namespace: "ns", Name: "data", UID: "uid-old"}
		v.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimRetain
		v.Status.Phase = corev1.VolumeReleased
		annotate(v, AnnRebindReleased, RebindSameClaimName)
	})
	first, second := claimWith("1Gi"), claimWith("1Gi")
	second.UID = "uid-second"
	if _, err := client.CoreV1().PersistentVolumes().Create(ctx, volume, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().PersistentVolumeClaims("ns").Create(ctx, second, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	recorder := record.NewFakeRecorder(10)
	c := newController(slog.New(slog.NewTextHandler(io.Discard, nil)), client, recorder)
	c.store.putVolume(volume.DeepCopy())
	c.store.putClaim(first)
	c.Synced()
	err := c.syncClaim(ctx, c.store.claim("ns/data"))
	if !errors.Is(err, errGone) {
		t.Fatalf("sync: %v, want the claim gone", err)
	}
	if *updates != 0 || len(reasons(recorder)) != 0 {
		t.Fatalf("%d volume writes, events %q", *updates, reasons(recorder))
	}
	if c.store.claim("ns/data") != nil {
		t.Error("the stale claim stays in the cache")
	}
}

// etcd unreachable when the journal must be read: no rebind, retried.
func TestRebindJournalUnreadable(t *testing.T) {
	ctx := t.Context()
	tc := transition{
		classes: []*storagev1.StorageClass{rebindClass(RebindSameClaimName)},
		volumes: []*corev1.PersistentVolume{pvT("v", "1Gi", refTo("data", "uid-old"), pvPhase(corev1.VolumeReleased), policy(corev1.PersistentVolumeReclaimRetain))},
		claims:  []*corev1.PersistentVolumeClaim{pvcT("data", "1Gi")}, sync: "pvc/ns/data", journaled: []string{},
	}
	c, client, recorder := setUpTransition(t, tc)
	c.journal = &fakeJournal{err: errors.New("context deadline exceeded")}
	err := syncTransition(ctx, t, c, tc)
	if !errors.Is(err, errEtcd) {
		t.Fatalf("sync: %v, want an etcd error", err)
	}
	if got := requests(client); !slices.Equal(got, []string{"get persistentvolumeclaims"}) {
		t.Errorf("requests %q", got)
	}
	if got := reasons(recorder); len(got) != 0 {
		t.Errorf("events %q", got)
	}
}
