package binder

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/match"
	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// randomStore fills a store with volumes of a few classes, access-mode
// sets, sizes, phases and claimRefs, some reserved by this replica for
// other claims and some held by other replicas.
func randomStore(r *rand.Rand, n int) *store {
	modes := [][]corev1.PersistentVolumeAccessMode{
		{corev1.ReadWriteOnce},
		{corev1.ReadWriteOnce, corev1.ReadOnlyMany},
		{corev1.ReadWriteMany},
		{corev1.ReadWriteOnce, corev1.ReadWriteMany},
		{corev1.ReadWriteOncePod},
	}
	classes := []string{"", "a", "b"}
	phases := []corev1.PersistentVolumePhase{corev1.VolumeAvailable, corev1.VolumeAvailable, corev1.VolumeAvailable, corev1.VolumePending, corev1.VolumeReleased}
	block := corev1.PersistentVolumeBlock
	s := newStore()
	for i := range n {
		v := &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pv-%03d", r.IntN(2*n)), UID: types.UID(fmt.Sprint(i)),
				Labels: map[string]string{"tier": []string{"gold", "silver"}[r.IntN(2)]}},
			Spec: corev1.PersistentVolumeSpec{
				Capacity:         corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(int64(1+r.IntN(8))<<30, resource.BinarySI)},
				AccessModes:      modes[r.IntN(len(modes))],
				StorageClassName: classes[r.IntN(len(classes))],
			},
			Status: corev1.PersistentVolumeStatus{Phase: phases[r.IntN(len(phases))]},
		}
		if r.IntN(10) == 0 {
			v.Spec.VolumeMode = &block
		}
		if r.IntN(12) == 0 {
			v.Spec.ClaimRef = &corev1.ObjectReference{Namespace: "ns", Name: fmt.Sprintf("c%d", r.IntN(20))}
			if r.IntN(2) == 0 {
				v.Spec.ClaimRef.UID = types.UID(fmt.Sprintf("uid-%d", r.IntN(40)))
			}
		}
		if r.IntN(20) == 0 {
			now := metav1.Now()
			v.DeletionTimestamp = &now
		}
		s.putVolume(v)
	}
	for name := range s.volumes {
		switch r.IntN(12) {
		case 0:
			s.reserved[name] = types.UID(fmt.Sprintf("uid-%d", r.IntN(40)))
		case 1:
			s.markForeign(name, time.Hour)
		}
	}
	return s
}

func randomClaim(r *rand.Rand, i int) *corev1.PersistentVolumeClaim {
	classes := []string{"", "a", "b"}
	modes := []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce, corev1.ReadOnlyMany, corev1.ReadWriteMany, corev1.ReadWriteOncePod}
	cls := classes[r.IntN(len(classes))]
	c := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("c%d", i%20), UID: types.UID(fmt.Sprintf("uid-%d", i%40))},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{modes[r.IntN(len(modes))]},
			StorageClassName: &cls,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(int64(1+r.IntN(8))<<30, resource.BinarySI)}},
		},
	}
	if r.IntN(4) == 0 {
		c.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "gold"}}
	}
	if r.IntN(10) == 0 {
		block := corev1.PersistentVolumeBlock
		c.Spec.VolumeMode = &block
	}
	return c
}

// Explain's "would bind" is findAndReserve's choice on every index, with
// reservations of this replica and of others; the candidates, read page by
// page, are the whole class bucket plus the volumes naming the claim, in
// the binder's order (match.Fit.Before) with contiguous ranks, and the
// first that breaks no rule is that same volume.
func TestExplainAgreesWithFindAndReserve(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for round := range 40 {
		s := randomStore(r, 150)
		for i := range 40 {
			c := randomClaim(r, i)
			delay := r.IntN(5) == 0
			size := 1 + r.IntN(40)

			var all []candidate
			var from *pageToken
			total := -1
			var best *corev1.PersistentVolume
			for pages := 0; ; pages++ {
				ix, err := s.explainIndex(c, delay, "", nil, from, size, time.Now())
				if err != nil {
					t.Fatal(err)
				}
				if total == -1 {
					total, best = ix.total, ix.best
				}
				if ix.first != len(all)+1 {
					t.Fatalf("page %d starts at rank %d after %d candidates", pages, ix.first, len(all))
				}
				all = append(all, ix.page...)
				if ix.next == nil {
					break
				}
				from = ix.next
			}
			got, err := s.findAndReserve(c, delay)
			if err != nil {
				t.Fatal(err)
			}
			if got != nil {
				s.unreserve(got.Name, c.UID)
			}
			if name(got) != name(best) {
				t.Fatalf("round %d claim %s: findAndReserve chose %s, explain says %s", round, c.Name, name(got), name(best))
			}
			if len(all) != total {
				t.Fatalf("round %d claim %s: %d candidates over the pages, total %d", round, c.Name, len(all), total)
			}
			var firstFit *corev1.PersistentVolume
			fit, _ := match.NewFit(c)
			for k, cd := range all {
				if cd.rule == match.RuleNone && firstFit == nil {
					firstFit = cd.v
				}
				if k > 0 && fit.Before(cd.v, all[k-1].v) {
					t.Fatalf("round %d claim %s: %s listed after %s", round, c.Name, cd.v.Name, all[k-1].v.Name)
				}
			}
			if name(firstFit) != name(best) {
				t.Fatalf("round %d claim %s: first fitting candidate %s, binder's choice %s", round, c.Name, name(firstFit), name(best))
			}
			// The whole list is the class's free volumes and the volumes
			// naming the claim: the index, not every volume.
			want := 0
			for _, v := range s.volumes {
				if (v.Spec.ClaimRef == nil && match.VolumeClass(v) == match.ClaimClass(c)) ||
					(v.Spec.ClaimRef != nil && refKey(v.Spec.ClaimRef) == claimKey(c)) {
					want++
				}
			}
			if want != total {
				t.Fatalf("round %d claim %s: %d candidates, the index holds %d", round, c.Name, total, want)
			}
		}
	}
}

// Reserved volumes say by whom; the page token survives a change of the
// index and a bad one is refused.
func TestExplainReservationsAndPageTokens(t *testing.T) {
	s := newStore()
	for i, size := range []string{"1Gi", "2Gi", "3Gi"} {
		v := testVolume(fmt.Sprintf("v%d", i))
		v.Spec.Capacity[corev1.ResourceStorage] = resource.MustParse(size)
		s.putVolume(v)
	}
	s.reserved["v0"] = "someone"
	s.markForeign("v1", time.Hour)
	c := testClaim("data")
	ix, err := s.explainIndex(c, false, "", nil, nil, 2, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if name(ix.best) != "v2" || len(ix.page) != 2 || ix.next == nil {
		t.Fatalf("best %s, page %d, next %v", name(ix.best), len(ix.page), ix.next)
	}
	got := candidatesToAPI(ix, c)
	if got[0].RejectedBy != binderv1.Rule_RULE_RESERVED || !strings.Contains(got[0].Message, "for claim UID someone") {
		t.Errorf("v0: %v %q", got[0].RejectedBy, got[0].Message)
	}
	if got[1].RejectedBy != binderv1.Rule_RULE_RESERVED || !strings.Contains(got[1].Message, "another binder replica") {
		t.Errorf("v1: %v %q", got[1].RejectedBy, got[1].Message)
	}
	token, err := decodePageToken(ix.next.encode())
	if err != nil {
		t.Fatal(err)
	}
	// The volume the page ended on goes; the next page starts after it.
	s.dropVolume("v1", "")
	ix, _ = s.explainIndex(c, false, "", nil, token, 2, time.Now())
	if len(ix.page) != 1 || ix.page[0].v.Name != "v2" || ix.first != 3 || ix.next != nil {
		t.Fatalf("second page %v first %d next %v", ix.page, ix.first, ix.next)
	}
	for _, bad := range []string{"!!", "e30", "bm90IGpzb24"} {
		if _, err := decodePageToken(bad); status.Code(err) != codes.InvalidArgument {
			t.Errorf("token %q: %v", bad, err)
		}
	}
}

// fakeProv is the provisioner service as explain and match see it.
type fakeProv struct {
	drivers []*provisionerv1.Driver
	op      *provisionerv1.Operation
	plan    *provisionerv1.PlanVolumeResponse
	planErr error
}

func (f *fakeProv) Drivers(context.Context) ([]*provisionerv1.Driver, error) { return f.drivers, nil }
func (f *fakeProv) Operation(context.Context, string) (*provisionerv1.Operation, error) {
	return f.op, nil
}
func (f *fakeProv) Plan(context.Context, *corev1.PersistentVolumeClaim) (*provisionerv1.PlanVolumeResponse, error) {
	return f.plan, f.planErr
}

type explainCase struct {
	name    string
	classes []*storagev1.StorageClass
	volumes []*corev1.PersistentVolume
	claim   *corev1.PersistentVolumeClaim
	// decision and wouldBind are what explain must say; event is the
	// reason the sync then records ("" for none).
	decision  binderv1.Decision
	wouldBind string
	event     string
}

func class(name, provisioner string, mode storagev1.VolumeBindingMode, isDefault bool) *storagev1.StorageClass {
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "1", CreationTimestamp: metav1.Now()}, Provisioner: provisioner, VolumeBindingMode: &mode}
	if isDefault {
		sc.Annotations = map[string]string{kube.AnnDefaultStorageClass: "true"}
	}
	return sc
}

func vol(name, size string, opts ...func(*corev1.PersistentVolume)) *corev1.PersistentVolume {
	v := testVolume(name)
	v.Spec.Capacity[corev1.ResourceStorage] = resource.MustParse(size)
	for _, o := range opts {
		o(v)
	}
	return v
}

func claimWith(size string, opts ...func(*corev1.PersistentVolumeClaim)) *corev1.PersistentVolumeClaim {
	c := testClaim("data")
	c.Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse(size)
	for _, o := range opts {
		o(c)
	}
	return c
}

// Every branch of the claim's sync, as explain predicts it and as the sync
// then does it against a (fake) API server: the volume explain says it
// would bind is the volume the sync binds, and the decision is the event
// the sync records.
func TestExplainPredictsTheSync(t *testing.T) {
	imm, wffc := storagev1.VolumeBindingImmediate, storagev1.VolumeBindingWaitForFirstConsumer
	refTo := func(uid types.UID) func(*corev1.PersistentVolume) {
		return func(v *corev1.PersistentVolume) {
			v.Spec.ClaimRef = &corev1.ObjectReference{Namespace: "ns", Name: "data", UID: uid}
		}
	}
	labelled := func(v *corev1.PersistentVolume) { v.Labels = map[string]string{"tier": "gold"} }
	rwx := func(v *corev1.PersistentVolume) {
		v.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce, corev1.ReadWriteMany}
	}
	phase := func(p corev1.PersistentVolumePhase) func(*corev1.PersistentVolume) {
		return func(v *corev1.PersistentVolume) { v.Status.Phase = p }
	}
	classOf := func(cls string) func(*corev1.PersistentVolumeClaim) {
		return func(c *corev1.PersistentVolumeClaim) { c.Spec.StorageClassName = &cls }
	}
	noClass := func(c *corev1.PersistentVolumeClaim) { c.Spec.StorageClassName = nil }
	wants := func(v string) func(*corev1.PersistentVolumeClaim) {
		return func(c *corev1.PersistentVolumeClaim) { c.Spec.VolumeName = v }
	}
	selector := func(c *corev1.PersistentVolumeClaim) {
		c.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "gold"}}
	}
	node := func(c *corev1.PersistentVolumeClaim) {
		c.Annotations = map[string]string{kube.AnnSelectedNode: "n1"}
	}
	for _, tc := range []explainCase{
		{name: "best match", volumes: []*corev1.PersistentVolume{vol("big", "10Gi"), vol("fit", "5Gi"), vol("small", "1Gi")}, claim: claimWith("3Gi"),
			decision: binderv1.Decision_DECISION_BIND, wouldBind: "fit"},
		{name: "fewer access modes beat smaller capacity", volumes: []*corev1.PersistentVolume{vol("rwx", "1Gi", rwx), vol("rwo", "9Gi")}, claim: claimWith("1Gi"),
			decision: binderv1.Decision_DECISION_BIND, wouldBind: "rwo"},
		{name: "pre-bound volume wins", volumes: []*corev1.PersistentVolume{vol("small", "1Gi"), vol("pre", "9Gi", refTo(""))}, claim: claimWith("1Gi"),
			decision: binderv1.Decision_DECISION_BIND, wouldBind: "pre"},
		{name: "selector", volumes: []*corev1.PersistentVolume{vol("plain", "1Gi"), vol("gold", "5Gi", labelled)}, claim: claimWith("1Gi", selector),
			decision: binderv1.Decision_DECISION_BIND, wouldBind: "gold"},
		{name: "not Available skipped", volumes: []*corev1.PersistentVolume{vol("pending", "1Gi", phase(corev1.VolumePending)), vol("ok", "2Gi")}, claim: claimWith("1Gi"),
			decision: binderv1.Decision_DECISION_BIND, wouldBind: "ok"},
		{name: "claim names its volume", volumes: []*corev1.PersistentVolume{vol("small", "1Gi"), vol("big", "9Gi")}, claim: claimWith("1Gi", wants("big")),
			decision: binderv1.Decision_DECISION_BIND, wouldBind: "big"},
		{name: "named volume missing", claim: claimWith("1Gi", wants("later")), decision: binderv1.Decision_DECISION_VOLUME_MISSING},
		{name: "named volume too small", volumes: []*corev1.PersistentVolume{vol("small", "1Gi")}, claim: claimWith("5Gi", wants("small")),
			decision: binderv1.Decision_DECISION_VOLUME_MISMATCH, event: kube.EventVolumeMismatch},
		{name: "named volume taken", volumes: []*corev1.PersistentVolume{vol("taken", "1Gi", func(v *corev1.PersistentVolume) {
			v.Spec.ClaimRef = &corev1.ObjectReference{Namespace: "ns", Name: "other", UID: "x"}
		})}, claim: claimWith("1Gi", wants("taken")), decision: binderv1.Decision_DECISION_VOLUME_TAKEN, event: kube.EventFailedBinding},
		{name: "no class, nothing fits", volumes: []*corev1.PersistentVolume{vol("classy", "1Gi")}, claim: claimWith("1Gi", classOf("")),
			decision: binderv1.Decision_DECISION_NO_MATCH, event: kube.EventFailedBinding},
		{name: "default class assigned", classes: []*storagev1.StorageClass{class("std", "p", imm, true)}, claim: claimWith("1Gi", noClass),
			decision: binderv1.Decision_DECISION_ASSIGN_DEFAULT_CLASS},
		{name: "wait for first consumer", classes: []*storagev1.StorageClass{class("c", "p", wffc, false)}, volumes: []*corev1.PersistentVolume{vol("free", "1Gi")}, claim: claimWith("1Gi"),
			decision: binderv1.Decision_DECISION_WAIT_FOR_FIRST_CONSUMER, event: kube.EventWaitForFirstConsumer},
		{name: "wait for first consumer binds a pre-bound volume", classes: []*storagev1.StorageClass{class("c", "p", wffc, false)},
			volumes: []*corev1.PersistentVolume{vol("free", "1Gi"), vol("pre", "2Gi", refTo(""))}, claim: claimWith("1Gi"),
			decision: binderv1.Decision_DECISION_BIND, wouldBind: "pre"},
		{name: "selected node: provision", classes: []*storagev1.StorageClass{class("c", "p", wffc, false)}, volumes: []*corev1.PersistentVolume{vol("free", "1Gi")}, claim: claimWith("1Gi", node),
			decision: binderv1.Decision_DECISION_PROVISION, event: kube.EventExternalProvisioning},
		{name: "provision", classes: []*storagev1.StorageClass{class("c", "p", imm, false)}, volumes: []*corev1.PersistentVolume{vol("small", "1Gi")}, claim: claimWith("5Gi"),
			decision: binderv1.Decision_DECISION_PROVISION, event: kube.EventExternalProvisioning},
		{name: "provision, class missing", volumes: []*corev1.PersistentVolume{vol("small", "1Gi")}, claim: claimWith("5Gi"),
			decision: binderv1.Decision_DECISION_PROVISION, event: kube.EventProvisioningFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			client := fake.NewClientset()
			recorder := record.NewFakeRecorder(100)
			c := newController(slog.New(slog.NewTextHandler(io.Discard, nil)), client, recorder)
			for _, sc := range tc.classes {
				if _, err := client.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
				c.store.putClass(sc)
			}
			for _, v := range tc.volumes {
				if _, err := client.CoreV1().PersistentVolumes().Create(ctx, v, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
				c.store.putVolume(v.DeepCopy())
			}
			if _, err := client.CoreV1().PersistentVolumeClaims("ns").Create(ctx, tc.claim, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			c.store.putClaim(tc.claim.DeepCopy())
			c.Synced()
			a := &api{c: c, memberID: "m", members: func() []string { return []string{"m"} }, workers: 1,
				prov: &fakeProv{drivers: []*provisionerv1.Driver{{ProvisionerName: "p", DriverName: "p.csi", Ready: true}}}}
			resp, err := a.ExplainClaim(ctx, &binderv1.ExplainClaimRequest{Namespace: "ns", Name: "data"})
			if err != nil {
				t.Fatal(err)
			}
			if resp.Decision != tc.decision || resp.WouldBind != tc.wouldBind {
				t.Fatalf("explain: %v would bind %q (%s), want %v and %q", resp.Decision, resp.WouldBind, resp.Message, tc.decision, tc.wouldBind)
			}
			if (resp.Provisioning != nil) != (tc.decision == binderv1.Decision_DECISION_PROVISION || tc.decision == binderv1.Decision_DECISION_WAIT_FOR_FIRST_CONSUMER) {
				t.Errorf("provisioning %v with decision %v", resp.Provisioning, resp.Decision)
			}

			if err := c.syncClaim(ctx, c.store.claim("ns/data")); err != nil && tc.decision != binderv1.Decision_DECISION_VOLUME_MISSING {
				t.Fatal(err)
			}
			got, err := client.CoreV1().PersistentVolumeClaims("ns").Get(ctx, "data", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got.Spec.VolumeName != tc.wouldBind && tc.decision != binderv1.Decision_DECISION_VOLUME_MISMATCH && tc.decision != binderv1.Decision_DECISION_VOLUME_TAKEN && tc.decision != binderv1.Decision_DECISION_VOLUME_MISSING {
				t.Fatalf("the sync bound %q, explain said %q", got.Spec.VolumeName, tc.wouldBind)
			}
			if tc.wouldBind != "" {
				if v, _ := client.CoreV1().PersistentVolumes().Get(ctx, tc.wouldBind, metav1.GetOptions{}); v.Spec.ClaimRef == nil || v.Spec.ClaimRef.UID != tc.claim.UID {
					t.Fatalf("volume %s not bound to the claim: %+v", tc.wouldBind, v.Spec.ClaimRef)
				}
			}
			if tc.decision == binderv1.Decision_DECISION_ASSIGN_DEFAULT_CLASS && (got.Spec.StorageClassName == nil || *got.Spec.StorageClassName != "std") {
				t.Fatalf("class after the sync: %v", got.Spec.StorageClassName)
			}
			var events []string
			for len(recorder.Events) > 0 {
				events = append(events, <-recorder.Events)
			}
			if tc.event != "" && !strings.Contains(strings.Join(events, "\n"), " "+tc.event+" ") {
				t.Fatalf("events %q, want %s", events, tc.event)
			}
		})
	}
}

// A bound claim says how it was bound.
func TestExplainBoundClaims(t *testing.T) {
	bound := func(claimBBC, volumeBBC bool, provisionedBy string) (*corev1.PersistentVolumeClaim, *corev1.PersistentVolume) {
		c := testClaim("data")
		c.Spec.VolumeName = "v"
		c.Annotations = map[string]string{kube.AnnBindCompleted: "yes"}
		if claimBBC {
			c.Annotations[kube.AnnBoundByController] = "yes"
		}
		v := testVolume("v")
		v.Spec.ClaimRef = &corev1.ObjectReference{Namespace: "ns", Name: "data", UID: c.UID}
		v.Annotations = map[string]string{}
		if volumeBBC {
			v.Annotations[kube.AnnBoundByController] = "yes"
		}
		if provisionedBy != "" {
			v.Annotations[kube.AnnDynamicallyProvisioned] = provisionedBy
		}
		return c, v
	}
	for _, tc := range []struct {
		name                string
		claimBBC, volumeBBC bool
		provisionedBy       string
		want                string
	}{
		{"best match", true, true, "", "chose volume v as the best match"},
		{"provisioned", true, false, "dev.csi", "dev.csi provisioned volume v"},
		{"pre-bound volume", true, false, "", "the claimRef of volume v named the claim"},
		{"pre-bound claim", false, true, "", "pre-bound: the claim named volume v"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newController(slog.New(slog.NewTextHandler(io.Discard, nil)), fake.NewClientset(), record.NewFakeRecorder(10))
			cl, v := bound(tc.claimBBC, tc.volumeBBC, tc.provisionedBy)
			c.store.putVolume(v)
			c.store.putClaim(cl)
			c.Synced()
			a := &api{c: c, memberID: "m"}
			resp, err := a.ExplainClaim(context.Background(), &binderv1.ExplainClaimRequest{Namespace: "ns", Name: "data"})
			if err != nil {
				t.Fatal(err)
			}
			if resp.Decision != binderv1.Decision_DECISION_BOUND || !strings.Contains(resp.Binding.GetMessage(), tc.want) {
				t.Fatalf("%v %q, want BOUND with %q", resp.Decision, resp.Binding.GetMessage(), tc.want)
			}
		})
	}
}

// Bad requests: unknown claim NotFound, bad names and pages InvalidArgument.
func TestExplainBadRequests(t *testing.T) {
	c := newController(slog.New(slog.NewTextHandler(io.Discard, nil)), fake.NewClientset(), record.NewFakeRecorder(10))
	c.Synced()
	a := &api{c: c, memberID: "m"}
	for _, tc := range []struct {
		req  *binderv1.ExplainClaimRequest
		code codes.Code
	}{
		{&binderv1.ExplainClaimRequest{Namespace: "ns", Name: "nope"}, codes.NotFound},
		{&binderv1.ExplainClaimRequest{Namespace: "NS", Name: "x"}, codes.InvalidArgument},
		{&binderv1.ExplainClaimRequest{Namespace: "ns", Name: ""}, codes.InvalidArgument},
		{&binderv1.ExplainClaimRequest{Namespace: "ns", Name: "x", PageSize: 5000}, codes.InvalidArgument},
		{&binderv1.ExplainClaimRequest{Namespace: "ns", Name: "x", PageToken: "garbage"}, codes.InvalidArgument},
	} {
		if _, err := a.ExplainClaim(context.Background(), tc.req); status.Code(err) != tc.code {
			t.Errorf("%v: %v, want %v", tc.req, err, tc.code)
		}
	}
}

// The provisioning side: the driver, the journaled operation and the
// binder's own retry schedule.
func TestExplainProvisioning(t *testing.T) {
	c := newController(slog.New(slog.NewTextHandler(io.Discard, nil)), fake.NewClientset(), record.NewFakeRecorder(10))
	c.store.putClass(class("c", "p", storagev1.VolumeBindingImmediate, false))
	cl := testClaim("data")
	cl.Annotations = map[string]string{kube.AnnStorageProvisioner: "p"}
	c.store.putClaim(cl)
	c.Synced()
	c.provisions.retry("ns/data")
	now := time.Now()
	prov := &fakeProv{
		drivers: []*provisionerv1.Driver{{ProvisionerName: "p", DriverName: "p.csi", Ready: true}},
		op:      &provisionerv1.Operation{VolumeName: "pvc-uid-data", Attempts: 3, LastErrorCode: "DeadlineExceeded", LastErrorMessage: "context deadline exceeded"},
	}
	a := &api{c: c, memberID: "m", prov: prov}
	resp, err := a.ExplainClaim(context.Background(), &binderv1.ExplainClaimRequest{Namespace: "ns", Name: "data"})
	if err != nil {
		t.Fatal(err)
	}
	p := resp.Provisioning
	if !p.GetServed() || p.GetDriverName() != "p.csi" || !p.GetRequested() || p.GetOperation().GetAttempts() != 3 ||
		p.GetOperation().GetLastErrorCode() != "DeadlineExceeded" || !p.GetNextRetryTime().AsTime().After(now) {
		t.Fatalf("provisioning %v", p)
	}
	if !strings.Contains(p.GetMessage(), "last error DeadlineExceeded: context deadline exceeded") {
		t.Errorf("message %q", p.GetMessage())
	}
	// Not served: left to the external provisioner.
	prov.drivers = nil
	resp, _ = a.ExplainClaim(context.Background(), &binderv1.ExplainClaimRequest{Namespace: "ns", Name: "data"})
	if resp.Provisioning.GetServed() || resp.Provisioning.GetOperation() != nil || !strings.Contains(resp.Provisioning.GetMessage(), "external provisioner") {
		t.Fatalf("unserved: %v", resp.Provisioning)
	}
}

// The node affinity of free volumes is checked against the selected node
// of a WaitForFirstConsumer claim; it never changes the binder's choice.
func TestExplainNodeAffinity(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"zone": "a"}}}
	c := newController(slog.New(slog.NewTextHandler(io.Discard, nil)), fake.NewClientset(node), record.NewFakeRecorder(10))
	c.store.putClass(class("c", "p", storagev1.VolumeBindingWaitForFirstConsumer, false))
	affinity := func(zone string) func(*corev1.PersistentVolume) {
		return func(v *corev1.PersistentVolume) {
			v.Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{zone}}}}}}}
		}
	}
	c.store.putVolume(vol("in-a", "1Gi", affinity("a")))
	c.store.putVolume(vol("in-b", "2Gi", affinity("b")))
	cl := testClaim("data")
	cl.Annotations = map[string]string{kube.AnnSelectedNode: "n1"}
	c.store.putClaim(cl)
	c.Synced()
	a := &api{c: c, memberID: "m"}
	resp, err := a.ExplainClaim(context.Background(), &binderv1.ExplainClaimRequest{Namespace: "ns", Name: "data"})
	if err != nil {
		t.Fatal(err)
	}
	rules := map[string]binderv1.Rule{}
	for _, cd := range resp.Candidates {
		rules[cd.Name] = cd.RejectedBy
	}
	if rules["in-a"] != binderv1.Rule_RULE_WAIT_FOR_FIRST_CONSUMER || rules["in-b"] != binderv1.Rule_RULE_NODE_AFFINITY || resp.WouldBind != "" ||
		resp.Decision != binderv1.Decision_DECISION_PROVISION {
		t.Fatalf("%v %v would bind %q", resp.Decision, rules, resp.WouldBind)
	}
	names := make([]string, 0, len(resp.Candidates))
	for _, cd := range resp.Candidates {
		names = append(names, cd.Name)
	}
	if !sort.StringsAreSorted(names) {
		t.Errorf("candidates %v out of order", names)
	}
}

// Explain names the provisioner sync provisions through: a migrated
// in-tree class under its CSI driver's name, and the failure of an in-tree
// class nothing provisions.
func TestExplainProvisioningInTree(t *testing.T) {
	c := newController(slog.New(slog.NewTextHandler(io.Discard, nil)), fake.NewClientset(), record.NewFakeRecorder(10))
	c.store.putClass(class("ebs", "kubernetes.io/aws-ebs", storagev1.VolumeBindingImmediate, false))
	c.store.putClass(class("nfs", kube.PluginNFS, storagev1.VolumeBindingImmediate, false))
	migrated := testClaim("migrated")
	ebs := "ebs"
	migrated.Spec.StorageClassName = &ebs
	migrated.Annotations = map[string]string{kube.AnnStorageProvisioner: "ebs.csi.aws.com"}
	nfs := testClaim("nfs")
	nfsClass := "nfs"
	nfs.Spec.StorageClassName = &nfsClass
	c.store.putClaim(migrated)
	c.store.putClaim(nfs)
	c.Synced()
	prov := &fakeProv{drivers: []*provisionerv1.Driver{{ProvisionerName: "ebs.csi.aws.com", DriverName: "ebs.csi.aws.com", Ready: true}}}
	a := &api{c: c, memberID: "m", prov: prov}
	resp, err := a.ExplainClaim(t.Context(), &binderv1.ExplainClaimRequest{Namespace: "ns", Name: "migrated"})
	if err != nil {
		t.Fatal(err)
	}
	if p := resp.Provisioning; p.GetProvisioner() != "ebs.csi.aws.com" || !p.GetServed() || !p.GetRequested() {
		t.Errorf("migrated class: %v", p)
	}
	resp, err = a.ExplainClaim(t.Context(), &binderv1.ExplainClaimRequest{Namespace: "ns", Name: "nfs"})
	if err != nil {
		t.Fatal(err)
	}
	if p := resp.Provisioning; p.GetServed() || !strings.Contains(p.GetMessage(), "no provisionable volume plugin matched") {
		t.Errorf("in-tree class nothing provisions: %v", p)
	}
}
