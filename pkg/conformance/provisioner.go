package conformance

import (
	"context"
	"fmt"
	"slices"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

func provisionerChecks() []Check {
	kube := []string{"kube"}
	return []Check{
		{Name: "list-drivers", run: checkListDrivers,
			Doc: "ListDrivers lists at least one driver, each with its provisioner_name and driver_name; the driver under test (--provisioner-name, else the first with CREATE_DELETE_VOLUME) becomes ready and lists CREATE_DELETE_VOLUME."},
		{Name: "provision-invalid-argument", run: checkProvisionInvalid,
			Doc: "Provision answers InvalidArgument, before reading anything, for: no claim named, an invalid namespace or name, claim or storage_class bytes that are not Kubernetes protobuf, a claim in the request naming another claim or another UID."},
		{Name: "provision-not-found", Needs: kube, run: checkProvisionNotFound,
			Doc: "Provision of a claim that does not exist (in an existing namespace, and in a namespace that does not exist) is NotFound."},
		{Name: "provision-failed-precondition", Needs: kube, run: checkProvisionPrecondition,
			Doc: "Provision is FailedPrecondition for a claim whose UID is not claim_uid (recreated), that names no StorageClass, that asks for another volume (spec.volumeName), or whose class's provisioner is not served; NotFound or FailedPrecondition when its class does not exist; NO_CHANGE (or FailedPrecondition) for a claim being deleted. No PersistentVolume is made for any of them."},
		{Name: "provision-idempotent", Needs: kube, run: checkProvisionIdempotent,
			Doc: "Provision of a claim of the driver's class ends FINISHED (IN_BACKGROUND is retried) with the PersistentVolume: named volume_name, a claimRef with the claim's UID, the driver's CSI source, the class's name and reclaim policy, at least the size asked for, pv.kubernetes.io/provisioned-by. Asked again (the same request, with the claim and class sent as hints, without claim_uid) it answers FINISHED with the same volume (name, UID, volume handle); exactly one PersistentVolume names the claim; the backing volume exists (with --csi-endpoint); ListOperations holds nothing for it once finished."},
		{Name: "provision-outcomes", Needs: kube, run: checkProvisionOutcomes,
			Doc: "A driver's refusal is an outcome, not an error: Provision of a Block claim answers FINISHED with a Block volume (a driver that serves block), or NO_CHANGE with a message (one that does not; the dev driver), then no PersistentVolume exists, asking again answers NO_CHANGE again, and ListOperations holds nothing for it."},
		{Name: "delete-volume-invalid-argument", run: checkDeleteInvalid,
			Doc: "DeleteVolume answers InvalidArgument for no volume_name, an invalid name, volume bytes that are not Kubernetes protobuf, and a volume in the request of another name."},
		{Name: "delete-volume-unknown-volume", run: checkDeleteUnknown,
			Doc: "DeleteVolume of a PersistentVolume that does not exist (and whose deletion this provisioner never journaled) is FailedPrecondition: there is nothing it may delete."},
		{Name: "delete-volume-not-served", Needs: kube, run: checkDeleteNotServed,
			Doc: "DeleteVolume of a Released volume with policy Delete that is not of a served CSI driver (an NFS volume, a CSI volume of another driver) is FailedPrecondition."},
		{Name: "delete-volume-lifecycle", Needs: kube, run: checkDeleteLifecycle,
			Doc: "DeleteVolume refuses (FailedPrecondition) while the claim exists (also when the request carries a forged Released copy of the volume), for reclaim policy Retain, and when the volume sent has another UID, and deletes nothing then; once the claim is gone and the volume Released with policy Delete it ends FINISHED (IN_BACKGROUND is retried), and asked again it is FINISHED again (idempotent); the PersistentVolume object stays (the caller deletes it); the backing volume is gone (with --csi-endpoint); ListOperations holds nothing for it once finished."},
		{Name: "list-operations", run: checkListOperations,
			Doc: "ListOperations answers; every operation has kind provision or delete and a volume_name."},
		{Name: "optional-rpcs", run: checkOptionalRPCs,
			Doc: "GetCapacity, ListOrphans and DeleteOrphan are Unimplemented, or answer InvalidArgument without a driver name (GetCapacity, DeleteOrphan) and NotFound for a driver not served."},
	}
}

func (t *T) provisioner() provisionerv1.ProvisionerServiceClient {
	return provisionerv1.NewProvisionerServiceClient(t.s.conn)
}

// driver is the driver under test, once ready.
func (t *T) driver() *provisionerv1.Driver {
	var d *provisionerv1.Driver
	t.Eventually("a ready driver", func() string {
		resp, err := t.provisioner().ListDrivers(t.ctx, &provisionerv1.ListDriversRequest{})
		if err != nil {
			return t.retry("ListDrivers", err)
		}
		d = pickDriver(resp.GetDrivers(), t.s.cfg.ProvisionerName)
		switch {
		case d == nil && t.s.cfg.ProvisionerName != "":
			return fmt.Sprintf("ListDrivers lists no driver of provisioner %q: %v", t.s.cfg.ProvisionerName, resp.GetDrivers())
		case d == nil:
			return fmt.Sprintf("ListDrivers lists no driver with CREATE_DELETE_VOLUME: %v", resp.GetDrivers())
		case !d.GetReady():
			return fmt.Sprintf("driver %q is not ready: %s", d.GetProvisionerName(), d.GetMessage())
		}
		return ""
	})
	return d
}

func pickDriver(ds []*provisionerv1.Driver, name string) *provisionerv1.Driver {
	for _, d := range ds {
		if name != "" && d.GetProvisionerName() == name {
			return d
		}
		if name == "" && slices.Contains(d.GetCapabilities(), "CREATE_DELETE_VOLUME") {
			return d
		}
	}
	return nil
}

func checkListDrivers(t *T) {
	resp, err := t.provisioner().ListDrivers(t.ctx, &provisionerv1.ListDriversRequest{})
	if err != nil {
		t.Fatalf("ListDrivers: %s", describe(err))
	}
	if len(resp.GetDrivers()) == 0 {
		t.Fatalf("ListDrivers lists no driver")
	}
	for _, d := range resp.GetDrivers() {
		if d.GetProvisionerName() == "" || d.GetDriverName() == "" {
			t.Errorf("driver %v: provisioner_name and driver_name are required", d)
		}
	}
	d := t.driver()
	if !slices.Contains(d.GetCapabilities(), "CREATE_DELETE_VOLUME") {
		t.Errorf("driver %q does not list CREATE_DELETE_VOLUME in its capabilities %v", d.GetProvisionerName(), d.GetCapabilities())
	}
}

// garbage is not Kubernetes protobuf of anything: a varint longer than 64
// bits.
var garbage = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}

func mustEncode(t *T, o interface{ Marshal() ([]byte, error) }) []byte {
	b, err := o.Marshal()
	if err != nil {
		t.Fatalf("encode: %v", err)
	}
	return b
}

func checkProvisionInvalid(t *T) {
	const ns, name, uid = "conformance-absent", "claim", "9b4a1a8e-0000-4000-8000-000000000001"
	other := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "another-claim", UID: uid}}
	otherUID := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: "9b4a1a8e-0000-4000-8000-000000000002"}}
	for _, tc := range []struct {
		what string
		req  *provisionerv1.ProvisionRequest
	}{
		{"an empty request", &provisionerv1.ProvisionRequest{}},
		{"no claim_name", &provisionerv1.ProvisionRequest{ClaimNamespace: ns}},
		{"an invalid claim_namespace", &provisionerv1.ProvisionRequest{ClaimNamespace: "Not_A_Namespace", ClaimName: name}},
		{"an invalid claim_name", &provisionerv1.ProvisionRequest{ClaimNamespace: ns, ClaimName: "not a name!"}},
		{"claim bytes that are not a claim", &provisionerv1.ProvisionRequest{ClaimNamespace: ns, ClaimName: name, ClaimUid: uid, Claim: garbage}},
		{"a claim in the request naming another claim", &provisionerv1.ProvisionRequest{ClaimNamespace: ns, ClaimName: name, ClaimUid: uid, Claim: mustEncode(t, other)}},
		{"a claim in the request of another UID", &provisionerv1.ProvisionRequest{ClaimNamespace: ns, ClaimName: name, ClaimUid: uid, Claim: mustEncode(t, otherUID)}},
		{"storage_class bytes that are not a StorageClass", &provisionerv1.ProvisionRequest{ClaimNamespace: ns, ClaimName: name, StorageClass: garbage}},
	} {
		resp, err := t.provisioner().Provision(t.ctx, tc.req)
		if expectCode(t, "Provision with "+tc.what, err, codes.InvalidArgument) || err != nil {
			continue
		}
		t.Errorf("Provision with %s answered %v", tc.what, resp)
	}
}

func checkProvisionNotFound(t *T) {
	ns := t.namespace()
	for _, tc := range []struct{ what, ns string }{
		{"a claim that does not exist", ns},
		{"a claim in a namespace that does not exist", t.s.name("absent")},
	} {
		_, err := t.provisioner().Provision(t.ctx, &provisionerv1.ProvisionRequest{ClaimNamespace: tc.ns, ClaimName: "absent"})
		expectCode(t, "Provision of "+tc.what, err, codes.NotFound)
	}
}

func checkProvisionPrecondition(t *T) {
	ns := t.namespace()
	d := t.driver()
	served := t.createClass(d.GetProvisionerName())
	unserved := t.createClass(handsOff)
	noClass := t.newClaim(ns, "no-class", "", "1Mi")
	otherVolume := t.newClaim(ns, "other-volume", served.Name, "1Mi")
	otherVolume.Spec.VolumeName = t.s.name("other-volume")
	for _, tc := range []struct {
		what  string
		claim *corev1.PersistentVolumeClaim
		uid   string // sent as claim_uid instead of the claim's
		want  []codes.Code
	}{
		{"a claim whose UID is not claim_uid (recreated)", t.newClaim(ns, "recreated", served.Name, "1Mi"), "9b4a1a8e-0000-4000-8000-000000000003", []codes.Code{codes.FailedPrecondition}},
		{"a claim that names no StorageClass", noClass, "", []codes.Code{codes.FailedPrecondition}},
		{"a claim that asks for another volume (spec.volumeName)", otherVolume, "", []codes.Code{codes.FailedPrecondition}},
		{"a claim of a class whose provisioner is not served", t.newClaim(ns, "unserved", unserved.Name, "1Mi"), "", []codes.Code{codes.FailedPrecondition}},
		{"a claim whose StorageClass does not exist", t.newClaim(ns, "no-such-class", t.s.name("absent"), "1Mi"), "", []codes.Code{codes.NotFound, codes.FailedPrecondition}},
	} {
		c := t.createClaim(tc.claim)
		uid := string(c.UID)
		if tc.uid != "" {
			uid = tc.uid
		}
		resp, err := t.provisioner().Provision(t.ctx, &provisionerv1.ProvisionRequest{ClaimNamespace: ns, ClaimName: c.Name, ClaimUid: uid})
		if expectCode(t, "Provision of "+tc.what, err, tc.want...) && err == nil {
			t.Errorf("Provision of %s answered %v", tc.what, resp)
		}
		if vs := t.volumesOfClaim(c.UID); len(vs) > 0 {
			t.Errorf("Provision of %s made PersistentVolumes %v", tc.what, vs)
		}
	}

	// A claim being deleted (held by a finalizer of the suite's) gets no
	// volume: NO_CHANGE, or FailedPrecondition.
	held := t.newClaim(ns, "being-deleted", served.Name, "1Mi")
	held.Finalizers = []string{holdFinalizer}
	c := t.createClaim(held)
	t.Cleanup(func(ctx context.Context) { release(ctx, t.kube(), ns, c.Name) })
	if err := t.kube().CoreV1().PersistentVolumeClaims(ns).Delete(t.ctx, c.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete claim %s: %v", c.Name, err)
	}
	if now, err := t.kube().CoreV1().PersistentVolumeClaims(ns).Get(t.ctx, c.Name, metav1.GetOptions{}); err != nil || now.DeletionTimestamp == nil {
		t.Logf("the claim held by a finalizer was deleted at once (%v): a claim being deleted is not checked", err)
		return
	}
	// A binder running against the implementation may have provisioned
	// the claim between its creation and its deletion: that volume is not
	// this call's doing. The call must make none.
	before := t.volumesOfClaim(c.UID)
	resp, err := t.provisioner().Provision(t.ctx, &provisionerv1.ProvisionRequest{ClaimNamespace: ns, ClaimName: c.Name, ClaimUid: string(c.UID)})
	switch {
	case err != nil:
		expectCode(t, "Provision of a claim being deleted", err, codes.FailedPrecondition)
	case resp.GetOutcome() != provisionerv1.Outcome_OUTCOME_NO_CHANGE:
		t.Errorf("Provision of a claim being deleted answered %s (%s), want NO_CHANGE or FailedPrecondition", resp.GetOutcome(), resp.GetMessage())
	}
	if vs := t.volumesOfClaim(c.UID); len(vs) > len(before) {
		t.Errorf("Provision of a claim being deleted made PersistentVolumes %v (before the call: %v)", vs, before)
	}
}

// holdFinalizer keeps a claim of the suite's in its deletion.
const holdFinalizer = "conformance.volplane.io/hold"

// release removes holdFinalizer from a claim.
func release(ctx context.Context, c kubernetes.Interface, ns, name string) {
	_ = retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		cl, err := c.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil
		}
		cl.Finalizers = slices.DeleteFunc(cl.Finalizers, func(f string) bool { return f == holdFinalizer })
		_, err = c.CoreV1().PersistentVolumeClaims(ns).Update(ctx, cl, metav1.UpdateOptions{})
		return err
	})
}

// provisioned is a volume the suite had provisioned for a claim.
type provisioned struct {
	claim  *corev1.PersistentVolumeClaim
	class  *storagev1.StorageClass
	driver *provisionerv1.Driver
	resp   *provisionerv1.ProvisionResponse
	volume *corev1.PersistentVolume // as the API server has it
}

// provisionClaim creates a class of the driver and a claim of it in ns,
// provisions its volume through pc and checks the answer; the volume is
// disposed of after the check.
func (t *T) provisionClaim(pc provisionerv1.ProvisionerServiceClient, ns, name string, d *provisionerv1.Driver) provisioned {
	class := t.createClass(d.GetProvisionerName())
	claim := t.createClaim(t.newClaim(ns, name, class.Name, "1Mi"))
	t.Cleanup(func(ctx context.Context) {
		if vs := volumesOf(ctx, t.kube(), claim.UID); len(vs) > 0 {
			for _, v := range vs {
				dispose(ctx, t.kube(), pc, ns, name, v)
			}
		}
	})
	req := &provisionerv1.ProvisionRequest{ClaimNamespace: ns, ClaimName: name, ClaimUid: string(claim.UID)}
	resp := t.provisionUntilFinished(pc, req)
	p := provisioned{claim: claim, class: class, driver: d, resp: resp}
	p.volume = t.checkProvisioned(p)
	return p
}

// provisionUntilFinished calls Provision until it is FINISHED, retrying
// IN_BACKGROUND and transient errors.
func (t *T) provisionUntilFinished(pc provisionerv1.ProvisionerServiceClient, req *provisionerv1.ProvisionRequest) *provisionerv1.ProvisionResponse {
	var out *provisionerv1.ProvisionResponse
	key := req.GetClaimNamespace() + "/" + req.GetClaimName()
	t.Eventually("Provision of "+key+" FINISHED", func() string {
		resp, err := pc.Provision(t.ctx, req)
		if err != nil {
			if transient(err) {
				return t.retry("Provision", err)
			}
			t.Fatalf("Provision of %s, a claim its driver can provision: %s", key, describe(err))
		}
		checkAnswer(t, "Provision of "+key, resp.GetOutcome(), resp.GetMessage())
		if resp.GetVolumeName() == "" {
			t.Errorf("Provision of %s answered %s without volume_name (it is known before the volume exists)", key, resp.GetOutcome())
		}
		switch resp.GetOutcome() {
		case provisionerv1.Outcome_OUTCOME_FINISHED:
			out = resp
			return ""
		case provisionerv1.Outcome_OUTCOME_IN_BACKGROUND:
			return "IN_BACKGROUND: " + resp.GetMessage()
		}
		t.Fatalf("Provision of %s, a claim its driver can provision, answered %s: %s", key, resp.GetOutcome(), resp.GetMessage())
		return ""
	})
	return out
}

// checkAnswer checks an outcome is set and says why when not FINISHED.
func checkAnswer(t *T, what string, o provisionerv1.Outcome, message string) {
	switch o {
	case provisionerv1.Outcome_OUTCOME_FINISHED:
	case provisionerv1.Outcome_OUTCOME_IN_BACKGROUND, provisionerv1.Outcome_OUTCOME_NO_CHANGE, provisionerv1.Outcome_OUTCOME_RESCHEDULE:
		if message == "" {
			t.Errorf("%s answered %s without a message saying why", what, o)
		}
	default:
		t.Errorf("%s answered outcome %v: every answer has an outcome", what, o)
	}
}

// checkProvisioned checks a FINISHED answer against the claim and class,
// and returns the volume as the API server has it.
func (t *T) checkProvisioned(p provisioned) *corev1.PersistentVolume {
	key := claimKey(p.claim)
	if len(p.resp.GetVolume()) == 0 {
		t.Fatalf("Provision of %s FINISHED without the PersistentVolume (volume)", key)
	}
	sent := &corev1.PersistentVolume{}
	if err := sent.Unmarshal(p.resp.GetVolume()); err != nil {
		t.Fatalf("Provision of %s: volume is not a PersistentVolume in Kubernetes protobuf: %v", key, err)
	}
	if sent.Name != p.resp.GetVolumeName() {
		t.Errorf("Provision of %s: volume_name %q, but the volume sent is %q", key, p.resp.GetVolumeName(), sent.Name)
	}
	v := t.getVolume(p.resp.GetVolumeName())
	if v == nil {
		t.Fatalf("Provision of %s FINISHED, but PersistentVolume %s does not exist", key, p.resp.GetVolumeName())
	}
	if sent.UID != v.UID {
		t.Errorf("Provision of %s: the volume sent has UID %q, the API server's %q", key, sent.UID, v.UID)
	}
	if r := v.Spec.ClaimRef; r == nil || r.Namespace != p.claim.Namespace || r.Name != p.claim.Name || r.UID != p.claim.UID {
		t.Errorf("PersistentVolume %s: claimRef %v, want %s with UID %s", v.Name, r, key, p.claim.UID)
	}
	if c := v.Spec.CSI; c == nil || c.Driver != p.driver.GetDriverName() || c.VolumeHandle == "" {
		t.Errorf("PersistentVolume %s: CSI source %v, want driver %q and a volume handle", v.Name, c, p.driver.GetDriverName())
	}
	if v.Spec.StorageClassName != p.class.Name {
		t.Errorf("PersistentVolume %s: storageClassName %q, want %q", v.Name, v.Spec.StorageClassName, p.class.Name)
	}
	if want := *p.class.ReclaimPolicy; v.Spec.PersistentVolumeReclaimPolicy != want {
		t.Errorf("PersistentVolume %s: reclaim policy %q, want the class's %q", v.Name, v.Spec.PersistentVolumeReclaimPolicy, want)
	}
	size, asked := v.Spec.Capacity[corev1.ResourceStorage], p.claim.Spec.Resources.Requests[corev1.ResourceStorage]
	if size.Cmp(asked) < 0 {
		t.Errorf("PersistentVolume %s: capacity %s, less than the %s asked for", v.Name, size.String(), asked.String())
	}
	if !slices.Contains(v.Spec.AccessModes, corev1.ReadWriteOnce) {
		t.Errorf("PersistentVolume %s: access modes %v, want the claim's ReadWriteOnce", v.Name, v.Spec.AccessModes)
	}
	if by := v.Annotations[annProvisionedBy]; by != p.class.Provisioner {
		t.Errorf("PersistentVolume %s: %s %q, want %q", v.Name, annProvisionedBy, by, p.class.Provisioner)
	}
	return v
}

func checkProvisionIdempotent(t *T) {
	ns := t.namespace()
	d := t.driver()
	pc := t.provisioner()
	p := t.provisionClaim(pc, ns, "idempotent", d)
	v := p.volume
	claim, err := t.kube().CoreV1().PersistentVolumeClaims(ns).Get(t.ctx, p.claim.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("read claim: %v", err)
	}
	for _, again := range []struct {
		what string
		req  *provisionerv1.ProvisionRequest
	}{
		{"the same request", &provisionerv1.ProvisionRequest{ClaimNamespace: ns, ClaimName: claim.Name, ClaimUid: string(claim.UID)}},
		{"the claim and class sent as hints", &provisionerv1.ProvisionRequest{ClaimNamespace: ns, ClaimName: claim.Name, ClaimUid: string(claim.UID),
			Claim: mustEncode(t, claim), StorageClass: mustEncode(t, p.class)}},
		{"no claim_uid", &provisionerv1.ProvisionRequest{ClaimNamespace: ns, ClaimName: claim.Name}},
	} {
		resp := t.provisionUntilFinished(pc, again.req)
		if resp.GetVolumeName() != p.resp.GetVolumeName() {
			t.Errorf("Provision again with %s: volume_name %q, first %q", again.what, resp.GetVolumeName(), p.resp.GetVolumeName())
			continue
		}
		sent := &corev1.PersistentVolume{}
		if err := sent.Unmarshal(resp.GetVolume()); err != nil {
			t.Errorf("Provision again with %s: volume: %v", again.what, err)
			continue
		}
		if sent.UID != v.UID || sent.Spec.CSI == nil || sent.Spec.CSI.VolumeHandle != v.Spec.CSI.VolumeHandle {
			t.Errorf("Provision again with %s answered volume UID %q handle %v, first UID %q handle %q: not the same volume",
				again.what, sent.UID, sent.Spec.CSI, v.UID, v.Spec.CSI.VolumeHandle)
		}
	}
	if vs := t.volumesOfClaim(claim.UID); len(vs) != 1 || vs[0] != v.Name {
		t.Errorf("PersistentVolumes with the claim's UID: %v, want only %s", vs, v.Name)
	}
	if exists, ok := t.backingExists(v.Spec.CSI.VolumeHandle); ok && !exists {
		t.Errorf("the driver does not list volume %q of PersistentVolume %s", v.Spec.CSI.VolumeHandle, v.Name)
	}
	t.noOperation(v.Name)
}

// backingExists asks the CSI driver (Config.CSIEndpoint) whether it lists
// a volume; ok is false when there is no endpoint or it cannot list.
func (t *T) backingExists(handle string) (exists, ok bool) {
	cc, err := t.s.csiController()
	if err != nil {
		t.Fatalf("dial the CSI driver: %v", err)
	}
	if cc == nil {
		return false, false
	}
	token := ""
	for {
		resp, err := cc.ListVolumes(t.ctx, &csi.ListVolumesRequest{StartingToken: token})
		if unimplemented(err) {
			t.Logf("the CSI driver cannot list volumes: backing volumes not checked")
			return false, false
		}
		if err != nil {
			t.Fatalf("CSI ListVolumes: %v", err)
		}
		for _, e := range resp.GetEntries() {
			if e.GetVolume().GetVolumeId() == handle {
				return true, true
			}
		}
		if token = resp.GetNextToken(); token == "" {
			return false, true
		}
	}
}

// noOperation waits until ListOperations holds nothing for volume.
func (t *T) noOperation(volume string) {
	t.Eventually("no operation in flight for "+volume, func() string {
		resp, err := t.provisioner().ListOperations(t.ctx, &provisionerv1.ListOperationsRequest{})
		if err != nil {
			return t.retry("ListOperations", err)
		}
		for _, op := range resp.GetOperations() {
			if op.GetVolumeName() == volume {
				return fmt.Sprintf("ListOperations holds %v", op)
			}
		}
		return ""
	})
}

func checkProvisionOutcomes(t *T) {
	ns := t.namespace()
	d := t.driver()
	pc := t.provisioner()
	class := t.createClass(d.GetProvisionerName())
	block := corev1.PersistentVolumeBlock
	c := t.newClaim(ns, "block", class.Name, "1Mi")
	c.Spec.VolumeMode = &block
	claim := t.createClaim(c)
	t.Cleanup(func(ctx context.Context) {
		for _, v := range volumesOf(ctx, t.kube(), claim.UID) {
			dispose(ctx, t.kube(), pc, ns, claim.Name, v)
		}
	})
	req := &provisionerv1.ProvisionRequest{ClaimNamespace: ns, ClaimName: claim.Name, ClaimUid: string(claim.UID)}
	var first *provisionerv1.ProvisionResponse
	t.Eventually("Provision of a Block claim FINISHED or NO_CHANGE", func() string {
		resp, err := pc.Provision(t.ctx, req)
		if err != nil {
			if transient(err) {
				return t.retry("Provision", err)
			}
			t.Fatalf("Provision of a Block claim: %s; a driver's answer is an outcome, not an error", describe(err))
		}
		checkAnswer(t, "Provision of a Block claim", resp.GetOutcome(), resp.GetMessage())
		if resp.GetOutcome() == provisionerv1.Outcome_OUTCOME_IN_BACKGROUND {
			return "IN_BACKGROUND: " + resp.GetMessage()
		}
		first = resp
		return ""
	})
	switch first.GetOutcome() {
	case provisionerv1.Outcome_OUTCOME_FINISHED:
		v := t.checkProvisioned(provisioned{claim: claim, class: class, driver: d, resp: first})
		if v.Spec.VolumeMode == nil || *v.Spec.VolumeMode != block {
			t.Errorf("PersistentVolume %s of a Block claim has volume mode %v", v.Name, v.Spec.VolumeMode)
		}
		t.Logf("the driver serves block volumes: NO_CHANGE not checked")
		return
	case provisionerv1.Outcome_OUTCOME_NO_CHANGE:
	default:
		t.Fatalf("Provision of a Block claim answered %s (%s), want FINISHED or NO_CHANGE", first.GetOutcome(), first.GetMessage())
	}
	if vs := t.volumesOfClaim(claim.UID); len(vs) > 0 {
		t.Errorf("Provision answered NO_CHANGE, yet PersistentVolumes %v name the claim", vs)
	}
	resp, err := pc.Provision(t.ctx, req)
	switch {
	case err != nil:
		t.Errorf("Provision of the Block claim again: %s", describe(err))
	case resp.GetOutcome() != provisionerv1.Outcome_OUTCOME_NO_CHANGE && resp.GetOutcome() != provisionerv1.Outcome_OUTCOME_IN_BACKGROUND:
		t.Errorf("Provision of the Block claim again answered %s (%s), first NO_CHANGE", resp.GetOutcome(), resp.GetMessage())
	}
	t.noOperation(first.GetVolumeName())
}

func checkListOperations(t *T) {
	resp, err := t.provisioner().ListOperations(t.ctx, &provisionerv1.ListOperationsRequest{})
	if err != nil {
		t.Fatalf("ListOperations: %s", describe(err))
	}
	for _, op := range resp.GetOperations() {
		if (op.GetKind() != "provision" && op.GetKind() != "delete") || op.GetVolumeName() == "" {
			t.Errorf("operation %v: kind must be provision or delete, and volume_name set", op)
		}
	}
}

func checkOptionalRPCs(t *T) {
	pc := t.provisioner()
	unknown := "unknown.conformance.volplane.io"
	var implemented int
	optional := func(what string, err error, want ...codes.Code) {
		if unimplemented(err) {
			t.Logf("%s: Unimplemented (optional)", what)
			return
		}
		implemented++
		expectCode(t, what, err, want...)
	}
	_, err := pc.GetCapacity(t.ctx, &provisionerv1.GetCapacityRequest{})
	optional("GetCapacity without a driver name", err, codes.InvalidArgument)
	_, err = pc.GetCapacity(t.ctx, &provisionerv1.GetCapacityRequest{Name: unknown})
	optional("GetCapacity of a driver not served", err, codes.NotFound)
	_, err = pc.ListOrphans(t.ctx, &provisionerv1.ListOrphansRequest{DriverName: unknown})
	optional("ListOrphans of a driver not served", err, codes.NotFound)
	_, err = pc.DeleteOrphan(t.ctx, &provisionerv1.DeleteOrphanRequest{})
	optional("DeleteOrphan without a driver and volume", err, codes.InvalidArgument)
	_, err = pc.DeleteOrphan(t.ctx, &provisionerv1.DeleteOrphanRequest{DriverName: unknown, VolumeId: "conformance-absent"})
	optional("DeleteOrphan of a driver not served", err, codes.NotFound)
	if implemented == 0 {
		t.Skipf("GetCapacity, ListOrphans and DeleteOrphan are Unimplemented")
	}
}
