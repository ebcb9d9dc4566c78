package conformance

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
)

func binderChecks() []Check {
	kube := []string{"kube"}
	return []Check{
		{Name: "get-status", run: checkBinderStatus,
			Doc: "GetStatus answers and becomes synced (the binder's cache holds the watcher's initial list)."},
		{Name: "invalid-argument", run: checkBinderInvalid,
			Doc: "GetClaim, SyncClaim (invalid or no namespace or name), GetVolume, SyncVolume (invalid or no name), ListClaims and ListVolumes (a negative page_size, a phase that is not one) answer InvalidArgument."},
		{Name: "not-found", run: checkBinderNotFound,
			Doc: "GetClaim, SyncClaim, GetVolume and SyncVolume of objects that do not exist answer NotFound."},
		{Name: "static-binding", Needs: kube, run: checkStaticBinding,
			Doc: "A claim and a fitting Available volume of a class with no provisioner get bound as Kubernetes binds them (both Bound, the volume's claimRef with the claim's UID, pv.kubernetes.io/bind-completed and bound-by-controller); GetClaim and GetVolume show it (phase, volume_name, claim_ref, bind_completed, bound_by_controller, capacity); SyncClaim and SyncVolume accept them; once the claim is deleted GetClaim is NotFound and the volume Released."},
		{Name: "pre-bound", Needs: kube, run: checkPreBound,
			Doc: "A claim that names its volume (spec.volumeName) is bound to it, not by the controller (bound_by_controller false on the claim)."},
		{Name: "list-claims", Needs: kube, run: checkListClaims,
			Doc: "ListClaims filters by namespace and phase, lists in key order, and its pages (page_size 1, next_page_token) hold every claim exactly once; ListVolumes lists in name order with pages that hold every volume once, and filters by phase."},
		{Name: "dynamic-provisioning", Needs: []string{"kube", "provisioner-name"}, run: checkDynamic,
			Doc: "A claim of a class of --provisioner-name with no fitting volume is provisioned through the binder's provisioner and bound: the claim Bound to a volume with pv.kubernetes.io/provisioned-by and a claimRef with its UID; GetClaim shows storage_provisioner; GetVolume shows provisioned_by. Deleting the claim deletes the volume (policy Delete), when a reclaimer runs."},
	}
}

func (t *T) binder() binderv1.BinderServiceClient {
	return binderv1.NewBinderServiceClient(t.s.conn)
}

func checkBinderStatus(t *T) {
	t.Eventually("the binder synced", func() string {
		st, err := t.binder().GetStatus(t.ctx, &binderv1.GetStatusRequest{})
		if err != nil {
			return t.retry("GetStatus", err)
		}
		if !st.GetSynced() {
			return "GetStatus says not synced"
		}
		return ""
	})
}

func checkBinderInvalid(t *T) {
	b := t.binder()
	calls := []struct {
		what string
		call func() error
	}{}
	add := func(what string, call func() error) {
		calls = append(calls, struct {
			what string
			call func() error
		}{what, call})
	}
	for _, n := range []struct{ ns, name string }{{"", "claim"}, {"default", ""}, {"Not_A_Namespace", "claim"}, {"default", "not a name!"}} {
		add(fmt.Sprintf("GetClaim of %q/%q", n.ns, n.name), func() error {
			_, err := b.GetClaim(t.ctx, &binderv1.GetClaimRequest{Namespace: n.ns, Name: n.name})
			return err
		})
		add(fmt.Sprintf("SyncClaim of %q/%q", n.ns, n.name), func() error {
			_, err := b.SyncClaim(t.ctx, &binderv1.SyncClaimRequest{Namespace: n.ns, Name: n.name})
			return err
		})
	}
	for _, n := range []string{"", "not a name!"} {
		add(fmt.Sprintf("GetVolume of %q", n), func() error {
			_, err := b.GetVolume(t.ctx, &binderv1.GetVolumeRequest{Name: n})
			return err
		})
		add(fmt.Sprintf("SyncVolume of %q", n), func() error {
			_, err := b.SyncVolume(t.ctx, &binderv1.SyncVolumeRequest{Name: n})
			return err
		})
	}
	add("ListClaims with page_size -1", func() error {
		_, err := b.ListClaims(t.ctx, &binderv1.ListClaimsRequest{PageSize: -1})
		return err
	})
	add("ListClaims with phase Available (a volume's, not a claim's)", func() error {
		_, err := b.ListClaims(t.ctx, &binderv1.ListClaimsRequest{Phase: "Available"})
		return err
	})
	add("ListVolumes with page_size -1", func() error {
		_, err := b.ListVolumes(t.ctx, &binderv1.ListVolumesRequest{PageSize: -1})
		return err
	})
	add("ListVolumes with phase Lost (a claim's, not a volume's)", func() error {
		_, err := b.ListVolumes(t.ctx, &binderv1.ListVolumesRequest{Phase: "Lost"})
		return err
	})
	for _, c := range calls {
		expectCode(t, c.what, c.call(), codes.InvalidArgument)
	}
}

// synced waits until the binder answers reads.
func (t *T) binderSynced() {
	t.Eventually("the binder synced", func() string {
		_, err := t.binder().ListVolumes(t.ctx, &binderv1.ListVolumesRequest{PageSize: 1})
		if err != nil {
			return t.retry("ListVolumes", err)
		}
		return ""
	})
}

func checkBinderNotFound(t *T) {
	t.binderSynced()
	b := t.binder()
	ns, name := "conformance-absent", t.s.name("absent")
	_, err := b.GetClaim(t.ctx, &binderv1.GetClaimRequest{Namespace: ns, Name: name})
	expectCode(t, "GetClaim of a claim that does not exist", err, codes.NotFound)
	_, err = b.SyncClaim(t.ctx, &binderv1.SyncClaimRequest{Namespace: ns, Name: name})
	expectCode(t, "SyncClaim of a claim that does not exist", err, codes.NotFound)
	_, err = b.GetVolume(t.ctx, &binderv1.GetVolumeRequest{Name: name})
	expectCode(t, "GetVolume of a volume that does not exist", err, codes.NotFound)
	_, err = b.SyncVolume(t.ctx, &binderv1.SyncVolumeRequest{Name: name})
	expectCode(t, "SyncVolume of a volume that does not exist", err, codes.NotFound)
}

// boundClaim waits until the API server shows the claim Bound and its
// volume Bound to it, and returns both.
func (t *T) boundClaim(ns, name string) (*corev1.PersistentVolumeClaim, *corev1.PersistentVolume) {
	var c *corev1.PersistentVolumeClaim
	var v *corev1.PersistentVolume
	t.Eventually("claim "+ns+"/"+name+" bound", func() string {
		var err error
		if c, err = t.kube().CoreV1().PersistentVolumeClaims(ns).Get(t.ctx, name, metav1.GetOptions{}); err != nil {
			return err.Error()
		}
		if c.Status.Phase != corev1.ClaimBound || c.Spec.VolumeName == "" {
			return fmt.Sprintf("claim phase %q, volumeName %q", c.Status.Phase, c.Spec.VolumeName)
		}
		if v = t.getVolume(c.Spec.VolumeName); v == nil {
			return "volume " + c.Spec.VolumeName + " does not exist"
		}
		if v.Status.Phase != corev1.VolumeBound || v.Spec.ClaimRef == nil || v.Spec.ClaimRef.UID != c.UID {
			return fmt.Sprintf("volume %s phase %q, claimRef %v", v.Name, v.Status.Phase, v.Spec.ClaimRef)
		}
		return ""
	})
	if c.Annotations["pv.kubernetes.io/bind-completed"] == "" {
		t.Errorf("bound claim %s/%s lacks pv.kubernetes.io/bind-completed", ns, name)
	}
	return c, v
}

// binderClaim waits until GetClaim satisfies ok, and returns it.
func (t *T) binderClaim(ns, name string, ok func(*binderv1.Claim) string) *binderv1.Claim {
	var out *binderv1.Claim
	t.Eventually("GetClaim of "+ns+"/"+name, func() string {
		resp, err := t.binder().GetClaim(t.ctx, &binderv1.GetClaimRequest{Namespace: ns, Name: name})
		if err != nil {
			return t.retry("GetClaim", err)
		}
		out = resp.GetClaim()
		return ok(out)
	})
	return out
}

// binderVolume waits until GetVolume satisfies ok, and returns it.
func (t *T) binderVolume(name string, ok func(*binderv1.Volume) string) *binderv1.Volume {
	var out *binderv1.Volume
	t.Eventually("GetVolume of "+name, func() string {
		resp, err := t.binder().GetVolume(t.ctx, &binderv1.GetVolumeRequest{Name: name})
		if err != nil {
			return t.retry("GetVolume", err)
		}
		out = resp.GetVolume()
		return ok(out)
	})
	return out
}

// boundView waits until the binder's reads show the binding the API
// server has, and checks what they say.
func (t *T) boundView(c *corev1.PersistentVolumeClaim, v *corev1.PersistentVolume, byController bool) {
	size := v.Spec.Capacity[corev1.ResourceStorage]
	bc := t.binderClaim(c.Namespace, c.Name, func(bc *binderv1.Claim) string {
		if bc.GetPhase() != "Bound" || bc.GetVolumeName() != v.Name || !bc.GetBindCompleted() {
			return fmt.Sprintf("phase %q, volume_name %q, bind_completed %v", bc.GetPhase(), bc.GetVolumeName(), bc.GetBindCompleted())
		}
		return ""
	})
	if bc.GetUid() != string(c.UID) || bc.GetStorageClassName() != *c.Spec.StorageClassName || bc.GetCapacityBytes() != size.Value() ||
		!slices.Contains(bc.GetAccessModes(), "ReadWriteOnce") || bc.GetBoundByController() != byController {
		t.Errorf("GetClaim: %v; want uid %s, class %q, capacity %d, ReadWriteOnce, bound_by_controller %v", bc, c.UID, *c.Spec.StorageClassName, size.Value(), byController)
	}
	bv := t.binderVolume(v.Name, func(bv *binderv1.Volume) string {
		if bv.GetPhase() != "Bound" || bv.GetClaimRef().GetUid() != string(c.UID) {
			return fmt.Sprintf("phase %q, claim_ref %v", bv.GetPhase(), bv.GetClaimRef())
		}
		return ""
	})
	if r := bv.GetClaimRef(); r.GetNamespace() != c.Namespace || r.GetName() != c.Name || bv.GetUid() != string(v.UID) || bv.GetCapacityBytes() != size.Value() {
		t.Errorf("GetVolume: %v; want claim_ref %s/%s, uid %s, capacity %d", bv, c.Namespace, c.Name, v.UID, size.Value())
	}
	if _, err := t.binder().SyncClaim(t.ctx, &binderv1.SyncClaimRequest{Namespace: c.Namespace, Name: c.Name}); err != nil {
		t.Errorf("SyncClaim of a claim it knows: %s", describe(err))
	}
	if _, err := t.binder().SyncVolume(t.ctx, &binderv1.SyncVolumeRequest{Name: v.Name}); err != nil {
		t.Errorf("SyncVolume of a volume it knows: %s", describe(err))
	}
}

func checkStaticBinding(t *T) {
	ns := t.namespace()
	class := t.s.name("static")
	v := t.createVolume(t.newVolume(t.s.name("pv"), class, "2Mi"))
	t.createClaim(t.newClaim(ns, "static", class, "1Mi"))
	c, bound := t.boundClaim(ns, "static")
	if bound.Name != v.Name {
		t.Fatalf("claim bound to %s, want %s, the only volume of its class", bound.Name, v.Name)
	}
	if c.Annotations["pv.kubernetes.io/bound-by-controller"] == "" || bound.Annotations["pv.kubernetes.io/bound-by-controller"] == "" {
		t.Errorf("a binding the controller chose: pv.kubernetes.io/bound-by-controller on claim %v and volume %v", c.Annotations, bound.Annotations)
	}
	size := c.Status.Capacity[corev1.ResourceStorage]
	if size.Cmp(bound.Spec.Capacity[corev1.ResourceStorage]) != 0 {
		t.Errorf("claim status capacity %s, want the volume's", size.String())
	}
	t.boundView(c, bound, true)

	t.deleteClaimWait(ns, c.Name)
	t.Eventually("GetClaim of the deleted claim NotFound", func() string {
		_, err := t.binder().GetClaim(t.ctx, &binderv1.GetClaimRequest{Namespace: ns, Name: c.Name})
		switch {
		case status.Code(err) == codes.NotFound:
			return ""
		case err == nil:
			return "it still answers the claim"
		case transient(err):
			return describe(err)
		}
		t.Fatalf("GetClaim of a deleted claim: %s, want NotFound", describe(err))
		return ""
	})
	t.Eventually("volume "+v.Name+" Released", func() string {
		now := t.getVolume(v.Name)
		if now == nil {
			t.Fatalf("volume %s with policy Retain is gone", v.Name)
		}
		if now.Status.Phase != corev1.VolumeReleased {
			return "phase " + string(now.Status.Phase)
		}
		return ""
	})
}

func checkPreBound(t *T) {
	ns := t.namespace()
	class := t.s.name("prebound")
	decoy := t.createVolume(t.newVolume(t.s.name("pv"), class, "1Mi"))
	want := t.createVolume(t.newVolume(t.s.name("pv"), class, "5Mi"))
	claim := t.newClaim(ns, "prebound", class, "1Mi")
	claim.Spec.VolumeName = want.Name
	t.createClaim(claim)
	c, v := t.boundClaim(ns, claim.Name)
	if v.Name != want.Name {
		t.Fatalf("claim naming %s bound to %s", want.Name, v.Name)
	}
	if c.Annotations["pv.kubernetes.io/bound-by-controller"] != "" {
		t.Errorf("a claim that named its volume is not bound by the controller: annotations %v", c.Annotations)
	}
	t.boundView(c, v, false)
	if d := t.getVolume(decoy.Name); d == nil || d.Spec.ClaimRef != nil {
		t.Errorf("volume %s, which the claim did not name, got claimRef %v", decoy.Name, d.Spec.ClaimRef)
	}
}

// checkListClaims checks ListClaims: a namespace's claims in key order,
// in pages, by phase, and the whole list in key order; then ListVolumes.
func checkListClaims(t *T) {
	ns := t.namespace()
	class := t.s.name("list")
	names := []string{"c", "a", "b"}
	for _, n := range names {
		t.createClaim(t.newClaim(ns, n, class, "1Mi"))
	}
	v := t.createVolume(t.newVolume(t.s.name("pv"), t.s.name("unmatched"), "1Mi"))
	b := t.binder()
	want := []string{ns + "/a", ns + "/b", ns + "/c"}
	t.Eventually("ListClaims of namespace "+ns, func() string {
		resp, err := b.ListClaims(t.ctx, &binderv1.ListClaimsRequest{Namespace: ns})
		if err != nil {
			return t.retry("ListClaims", err)
		}
		if got := claimKeys(resp.GetClaims()); !slices.Equal(got, want) {
			return fmt.Sprintf("lists %v, want %v", got, want)
		}
		return ""
	})
	checkClaimPages(t, b, ns, want)
	for _, tc := range []struct {
		phase string
		want  []string
	}{{"Pending", want}, {"Bound", nil}} {
		resp, err := b.ListClaims(t.ctx, &binderv1.ListClaimsRequest{Namespace: ns, Phase: tc.phase})
		if err != nil {
			t.Fatalf("ListClaims: %s", describe(err))
		}
		if got := claimKeys(resp.GetClaims()); !slices.Equal(got, tc.want) {
			t.Errorf("ListClaims of phase %s in %s: %v, want %v", tc.phase, ns, got, tc.want)
		}
	}
	all, err := b.ListClaims(t.ctx, &binderv1.ListClaimsRequest{})
	if err != nil {
		t.Fatalf("ListClaims: %s", describe(err))
	}
	if keys := claimKeys(all.GetClaims()); !sort.StringsAreSorted(keys) {
		t.Errorf("ListClaims is not in key order: %v", keys)
	}
	checkListVolumes(t, b, v)
}

// checkListVolumes checks ListVolumes' pages (in name order, each volume
// once, v among them) and its phase filter, with v an unmatched, so
// Available, volume.
func checkListVolumes(t *T, b binderv1.BinderServiceClient, v *corev1.PersistentVolume) {
	t.binderVolume(v.Name, func(bv *binderv1.Volume) string {
		if bv.GetPhase() != "Available" {
			return "phase " + bv.GetPhase()
		}
		return ""
	})
	var volumes []string
	token := ""
	for pages := 0; ; pages++ {
		if pages > 100000 {
			t.Fatalf("ListVolumes pages do not end")
		}
		resp, err := b.ListVolumes(t.ctx, &binderv1.ListVolumesRequest{PageSize: 50, PageToken: token})
		if err != nil {
			t.Fatalf("ListVolumes page: %s", describe(err))
		}
		if len(resp.GetVolumes()) > 50 {
			t.Errorf("ListVolumes with page_size 50 answered %d volumes", len(resp.GetVolumes()))
		}
		for _, bv := range resp.GetVolumes() {
			volumes = append(volumes, bv.GetName())
		}
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
	}
	if !sort.StringsAreSorted(volumes) || len(slices.Compact(slices.Clone(volumes))) != len(volumes) {
		t.Errorf("ListVolumes pages are not in name order, or repeat a volume: %v", volumes)
	}
	if !slices.Contains(volumes, v.Name) {
		t.Errorf("ListVolumes pages lack volume %s", v.Name)
	}
	for _, tc := range []struct {
		phase string
		want  bool
	}{{"Available", true}, {"Bound", false}} {
		resp, err := b.ListVolumes(t.ctx, &binderv1.ListVolumesRequest{Phase: tc.phase, PageSize: 5000})
		if err != nil {
			t.Fatalf("ListVolumes: %s", describe(err))
		}
		got := slices.ContainsFunc(resp.GetVolumes(), func(bv *binderv1.Volume) bool { return bv.GetName() == v.Name })
		if got != tc.want {
			t.Errorf("ListVolumes of phase %s lists Available volume %s: %v, want %v", tc.phase, v.Name, got, tc.want)
		}
	}
}

// checkClaimPages lists namespace ns's claims one a page and wants them
// all, in key order.
func checkClaimPages(t *T, b binderv1.BinderServiceClient, ns string, want []string) {
	var paged []string
	token := ""
	for range 10 {
		resp, err := b.ListClaims(t.ctx, &binderv1.ListClaimsRequest{Namespace: ns, PageSize: 1, PageToken: token})
		if err != nil {
			t.Fatalf("ListClaims page: %s", describe(err))
		}
		if len(resp.GetClaims()) > 1 {
			t.Errorf("ListClaims with page_size 1 answered %d claims", len(resp.GetClaims()))
		}
		paged = append(paged, claimKeys(resp.GetClaims())...)
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
	}
	if !slices.Equal(paged, want) {
		t.Errorf("ListClaims in pages of 1: %v, want %v", paged, want)
	}
}

func claimKeys(cs []*binderv1.Claim) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.GetNamespace()+"/"+c.GetName())
	}
	return out
}

func checkDynamic(t *T) {
	ns := t.namespace()
	class := t.createClass(t.s.cfg.ProvisionerName)
	claim := t.createClaim(t.newClaim(ns, "dynamic", class.Name, "1Mi"))
	c, v := t.boundClaim(ns, claim.Name)
	t.Cleanup(func(ctx context.Context) {
		// A reclaimer deletes the volume (policy Delete); give it time.
		deleteClaim(ctx, t.kube(), ns, c.Name)
		deadline := time.Now().Add(time.Minute)
		for time.Now().Before(deadline) {
			if _, err := t.kube().CoreV1().PersistentVolumes().Get(ctx, v.Name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
		t.s.logf("    %s: volume %s was not deleted after its claim (no reclaimer?); left in place", t.name, v.Name)
	})
	if by := v.Annotations[annProvisionedBy]; by != t.s.cfg.ProvisionerName {
		t.Errorf("volume %s: %s %q, want %q", v.Name, annProvisionedBy, by, t.s.cfg.ProvisionerName)
	}
	if v.Spec.StorageClassName != class.Name {
		t.Errorf("volume %s: class %q, want %q", v.Name, v.Spec.StorageClassName, class.Name)
	}
	if c.Annotations["volume.kubernetes.io/storage-provisioner"] != t.s.cfg.ProvisionerName {
		t.Errorf("claim: volume.kubernetes.io/storage-provisioner %q, want %q", c.Annotations["volume.kubernetes.io/storage-provisioner"], t.s.cfg.ProvisionerName)
	}
	bc := t.binderClaim(ns, c.Name, func(bc *binderv1.Claim) string {
		if bc.GetPhase() != "Bound" {
			return "phase " + bc.GetPhase()
		}
		return ""
	})
	if bc.GetStorageProvisioner() != t.s.cfg.ProvisionerName || bc.GetVolumeName() != v.Name {
		t.Errorf("GetClaim: storage_provisioner %q, volume_name %q; want %q, %q", bc.GetStorageProvisioner(), bc.GetVolumeName(), t.s.cfg.ProvisionerName, v.Name)
	}
	t.binderVolume(v.Name, func(bv *binderv1.Volume) string {
		if bv.GetProvisionedBy() != t.s.cfg.ProvisionerName || bv.GetPhase() != "Bound" {
			return fmt.Sprintf("provisioned_by %q, phase %q", bv.GetProvisionedBy(), bv.GetPhase())
		}
		return ""
	})
}
