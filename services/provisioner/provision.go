package provisioner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"

	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/pkg/faultpoint"
	"github.com/volplane/volplane/pkg/kube"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// journal is what the provisioner needs of etcd: operation records fenced
// on per-operation locks (pkg/coord).
type journal interface {
	Acquire(ctx context.Context, kind, name, holder string) error
	AcquireGet(ctx context.Context, kind, name, holder string) (coord.Record, bool, error)
	Unlock(ctx context.Context, kind, name, holder string) error
	Put(ctx context.Context, kind, name, holder string, value []byte) error
	Finish(ctx context.Context, kind, name, holder string) error
	List(ctx context.Context, kind string) ([]coord.Record, error)
	Get(ctx context.Context, kind, name string) (coord.Record, bool, error)
}

var _ journal = (*coord.Coordinator)(nil)

// Journal kinds.
const (
	kindProvision = "provision"
	kindDelete    = "delete"
)

// provisionOp is the journal record of a provisioning: written before
// CreateVolume is first called and removed once the PV exists, or once the
// volume is known not to exist (a final error, or undone after the claim
// went away). Its request is reused on every retry, so the driver always
// sees the same name and parameters.
type provisionOp struct {
	ClaimNamespace string     `json:"claimNamespace"`
	ClaimName      string     `json:"claimName"`
	ClaimUID       string     `json:"claimUID"`
	Class          string     `json:"class"`
	Provisioner    string     `json:"provisioner"`
	Request        []byte     `json:"request"` // csi.CreateVolumeRequest without secrets
	Secret         *secretRef `json:"secret,omitempty"`
	Attempts       int32      `json:"attempts"`
	LastError      string     `json:"lastError,omitempty"`
	Start          time.Time  `json:"start"`
	// LastCode and LastMessage are the gRPC code and message of the last
	// error (the driver's, or Unknown for one before the call), and
	// LastAttempt when that attempt ended, for ListOperations and explain.
	LastCode    string    `json:"lastCode,omitempty"`
	LastMessage string    `json:"lastMessage,omitempty"`
	LastAttempt time.Time `json:"lastAttempt,omitzero"`
}

// failed records the error an attempt ended with.
func (op *provisionOp) failed(err error, now time.Time) {
	st := status.Convert(err)
	op.LastError, op.LastCode, op.LastMessage, op.LastAttempt = err.Error(), st.Code().String(), st.Message(), now
}

// deleteOp is the journal record of a DeleteVolume in flight.
type deleteOp struct {
	Driver       string     `json:"driver"`
	VolumeHandle string     `json:"volumeHandle"`
	Secret       *secretRef `json:"secret,omitempty"`
	Attempts     int32      `json:"attempts"`
	LastError    string     `json:"lastError,omitempty"`
	Start        time.Time  `json:"start"`
}

// provisioner does the work behind the gRPC API.
type provisioner struct {
	log           *slog.Logger
	member        string
	client        kubernetes.Interface
	journal       journal
	drivers       *registry
	nodes         nodes
	sources       sources
	events        func(provisionerName string) record.EventRecorder
	prefix        string
	defaultFSType string
	// strictTopology: see Options.StrictTopology.
	strictTopology bool
	extraMetadata  bool
	timeout        time.Duration
	now            func() time.Time
	// instance makes the identity (see identity) of this replica's run.
	instance string

	mu       sync.Mutex
	inflight map[string]bool // kind/name of operations running in this replica
}

// identity is what external-provisioner calls its identity, recorded in
// every PV it makes: "<start in ms>-<random 0-9999>-<driver name>".
func (p *provisioner) identity(driver string) string {
	return p.instance + "-" + driver
}

// newInstance is the start-time and random part of an identity.
func newInstance(now time.Time) string {
	return fmt.Sprintf("%d-%d", now.UnixMilli(), rand.IntN(10000))
}

// result is how one provisioning attempt ended.
type result struct {
	outcome provisionerv1.Outcome
	volume  *corev1.PersistentVolume // FINISHED only
	message string
}

func (p *provisioner) begin(kind, name string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := kind + "/" + name
	if p.inflight[k] {
		return false
	}
	p.inflight[k] = true
	return true
}

func (p *provisioner) running(kind, name string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inflight[kind+"/"+name]
}

func (p *provisioner) end(kind, name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.inflight, kind+"/"+name)
}

// errNotServed says the class's provisioner or the volume's driver is not
// one of this provisioner's drivers.
var errNotServed = errors.New("not served by this provisioner")

// provision makes one attempt at the volume of claim: CreateVolume with the
// journaled request, then the PV. It is safe to call again at any time;
// every attempt uses the same volume name. With journaledOnly (recovery),
// it acts only if the operation is still journaled once its lock is held:
// an attempt that finished meanwhile is not started again.
func (p *provisioner) provision(ctx context.Context, claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass, journaledOnly bool) (result, error) {
	d := p.drivers.byProvisioner(class.Provisioner)
	if d == nil {
		return result{}, fmt.Errorf("provisioner %q of StorageClass %q is %w", class.Provisioner, class.Name, errNotServed)
	}
	if !d.ready() {
		return result{outcome: provisionerv1.Outcome_OUTCOME_IN_BACKGROUND, message: fmt.Sprintf("CSI driver %q is not ready: %s", class.Provisioner, d.current().info.GetMessage())}, nil
	}
	name := VolumeName(p.prefix, claim)
	if claim.DeletionTimestamp != nil {
		return result{outcome: provisionerv1.Outcome_OUTCOME_NO_CHANGE, message: "the claim is being deleted"}, nil
	}
	if !p.begin(kindProvision, name) {
		return result{outcome: provisionerv1.Outcome_OUTCOME_IN_BACKGROUND, message: "an attempt to provision " + name + " is running"}, nil
	}
	defer p.end(kindProvision, name)
	rec, found, err := p.journal.AcquireGet(ctx, kindProvision, name, p.member)
	if errors.Is(err, coord.ErrReserved) {
		return result{outcome: provisionerv1.Outcome_OUTCOME_IN_BACKGROUND, message: fmt.Sprintf("%s is being provisioned by another replica (%v)", name, err)}, nil
	}
	if err != nil {
		return result{}, err
	}
	if journaledOnly && !found {
		if err := p.journal.Unlock(ctx, kindProvision, name, p.member); err != nil {
			p.log.Warn("unlock provisioning", "volume", name, "error", err)
		}
		return result{outcome: provisionerv1.Outcome_OUTCOME_NO_CHANGE, message: "finished meanwhile"}, nil
	}
	var op provisionOp
	spec := p.spec(claim, class)
	var req *csi.CreateVolumeRequest
	if found {
		if err := json.Unmarshal(rec.Value, &op); err != nil {
			return result{}, fmt.Errorf("journal record of %s: %w", name, err)
		}
		req = &csi.CreateVolumeRequest{}
		if err := proto.Unmarshal(op.Request, req); err != nil {
			return result{}, fmt.Errorf("journal record of %s: request: %w", name, err)
		}
	}
	// The secrets the PV will name, and (first attempt) the request.
	spec.secrets, err = p.secretRefs(class, claim, name)
	if err == nil && !found {
		req, err = p.createRequest(ctx, d, claim, class, spec)
		op = provisionOp{ClaimNamespace: claim.Namespace, ClaimName: claim.Name, ClaimUID: string(claim.UID),
			Class: class.Name, Provisioner: class.Provisioner, Secret: spec.secrets["provisioner"], Start: p.now()}
		if err == nil {
			op.Request, err = proto.Marshal(req)
		}
	}
	if err != nil {
		// Nothing was asked of the driver in this attempt.
		res := p.failBeforeCall(ctx, claim, class, name, found, op, err)
		if apierrors.IsNotFound(err) && claim.Annotations[kube.AnnSelectedNode] != "" {
			// As external-provisioner: the selected node (or its
			// CSINode) is gone, so let the scheduler choose another.
			res.outcome = provisionerv1.Outcome_OUTCOME_RESCHEDULE
		}
		return res, nil
	}
	spec.driver = d.name()
	spec.identity = p.identity(d.name())

	op.Attempts++
	if err := p.put(ctx, kindProvision, name, op); err != nil {
		return result{}, err
	}
	recorder := p.events(class.Provisioner)
	recorder.Eventf(claim, corev1.EventTypeNormal, kube.EventProvisioning, "External provisioner is provisioning volume for claim %q", claim.Namespace+"/"+claim.Name)

	secrets, err := p.secrets(ctx, op.Secret)
	if err != nil {
		return p.failBeforeCall(ctx, claim, class, name, true, op, err), nil
	}
	// The claim may have gone since it was read (or cached): ask the API
	// server, right before the driver makes anything.
	if why, err := p.recheck(ctx, claim, name); err != nil || why != "" {
		if err != nil {
			return p.failBeforeCall(ctx, claim, class, name, true, op, err), nil
		}
		return p.abandon(ctx, d, name, op, found, why)
	}
	call := proto.Clone(req).(*csi.CreateVolumeRequest)
	call.Secrets = secrets
	cctx, cancel := context.WithTimeout(ctx, p.timeout)
	resp, err := d.controller.CreateVolume(cctx, call)
	cancel()
	switch out := classify(err, claim.Annotations[kube.AnnSelectedNode] != ""); out {
	case provisionerv1.Outcome_OUTCOME_FINISHED:
	case provisionerv1.Outcome_OUTCOME_IN_BACKGROUND:
		op.failed(err, p.now())
		if perr := p.put(ctx, kindProvision, name, op); perr != nil {
			p.log.Warn("journal provisioning attempt", "volume", name, "error", perr)
		}
		msg := failedMessage(err)
		recorder.Event(claim, corev1.EventTypeWarning, kube.EventProvisioningFailed, msg)
		return result{outcome: out, message: msg}, nil
	default:
		// The driver made nothing: the operation is over.
		if ferr := p.journal.Finish(ctx, kindProvision, name, p.member); ferr != nil {
			return result{}, ferr
		}
		msg := failedMessage(err)
		recorder.Event(claim, corev1.EventTypeWarning, kube.EventProvisioningFailed, msg)
		return result{outcome: out, message: msg}, nil
	}

	faultpoint.Hit(faultpoint.ProvisionerAfterCreateVolume)

	// Again right before the PV: a claim deleted while the driver worked
	// gets no PV; its new volume is deleted here.
	why, err := p.recheck(ctx, claim, name)
	if err == nil && why != "" {
		return p.discard(ctx, d, name, op, resp.GetVolume().GetVolumeId(), why)
	}
	var pv *corev1.PersistentVolume
	if err == nil {
		pv, err = p.saveVolume(ctx, buildVolume(spec, resp.GetVolume()), claim)
	}
	if err != nil {
		op.failed(fmt.Errorf("the volume was created but its PersistentVolume could not be saved: %w", err), p.now())
		if perr := p.put(ctx, kindProvision, name, op); perr != nil {
			p.log.Warn("journal provisioning attempt", "volume", name, "error", perr)
		}
		recorder.Event(claim, corev1.EventTypeWarning, kube.EventProvisioningFailed, op.LastError)
		return result{outcome: provisionerv1.Outcome_OUTCOME_IN_BACKGROUND, message: op.LastError}, nil
	}
	faultpoint.Hit(faultpoint.ProvisionerAfterSaveVolume)
	if err := p.journal.Finish(ctx, kindProvision, name, p.member); err != nil {
		// The PV exists: whoever recovers the record sees it and finishes.
		p.log.Warn("finish journal record", "volume", name, "error", err)
	}
	recorder.Eventf(claim, corev1.EventTypeNormal, kube.EventProvisioningSucceeded, "Successfully provisioned volume %s", name)
	p.log.Info("provisioned", "claim", claim.Namespace+"/"+claim.Name, "volume", name, "handle", resp.GetVolume().GetVolumeId(), "attempts", op.Attempts)
	return result{outcome: provisionerv1.Outcome_OUTCOME_FINISHED, volume: pv}, nil
}

// failedMessage is the ProvisioningFailed event's message for a failed
// CreateVolume, as external-provisioner's controller words it: the error
// itself, and for InvalidArgument (infeasible, retried slowly) its note.
func failedMessage(err error) string {
	if status.Code(err) == codes.InvalidArgument {
		return "Volume provisioning failed with infeasible error. Retries will be delayed. " + err.Error()
	}
	return err.Error()
}

// failBeforeCall ends an attempt that failed before the driver was asked.
// A journal record of an earlier attempt stays (that attempt may still be
// making the volume); with no earlier attempt there is nothing to keep.
func (p *provisioner) failBeforeCall(ctx context.Context, claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass, name string, journaled bool, op provisionOp, cause error) result {
	msg := cause.Error()
	if journaled {
		op.failed(cause, p.now())
		if err := p.put(ctx, kindProvision, name, op); err != nil {
			p.log.Warn("journal provisioning attempt", "volume", name, "error", err)
		}
	} else if err := p.journal.Unlock(ctx, kindProvision, name, p.member); err != nil {
		p.log.Warn("unlock provisioning", "volume", name, "error", err)
	}
	p.events(class.Provisioner).Event(claim, corev1.EventTypeWarning, kube.EventProvisioningFailed, msg)
	return result{outcome: provisionerv1.Outcome_OUTCOME_NO_CHANGE, message: msg}
}

// createRequest builds the CreateVolume request of a first attempt.
func (p *provisioner) createRequest(ctx context.Context, d *driver, claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass, spec volumeSpec) (*csi.CreateVolumeRequest, error) {
	if err := checkClassParameters(class); err != nil {
		return nil, err
	}
	capRange, err := capacityRange(claim)
	if err != nil {
		return nil, err
	}
	caps, err := volumeCapabilities(claim, spec.fsType, class.MountOptions, d.has(csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER))
	if err != nil {
		return nil, err
	}
	req := &csi.CreateVolumeRequest{
		Name:               spec.name,
		CapacityRange:      capRange,
		VolumeCapabilities: caps,
		Parameters:         driverParameters(class, claim, spec.name, p.extraMetadata),
	}
	if d.current().topology {
		req.AccessibilityRequirements, err = accessibilityRequirements(p.nodes, d.name(), class, claim.Annotations[kube.AnnSelectedNode], claim.Name, p.strictTopology)
		if err != nil {
			return nil, err
		}
	}
	req.VolumeContentSource, err = p.sources.contentSource(ctx, claim, d)
	if err != nil {
		return nil, err
	}
	return req, nil
}

// secretRefs resolves every secret the class names (provisioner secrets
// and those the PV refers to).
func (p *provisioner) secretRefs(class *storagev1.StorageClass, claim *corev1.PersistentVolumeClaim, pvName string) (map[string]*secretRef, error) {
	out := map[string]*secretRef{}
	for _, s := range secretParams {
		r, err := resolveSecretRef(class, s.name, s.namespace, pvName, claim)
		if err != nil {
			return nil, err
		}
		if r == nil && s.kind == "provisioner" {
			// The older spelling.
			r, err = resolveSecretRef(class, csiParameterPrefix+"provisioner-secret-name", csiParameterPrefix+"provisioner-secret-namespace", pvName, claim)
			if err != nil {
				return nil, err
			}
		}
		if r != nil {
			out[s.kind] = r
		}
	}
	return out, nil
}

// secrets reads a Secret's data for a CSI call; nil ref means none.
func (p *provisioner) secrets(ctx context.Context, ref *secretRef) (map[string]string, error) {
	if ref == nil {
		return nil, nil
	}
	s, err := p.client.CoreV1().Secrets(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("read secret %s/%s: %w", ref.Namespace, ref.Name, err)
	}
	out := make(map[string]string, len(s.Data))
	for k, v := range s.Data {
		out[k] = string(v)
	}
	return out, nil
}

// saveVolume creates the PV; one that exists already for this claim (an
// earlier attempt got this far) is fine.
func (p *provisioner) saveVolume(ctx context.Context, pv *corev1.PersistentVolume, claim *corev1.PersistentVolumeClaim) (*corev1.PersistentVolume, error) {
	created, err := p.client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
	if err == nil {
		return created, nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	old, gerr := p.client.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
	if gerr != nil {
		return nil, gerr
	}
	if old.Spec.ClaimRef == nil || old.Spec.ClaimRef.UID != claim.UID {
		return nil, fmt.Errorf("PersistentVolume %s exists and is not this claim's: %w", pv.Name, err)
	}
	return old, nil
}

func (p *provisioner) put(ctx context.Context, kind, name string, op any) error {
	b, err := json.Marshal(op)
	if err != nil {
		return err
	}
	return p.journal.Put(ctx, kind, name, p.member, b)
}

// deleteVolume deletes a PV's backing volume through its driver. NotFound
// from the driver means it is gone already.
func (p *provisioner) deleteVolume(ctx context.Context, pv *corev1.PersistentVolume) (result, error) {
	if pv.Spec.CSI == nil {
		return result{}, fmt.Errorf("volume %q is not a CSI volume, so it is %w", pv.Name, errNotServed)
	}
	d := p.drivers.byDriver(pv.Spec.CSI.Driver)
	if d == nil {
		return result{}, fmt.Errorf("CSI driver %q of volume %q is %w", pv.Spec.CSI.Driver, pv.Name, errNotServed)
	}
	if !d.ready() {
		return result{outcome: provisionerv1.Outcome_OUTCOME_IN_BACKGROUND, message: fmt.Sprintf("CSI driver %q is not ready: %s", d.name(), d.current().info.GetMessage())}, nil
	}
	if !p.begin(kindDelete, pv.Name) {
		return result{outcome: provisionerv1.Outcome_OUTCOME_IN_BACKGROUND, message: "an attempt to delete " + pv.Name + " is running"}, nil
	}
	defer p.end(kindDelete, pv.Name)
	rec, ok, err := p.journal.AcquireGet(ctx, kindDelete, pv.Name, p.member)
	if errors.Is(err, coord.ErrReserved) {
		return result{outcome: provisionerv1.Outcome_OUTCOME_IN_BACKGROUND, message: fmt.Sprintf("%s is being deleted by another replica (%v)", pv.Name, err)}, nil
	}
	if err != nil {
		return result{}, err
	}
	op := deleteOp{Driver: d.name(), VolumeHandle: pv.Spec.CSI.VolumeHandle, Start: p.now()}
	if ok {
		_ = json.Unmarshal(rec.Value, &op)
	}
	op.Secret = p.deletionSecret(ctx, pv)
	op.Attempts++
	if err := p.put(ctx, kindDelete, pv.Name, op); err != nil {
		return result{}, err
	}
	return p.runDelete(ctx, d, pv.Name, op), nil
}

// runDelete calls DeleteVolume for a journaled deletion and ends or keeps
// its record.
func (p *provisioner) runDelete(ctx context.Context, d *driver, name string, op deleteOp) result {
	secrets, err := p.secrets(ctx, op.Secret)
	if err != nil {
		// As external-provisioner: the secret may be gone with its
		// namespace; delete without it and say so.
		p.log.Warn("cannot read the deletion secret; deleting the volume without secrets", "volume", name, "error", err)
		secrets = nil
	}
	cctx, cancel := context.WithTimeout(ctx, p.timeout)
	_, err = d.controller.DeleteVolume(cctx, &csi.DeleteVolumeRequest{VolumeId: op.VolumeHandle, Secrets: secrets})
	cancel()
	if status.Code(err) == codes.NotFound {
		err = nil
	}
	out := classify(err, false)
	if out == provisionerv1.Outcome_OUTCOME_IN_BACKGROUND {
		op.LastError = err.Error()
		if perr := p.put(ctx, kindDelete, name, op); perr != nil {
			p.log.Warn("journal deletion attempt", "volume", name, "error", perr)
		}
		return result{outcome: out, message: fmt.Sprintf("DeleteVolume %s: %v", op.VolumeHandle, err)}
	}
	if ferr := p.journal.Finish(ctx, kindDelete, name, p.member); ferr != nil {
		p.log.Warn("finish journal record", "volume", name, "error", ferr)
	}
	if err != nil {
		return result{outcome: provisionerv1.Outcome_OUTCOME_NO_CHANGE, message: fmt.Sprintf("DeleteVolume %s: %v", op.VolumeHandle, err)}
	}
	p.log.Info("deleted backing volume", "volume", name, "handle", op.VolumeHandle, "driver", d.name())
	return result{outcome: provisionerv1.Outcome_OUTCOME_FINISHED}
}

// deletionSecret is the secret DeleteVolume needs, as external-provisioner
// finds it (handleSecretsForDeletion): the one the PV's two deletion-secret
// annotations name, none when they are empty, and only when the PV has no
// such annotations (made before they existed) the one its class names now.
func (p *provisioner) deletionSecret(ctx context.Context, pv *corev1.PersistentVolume) *secretRef {
	n, hasName := pv.Annotations[annDeletionSecretName]
	ns, hasNamespace := pv.Annotations[annDeletionSecretNamespace]
	if hasName && hasNamespace {
		if n != "" && ns != "" {
			return &secretRef{Namespace: ns, Name: n}
		}
		return nil
	}
	if pv.Spec.StorageClassName == "" {
		return nil
	}
	class, err := p.client.StorageV1().StorageClasses().Get(ctx, pv.Spec.StorageClassName, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	var claim *corev1.PersistentVolumeClaim
	if ref := pv.Spec.ClaimRef; ref != nil {
		claim = &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ref.Namespace, Name: ref.Name}}
	}
	refs, err := p.secretRefs(class, claim, pv.Name)
	if err != nil {
		return nil
	}
	return refs["provisioner"]
}

// recoverAll goes through the journal once: operations of this replica
// that are not running, and operations whose replica is gone, are
// finished or undone.
func (p *provisioner) recoverAll(ctx context.Context) {
	recs, err := p.journal.List(ctx, kindProvision)
	if err != nil {
		p.log.Warn("list provisioning journal", "error", err)
	}
	for _, r := range recs {
		if ctx.Err() != nil {
			return
		}
		if (r.Holder != "" && r.Holder != p.member) || p.running(kindProvision, r.Name) {
			continue
		}
		if err := p.recoverProvision(ctx, r); err != nil {
			p.log.Warn("recover provisioning", "volume", r.Name, "error", err)
		}
	}
	recs, err = p.journal.List(ctx, kindDelete)
	if err != nil {
		p.log.Warn("list deletion journal", "error", err)
	}
	for _, r := range recs {
		if ctx.Err() != nil {
			return
		}
		if r.Holder != "" && r.Holder != p.member {
			continue
		}
		if err := p.recoverDelete(ctx, r); err != nil {
			p.log.Warn("recover deletion", "volume", r.Name, "error", err)
		}
	}
}

// recoverProvision finishes a journaled provisioning whose claim still
// wants it, and undoes one whose claim is gone, is being deleted or got
// another volume: the volume is created again with the same request (which
// returns the volume if it exists, or makes it) and then deleted, so that
// nothing is leaked whatever the driver did in the background.
func (p *provisioner) recoverProvision(ctx context.Context, r coord.Record) error {
	var op provisionOp
	if err := json.Unmarshal(r.Value, &op); err != nil {
		return fmt.Errorf("journal record: %w", err)
	}
	d := p.drivers.byProvisioner(op.Provisioner)
	if d == nil {
		return nil // another provisioner's operation
	}
	claim, err := p.client.CoreV1().PersistentVolumeClaims(op.ClaimNamespace).Get(ctx, op.ClaimName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		claim = nil
	case err != nil:
		return err
	}
	why := unwanted(claim, types.UID(op.ClaimUID), r.Name)
	if why == "" {
		class, err := p.client.StorageV1().StorageClasses().Get(ctx, op.Class, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("class %q of claim %s/%s: %w", op.Class, op.ClaimNamespace, op.ClaimName, err)
		}
		res, err := p.provision(ctx, claim, class, true)
		if err != nil {
			return err
		}
		p.log.Info("recovered provisioning", "volume", r.Name, "claim", op.ClaimNamespace+"/"+op.ClaimName, "outcome", res.outcome, "message", res.message)
		return nil
	}

	if !p.begin(kindProvision, r.Name) {
		return nil
	}
	defer p.end(kindProvision, r.Name)
	if err := p.journal.Acquire(ctx, kindProvision, r.Name, p.member); err != nil {
		if errors.Is(err, coord.ErrReserved) {
			return nil
		}
		return err
	}
	if _, err := p.client.CoreV1().PersistentVolumes().Get(ctx, r.Name, metav1.GetOptions{}); err == nil {
		// The PV was saved: the volume is the reclaimer's now.
		return p.journal.Finish(ctx, kindProvision, r.Name, p.member)
	} else if !apierrors.IsNotFound(err) {
		return err
	}
	if !d.ready() {
		// Let a replica whose driver is ready take it.
		if err := p.journal.Unlock(ctx, kindProvision, r.Name, p.member); err != nil {
			p.log.Warn("unlock provisioning", "volume", r.Name, "error", err)
		}
		return fmt.Errorf("CSI driver %q is not ready to undo provisioning %s", op.Provisioner, r.Name)
	}
	return p.undo(ctx, d, r.Name, op, why)
}

// recoverDelete finishes a journaled deletion whose replica is gone. While
// the PV exists the reclaimer asks again; only a deletion whose PV is
// already gone needs finishing here.
func (p *provisioner) recoverDelete(ctx context.Context, r coord.Record) error {
	var op deleteOp
	if err := json.Unmarshal(r.Value, &op); err != nil {
		return fmt.Errorf("journal record: %w", err)
	}
	d := p.drivers.byDriver(op.Driver)
	if d == nil {
		return nil // another provisioner's operation
	}
	if !p.begin(kindDelete, r.Name) {
		return nil // running here now
	}
	defer p.end(kindDelete, r.Name)
	if _, err := p.client.CoreV1().PersistentVolumes().Get(ctx, r.Name, metav1.GetOptions{}); err == nil {
		// The reclaimer asks again through the PV, of whichever replica.
		if r.Holder == p.member {
			return p.journal.Unlock(ctx, kindDelete, r.Name, p.member)
		}
		return nil
	} else if !apierrors.IsNotFound(err) {
		return err
	}
	if !d.ready() {
		return fmt.Errorf("CSI driver %q is not ready to finish deleting %s", op.Driver, r.Name)
	}
	if err := p.journal.Acquire(ctx, kindDelete, r.Name, p.member); err != nil {
		if errors.Is(err, coord.ErrReserved) {
			return nil
		}
		return err
	}
	op.Attempts++
	res := p.runDelete(ctx, d, r.Name, op)
	p.log.Info("recovered deletion", "volume", r.Name, "outcome", res.outcome, "message", res.message)
	return nil
}

// operations lists the journal for ListOperations.
func (p *provisioner) operations(ctx context.Context, kind string) ([]*provisionerv1.Operation, error) {
	var out []*provisionerv1.Operation
	if kind == "" || kind == kindProvision {
		recs, err := p.journal.List(ctx, kindProvision)
		if err != nil {
			return nil, err
		}
		for _, r := range recs {
			if o := provisionOperation(r); o != nil {
				out = append(out, o)
			}
		}
	}
	if kind == "" || kind == kindDelete {
		recs, err := p.journal.List(ctx, kindDelete)
		if err != nil {
			return nil, err
		}
		for _, r := range recs {
			var op deleteOp
			if err := json.Unmarshal(r.Value, &op); err != nil {
				continue
			}
			out = append(out, &provisionerv1.Operation{Kind: kindDelete, VolumeName: r.Name, Attempts: op.Attempts,
				LastError: op.LastError, StartTime: timestamp(op.Start), Owner: r.Holder, Provisioner: op.Driver})
		}
	}
	return out, nil
}

// claimOperation is the provisioning of the claim with uid in the journal,
// nil when there is none: one read, its volume's name derives from the UID.
func (p *provisioner) claimOperation(ctx context.Context, uid string) (*provisionerv1.Operation, error) {
	name := VolumeName(p.prefix, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid)}})
	r, ok, err := p.journal.Get(ctx, kindProvision, name)
	if err != nil || !ok {
		return nil, err
	}
	o := provisionOperation(r)
	if o == nil || o.ClaimUid != uid {
		return nil, nil
	}
	return o, nil
}

// provisionOperation is a provisioning record as ListOperations shows it,
// nil when it does not decode.
func provisionOperation(r coord.Record) *provisionerv1.Operation {
	var op provisionOp
	if err := json.Unmarshal(r.Value, &op); err != nil {
		return nil
	}
	return &provisionerv1.Operation{Kind: kindProvision, VolumeName: r.Name, ClaimNamespace: op.ClaimNamespace,
		ClaimName: op.ClaimName, ClaimUid: op.ClaimUID, Attempts: op.Attempts, LastError: op.LastError,
		StartTime: timestamp(op.Start), Owner: r.Holder, Provisioner: op.Provisioner,
		LastErrorCode: op.LastCode, LastErrorMessage: op.LastMessage, LastAttemptTime: timestamp(op.LastAttempt)}
}
