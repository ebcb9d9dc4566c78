package binder

import (
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volplane/volplane/pkg/kube"
	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

// decide without an API server, a client or a controller: a store, a pod
// index and a claim in, a decision out.
func TestDecide(t *testing.T) {
	imm, wffc := storagev1.VolumeBindingImmediate, storagev1.VolumeBindingWaitForFirstConsumer
	refTo := func(name string, uid types.UID) func(*corev1.PersistentVolume) {
		return func(v *corev1.PersistentVolume) {
			v.Spec.ClaimRef = &corev1.ObjectReference{Namespace: "ns", Name: name, UID: uid}
		}
	}
	noClass := func(c *corev1.PersistentVolumeClaim) { c.Spec.StorageClassName = nil }
	node := func(n string) func(*corev1.PersistentVolumeClaim) {
		return func(c *corev1.PersistentVolumeClaim) { annotate(c, kube.AnnSelectedNode, n) }
	}
	bound := func(volume string) func(*corev1.PersistentVolumeClaim) {
		return func(c *corev1.PersistentVolumeClaim) {
			c.Spec.VolumeName = volume
			annotate(c, kube.AnnBindCompleted, "yes")
			annotate(c, kube.AnnBoundByController, "yes")
		}
	}
	badSelector := func(c *corev1.PersistentVolumeClaim) {
		c.Spec.Selector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tier", Operator: "Near"}}}
	}
	noMode := class("c", "p", imm, false)
	noMode.VolumeBindingMode = nil
	for _, tc := range []struct {
		name     string
		classes  []*storagev1.StorageClass
		volumes  []*corev1.PersistentVolume
		claim    *corev1.PersistentVolumeClaim
		pods     []*watcherv1.Pod       // pods of ns, unscheduled unless a node is set
		reserved map[string]types.UID   // by this replica, for claims of these UIDs
		foreign  []string               // held in etcd by another replica
		what     binderv1.Decision      // the decision
		volume   string                 // its volume
		chosen   bool                   // chosen by the binder's walk
		class    string                 // its class
		through  kube.ProvisionDecision // its provisioning
		event    [3]string              // its Event: type, reason, message
		err      string                 // in decide's error, or the decision's
	}{
		// Claims without a volume.
		{name: "the best fit is chosen (and held for the claim)",
			volumes: []*corev1.PersistentVolume{vol("big", "10Gi"), vol("fit", "5Gi"), vol("small", "1Gi")}, claim: claimWith("3Gi"),
			what: binderv1.Decision_DECISION_BIND, volume: "fit", chosen: true},
		{name: "a volume reserved for another claim is passed over",
			volumes: []*corev1.PersistentVolume{vol("first", "2Gi"), vol("second", "3Gi")}, claim: claimWith("2Gi"),
			reserved: map[string]types.UID{"first": "uid-other"},
			what:     binderv1.Decision_DECISION_BIND, volume: "second", chosen: true},
		{name: "a volume reserved for this claim is chosen again",
			volumes: []*corev1.PersistentVolume{vol("first", "2Gi"), vol("second", "3Gi")}, claim: claimWith("2Gi"),
			reserved: map[string]types.UID{"first": "uid-data"},
			what:     binderv1.Decision_DECISION_BIND, volume: "first", chosen: true},
		// As the sync always did: a volume another replica holds is not
		// waited for; the claim goes on as if it were not there.
		{name: "held by another replica, nothing else fits: provision",
			classes: []*storagev1.StorageClass{class("c", "p", imm, false)},
			volumes: []*corev1.PersistentVolume{vol("held", "1Gi")}, claim: claimWith("1Gi"), foreign: []string{"held"},
			what: binderv1.Decision_DECISION_PROVISION, class: "c", through: kube.ProvisionDecision{Provisioner: "p"}},
		{name: "held by another replica, no class: FailedBinding",
			volumes: []*corev1.PersistentVolume{vol("held", "1Gi", pvClass(""))}, claim: claimWith("1Gi", claimClass("")), foreign: []string{"held"},
			what:  binderv1.Decision_DECISION_NO_MATCH,
			event: [3]string{corev1.EventTypeNormal, kube.EventFailedBinding, "no persistent volumes available for this claim and no storage class is set"}},
		{name: "a volume whose claimRef names the claim wins over a better fit",
			volumes: []*corev1.PersistentVolume{vol("small", "1Gi"), vol("pre", "9Gi", refTo("data", ""))}, claim: claimWith("1Gi"),
			what: binderv1.Decision_DECISION_BIND, volume: "pre", chosen: true},
		{name: "WaitForFirstConsumer, no pod: a free volume is not bound",
			classes: []*storagev1.StorageClass{class("c", "p", wffc, false)},
			volumes: []*corev1.PersistentVolume{vol("free", "1Gi")}, claim: claimWith("1Gi"),
			what:  binderv1.Decision_DECISION_WAIT_FOR_FIRST_CONSUMER,
			event: [3]string{corev1.EventTypeNormal, kube.EventWaitForFirstConsumer, "waiting for first consumer to be created before binding"}},
		{name: "WaitForFirstConsumer, pods waiting: WaitForPodScheduled names them",
			classes: []*storagev1.StorageClass{class("c", "p", wffc, false)}, claim: claimWith("1Gi"),
			pods:  []*watcherv1.Pod{testPod("web", "data"), testPod("api", "data"), {Namespace: "ns", Name: "placed", ClaimNames: []string{"data"}, NodeName: "n1"}},
			what:  binderv1.Decision_DECISION_WAIT_FOR_FIRST_CONSUMER,
			event: [3]string{corev1.EventTypeNormal, kube.EventWaitForPodScheduled, "waiting for pods api,web to be scheduled"}},
		{name: "WaitForFirstConsumer binds a volume pre-bound to the claim",
			classes: []*storagev1.StorageClass{class("c", "p", wffc, false)},
			volumes: []*corev1.PersistentVolume{vol("free", "1Gi"), vol("pre", "2Gi", refTo("data", ""))}, claim: claimWith("1Gi"),
			what: binderv1.Decision_DECISION_BIND, volume: "pre", chosen: true},
		{name: "WaitForFirstConsumer with a selected node: provision",
			classes: []*storagev1.StorageClass{class("c", "p", wffc, false)},
			volumes: []*corev1.PersistentVolume{vol("free", "1Gi")}, claim: claimWith("1Gi", node("n1")),
			what: binderv1.Decision_DECISION_PROVISION, class: "c", through: kube.ProvisionDecision{Provisioner: "p"}},
		// As upstream (IsDelayBindingProvisioning): the annotation's
		// presence, whatever its value, means the scheduler chose.
		{name: "WaitForFirstConsumer with an empty selected node: provision",
			classes: []*storagev1.StorageClass{class("c", "p", wffc, false)}, claim: claimWith("1Gi", node("")),
			what: binderv1.Decision_DECISION_PROVISION, class: "c", through: kube.ProvisionDecision{Provisioner: "p"}},
		{name: "a class without a volumeBindingMode: error",
			classes: []*storagev1.StorageClass{noMode}, claim: claimWith("1Gi"),
			err: `VolumeBindingMode not set for StorageClass "c"`},
		{name: "a selector that does not parse: error",
			volumes: []*corev1.PersistentVolume{vol("v", "1Gi")}, claim: claimWith("1Gi", badSelector),
			err: `error finding PV for claim "ns/data"`},
		{name: "no class at all: the newest default class, ties by name",
			classes: []*storagev1.StorageClass{class("b-std", "p", imm, true), class("a-std", "p", imm, true), class("c", "p", imm, false)},
			claim:   claimWith("1Gi", noClass),
			what:    binderv1.Decision_DECISION_ASSIGN_DEFAULT_CLASS, class: "a-std"},
		{name: "no class at all, no default: FailedBinding",
			classes: []*storagev1.StorageClass{class("c", "p", imm, false)}, claim: claimWith("1Gi", noClass),
			what:  binderv1.Decision_DECISION_NO_MATCH,
			event: [3]string{corev1.EventTypeNormal, kube.EventFailedBinding, "no persistent volumes available for this claim and no storage class is set"}},
		{name: "the class does not exist: ProvisioningFailed",
			volumes: []*corev1.PersistentVolume{vol("small", "1Gi")}, claim: claimWith("5Gi"),
			what:  binderv1.Decision_DECISION_PROVISION,
			event: [3]string{corev1.EventTypeWarning, kube.EventProvisioningFailed, `storageclass.storage.k8s.io "c" not found`}},
		{name: "a migrated in-tree class: provisioned through its CSI driver",
			classes: []*storagev1.StorageClass{class("c", "kubernetes.io/gce-pd", imm, false)}, claim: claimWith("1Gi"),
			what: binderv1.Decision_DECISION_PROVISION, class: "c", through: kube.ProvisionDecision{Provisioner: "pd.csi.storage.gke.io"}},
		{name: "an in-tree class no plugin provisions: the provisioning fails",
			classes: []*storagev1.StorageClass{class("c", "kubernetes.io/no-such", imm, false)}, claim: claimWith("1Gi"),
			what: binderv1.Decision_DECISION_PROVISION, class: "c", through: kube.ProvisionDecision{Failure: "no volume plugin matched name: kubernetes.io/no-such"}},

		// Claims that name their volume.
		{name: "named volume free and fitting: bind it, not the best fit",
			volumes: []*corev1.PersistentVolume{vol("small", "1Gi"), vol("big", "9Gi")}, claim: claimWith("1Gi", volumeName("big")),
			what: binderv1.Decision_DECISION_BIND, volume: "big"},
		{name: "named volume missing", claim: claimWith("1Gi", volumeName("later")),
			what: binderv1.Decision_DECISION_VOLUME_MISSING},
		{name: "named volume too small: VolumeMismatch",
			volumes: []*corev1.PersistentVolume{vol("small", "1Gi")}, claim: claimWith("5Gi", volumeName("small")),
			what: binderv1.Decision_DECISION_VOLUME_MISMATCH, volume: "small",
			event: [3]string{corev1.EventTypeWarning, kube.EventVolumeMismatch, `Cannot bind to requested volume "small": requested PV is too small`}},
		{name: "named volume names the claim: the bind finishes",
			volumes: []*corev1.PersistentVolume{vol("v", "1Gi", refTo("data", "uid-data"))}, claim: claimWith("1Gi", volumeName("v")),
			what: binderv1.Decision_DECISION_BIND, volume: "v"},
		{name: "named volume bound to another claim: FailedBinding",
			volumes: []*corev1.PersistentVolume{vol("v", "1Gi", refTo("other", "uid-other"))}, claim: claimWith("1Gi", volumeName("v")),
			what: binderv1.Decision_DECISION_VOLUME_TAKEN, volume: "v",
			event: [3]string{corev1.EventTypeWarning, kube.EventFailedBinding, `volume "v" already bound to a different claim.`}},
		{name: "named volume bound to another claim, the claim bound by the controller: FailedBinding and an error",
			volumes: []*corev1.PersistentVolume{vol("v", "1Gi", refTo("other", "uid-other"))},
			claim:   claimWith("1Gi", volumeName("v"), claimAnn(kube.AnnBoundByController, "yes")),
			what:    binderv1.Decision_DECISION_VOLUME_TAKEN, volume: "v",
			event: [3]string{corev1.EventTypeWarning, kube.EventFailedBinding, `volume "v" already bound to a different claim.`},
			err:   `invalid binding of claim "ns/data" to volume "v": volume already claimed by "ns/other"`},

		// Bound claims (bind-completed).
		{name: "bound claim lost its volumeName: Lost", claim: claimWith("1Gi", bound("")),
			what:  binderv1.Decision_DECISION_LOST,
			event: [3]string{corev1.EventTypeWarning, kube.EventClaimLost, "Bound claim has lost reference to PersistentVolume. Data on the volume is lost!"}},
		{name: "bound claim's volume gone: Lost", claim: claimWith("1Gi", bound("gone")),
			what:  binderv1.Decision_DECISION_LOST,
			event: [3]string{corev1.EventTypeWarning, kube.EventClaimLost, "Bound claim has lost its PersistentVolume. Data on the volume is lost!"}},
		{name: "bound claim, volume without claimRef: bind again",
			volumes: []*corev1.PersistentVolume{vol("v", "1Gi")}, claim: claimWith("1Gi", bound("v")),
			what: binderv1.Decision_DECISION_BIND, volume: "v"},
		{name: "bound claim, all in place: bound",
			volumes: []*corev1.PersistentVolume{vol("v", "1Gi", refTo("data", "uid-data"))}, claim: claimWith("1Gi", bound("v")),
			what: binderv1.Decision_DECISION_BOUND, volume: "v"},
		{name: "bound claim, volume bound to another: Misbound",
			volumes: []*corev1.PersistentVolume{vol("v", "1Gi", refTo("other", "uid-other"))}, claim: claimWith("1Gi", bound("v")),
			what: binderv1.Decision_DECISION_MISBOUND, volume: "v",
			event: [3]string{corev1.EventTypeWarning, kube.EventClaimMisbound, "Two claims are bound to the same volume, this one is bound incorrectly"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, pods := newStore(), newPodIndex()
			for _, sc := range tc.classes {
				s.putClass(sc)
			}
			for _, v := range tc.volumes {
				s.putVolume(v)
			}
			for i, p := range tc.pods {
				pods.put(p.Namespace+"/"+p.Name, p, string(rune('1'+i)))
			}
			for name, uid := range tc.reserved {
				s.reserved[name] = uid
			}
			for _, name := range tc.foreign {
				s.markForeign(name, time.Hour)
			}
			claim := tc.claim
			d, err := decide(claim, syncView{s, pods, nil, newReservations(nil, s)})
			if err == nil {
				err = d.err
			}
			if (err != nil) != (tc.err != "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("error %v, want one with %q", err, tc.err)
			}
			if tc.what == binderv1.Decision_DECISION_UNSPECIFIED {
				return // decide failed, as it should
			}
			volume := ""
			if d.volume != nil {
				volume = d.volume.Name
			}
			if d.what != tc.what || volume != tc.volume || d.chosen != tc.chosen || className(d.class) != tc.class || d.through != tc.through {
				t.Fatalf("decided %v volume %s (chosen %v) class %s through %+v, want %v %s (%v) %s %+v",
					d.what, volume, d.chosen, className(d.class), d.through, tc.what, tc.volume, tc.chosen, tc.class, tc.through)
			}
			if got := [3]string{d.event.kind, d.event.reason, d.event.message}; got != tc.event {
				t.Errorf("event %q, want %q", got, tc.event)
			}
			if (d.why == "") != (d.what == binderv1.Decision_DECISION_BOUND) {
				t.Errorf("why %q for %v", d.why, d.what)
			}
			// The sync's view holds the volume it chose for the claim, and
			// nothing else; deciding again decides the same.
			for v, uid := range s.reserved {
				if want, ok := tc.reserved[v]; uid == claim.UID && (!ok || want != uid) && (!d.chosen || v != d.volume.Name) {
					t.Errorf("volume %s held for the claim", v)
				}
			}
			if d.chosen && s.reserved[d.volume.Name] != claim.UID {
				t.Errorf("chosen volume %s not held for the claim", d.volume.Name)
			}
			again, err := decide(claim, syncView{s, pods, nil, newReservations(nil, s)})
			if err != nil || again.what != d.what || again.volume != d.volume {
				t.Errorf("decided again %v %s (%v), first %v %s", again.what, name(again.volume), err, d.what, name(d.volume))
			}
		})
	}
}

func className(c *storagev1.StorageClass) string {
	if c == nil {
		return ""
	}
	return c.Name
}

// Explain and the sync agree on every claim row of the transitions table:
// what ExplainClaim says before the sync is what the sync then does, as
// its requests, Events and objects show (didDecide).
func TestExplainAgreesWithSync(t *testing.T) {
	rows := 0
	for _, tc := range transitions() {
		kind, key, _ := strings.Cut(tc.sync, "/")
		if kind != "pvc" {
			continue
		}
		rows++
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			c, client, recorder := setUpTransition(t, tc)
			ns, n, _ := strings.Cut(key, "/")
			a := &api{c: c, memberID: "m"}
			ex, err := a.ExplainClaim(ctx, &binderv1.ExplainClaimRequest{Namespace: ns, Name: n})
			if err != nil {
				t.Fatal(err)
			}
			if got := reasons(recorder); len(got) > 0 {
				t.Fatalf("explain recorded %q", got)
			}
			before := c.store.claim(key)
			client.ClearActions() // explain may read the selected Node
			_ = syncTransition(ctx, t, c, tc)
			after, err := client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			did := didDecide(before, after, requests(client), reasons(recorder))
			if ex.Decision != did {
				t.Fatalf("explain says %v (%s), the sync did %v", ex.Decision, ex.Message, did)
			}
			switch ex.Decision {
			case binderv1.Decision_DECISION_BIND:
				if after.Spec.VolumeName != ex.WouldBind {
					t.Errorf("explain would bind %s, the sync bound %q", ex.WouldBind, after.Spec.VolumeName)
				}
			case binderv1.Decision_DECISION_REBIND:
				if after.Spec.VolumeName != "" && after.Spec.VolumeName != ex.WouldBind {
					t.Errorf("explain would rebind %s, the sync bound %q", ex.WouldBind, after.Spec.VolumeName)
				}
			case binderv1.Decision_DECISION_BOUND:
				if after.Spec.VolumeName != ex.Binding.GetVolumeName() {
					t.Errorf("explain says bound to %s, the claim is bound to %q", ex.Binding.GetVolumeName(), after.Spec.VolumeName)
				}
			}
		})
	}
	if rows < 20 {
		t.Fatalf("only %d claim rows in the transitions table", rows)
	}
}

// didDecide is the decision a claim's sync carried out, read from its
// effects alone: the first Event it recorded, else what it wrote.
func didDecide(before, after *corev1.PersistentVolumeClaim, writes, events []string) binderv1.Decision {
	if len(events) > 0 {
		switch events[0] {
		case kube.EventWaitForFirstConsumer, kube.EventWaitForPodScheduled:
			return binderv1.Decision_DECISION_WAIT_FOR_FIRST_CONSUMER
		case kube.EventExternalProvisioning, kube.EventProvisioningFailed:
			return binderv1.Decision_DECISION_PROVISION
		case kube.EventVolumeMismatch:
			return binderv1.Decision_DECISION_VOLUME_MISMATCH
		case kube.EventClaimLost:
			return binderv1.Decision_DECISION_LOST
		case kube.EventClaimMisbound:
			return binderv1.Decision_DECISION_MISBOUND
		case EventVolumeRebound, EventVolumeRebindRefused:
			return binderv1.Decision_DECISION_REBIND
		case kube.EventFailedBinding:
			if before.Spec.VolumeName != "" {
				return binderv1.Decision_DECISION_VOLUME_TAKEN
			}
			return binderv1.Decision_DECISION_NO_MATCH
		}
		return binderv1.Decision_DECISION_UNSPECIFIED
	}
	wrote := func(w string) bool { return slices.Contains(writes, w) }
	switch {
	case wrote("update persistentvolumes") || wrote("update persistentvolumes/status"):
		return binderv1.Decision_DECISION_BIND
	case !equalClass(before.Spec.StorageClassName, after.Spec.StorageClassName):
		return binderv1.Decision_DECISION_ASSIGN_DEFAULT_CLASS
	case after.Status.Phase == corev1.ClaimBound && after.Spec.VolumeName == before.Spec.VolumeName && !wrote("update persistentvolumeclaims"):
		return binderv1.Decision_DECISION_BOUND // nothing to write, or a rebind refused
	case after.Status.Phase == corev1.ClaimPending && after.Spec.VolumeName != "":
		return binderv1.Decision_DECISION_VOLUME_MISSING
	}
	return binderv1.Decision_DECISION_UNSPECIFIED
}

func equalClass(a, b *string) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

// decide's errors reach explain's callers with their codes: a class
// without a volumeBindingMode is FailedPrecondition, a selector that does
// not parse InvalidArgument.
func TestExplainDecideErrors(t *testing.T) {
	noMode := class("c", "p", storagev1.VolumeBindingImmediate, false)
	noMode.VolumeBindingMode = nil
	for _, tc := range []struct {
		name  string
		class *storagev1.StorageClass
		claim *corev1.PersistentVolumeClaim
		code  codes.Code
	}{
		{"no volumeBindingMode", noMode, claimWith("1Gi"), codes.FailedPrecondition},
		{"bad selector", class("c", "p", storagev1.VolumeBindingImmediate, false), claimWith("1Gi", func(c *corev1.PersistentVolumeClaim) {
			c.Spec.Selector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tier", Operator: "Near"}}}
		}), codes.InvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newController(slog.New(slog.NewTextHandler(io.Discard, nil)), nil, nil)
			c.store.putClass(tc.class)
			c.store.putClaim(tc.claim)
			c.Synced()
			a := &api{c: c, memberID: "m"}
			_, err := a.ExplainClaim(t.Context(), &binderv1.ExplainClaimRequest{Namespace: "ns", Name: "data"})
			if status.Code(err) != tc.code {
				t.Fatalf("%v, want %v", err, tc.code)
			}
		})
	}
}
