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
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"

	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/pkg/faultpoint"
	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/logging"
	"github.com/volplane/volplane/pkg/timeline"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// provisioner does the work behind the gRPC API.
type provisioner struct {
	log     *slog.Logger
	member  string
	client  kubernetes.Interface
	journal journal
	// session says whether this replica has a live etcd session; nil
	// means it always has (tests).
	session       func() bool
	drivers       *registry
	nodes         nodes
	sources       sources
	events        func(provisionerName string) record.EventRecorder
	prefix        string
	defaultFSType string
	// strictTopology: see Options.StrictTopology.
	strictTopology bool
	extraMetadata  bool
	// flags are the other external-provisioner flags (flags.go).
	flags   upstreamFlags
	timeout time.Duration
	now     func() time.Time
	// instance makes the identity (see identity) of this replica's run.
	instance string
	// timeline records the steps taken for each claim; nil records
	// nothing.
	timeline *timeline.Store

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
	// infeasible: the driver refused the request as it stands
	// (InvalidArgument); external-provisioner delays the next attempt.
	infeasible bool
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
// every attempt uses the same volume name. A recovery passes journaled,
// the name its journal record holds: the operation keeps the name it
// began with even when the naming flags changed since (a restart with
// another --volume-name-prefix or --volume-name-uuid-length), and it acts
// only if the operation is still journaled once its lock is held: an
// attempt that finished meanwhile is not started again.
func (p *provisioner) provision(ctx context.Context, claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass, journaled string) (result, error) {
	d := p.drivers.byProvisioner(class.Provisioner)
	if d == nil {
		return result{}, fmt.Errorf("provisioner %q of StorageClass %q is %w", class.Provisioner, class.Name, errNotServed)
	}
	if !d.ready() {
		msg := fmt.Sprintf("CSI driver %q is not ready: %s", class.Provisioner, d.current().info.GetMessage())
		p.sidecarNotReady(claim, class, d, msg)
		return result{outcome: provisionerv1.Outcome_OUTCOME_IN_BACKGROUND, message: msg}, nil
	}
	name := journaled
	if name == "" {
		name = p.namingFor(d).name(claim)
	}
	if claim.DeletionTimestamp != nil {
		return result{outcome: provisionerv1.Outcome_OUTCOME_NO_CHANGE, message: "the claim is being deleted"}, nil
	}
	if kind, ok := p.sources.populatorKind(claim); ok {
		return p.leaveToPopulator(claim, class, kind), nil
	}
	if !p.begin(kindProvision, name) {
		return result{outcome: provisionerv1.Outcome_OUTCOME_IN_BACKGROUND, message: "an attempt to provision " + name + " is running"}, nil
	}
	defer p.end(kindProvision, name)
	a := &attempt{claim: claim, class: class, d: d, name: name}
	if res, done, err := p.lock(ctx, a, journaled != ""); done {
		return res, err
	}
	if err := p.prepare(ctx, a); err != nil {
		// Nothing was asked of the driver in this attempt. Upstream's
		// library has said Provisioning before its Provision fails so.
		p.events(class.Provisioner).Eventf(claim, corev1.EventTypeNormal, kube.EventProvisioning, "External provisioner is provisioning volume for claim %q", claim.Namespace+"/"+claim.Name)
		res := p.failBeforeCall(ctx, claim, class, name, a.found, a.op, err)
		if apierrors.IsNotFound(err) && claim.Annotations[kube.AnnSelectedNode] != "" {
			// As external-provisioner: the selected node (or its
			// CSINode) is gone, so let the scheduler choose another.
			res.outcome = provisionerv1.Outcome_OUTCOME_RESCHEDULE
		}
		return res, nil
	}
	a.spec.driver = d.name()
	a.spec.identity = p.identity(d.name())

	a.op.Attempts++
	if err := p.put(ctx, kindProvision, name, a.op); err != nil {
		return result{}, err
	}
	a.recorder = p.events(class.Provisioner)
	a.recorder.Eventf(claim, corev1.EventTypeNormal, kube.EventProvisioning, "External provisioner is provisioning volume for claim %q", claim.Namespace+"/"+claim.Name)

	secrets, err := p.secrets(ctx, a.op.Secret)
	if err != nil {
		return p.failBeforeCall(ctx, claim, class, name, true, a.op, err), nil
	}
	// The claim may have gone since it was read (or cached): ask the API
	// server, right before the driver makes anything.
	if why, err := p.recheck(ctx, claim, name); err != nil || why != "" {
		if err != nil {
			return p.failBeforeCall(ctx, claim, class, name, true, a.op, err), nil
		}
		return p.abandon(ctx, d, name, a.op, a.found, why)
	}
	vol, res, done, err := p.createVolume(ctx, a, secrets)
	if done {
		return res, err
	}
	if p.wantsContentSource(claim) && vol.GetContentSource() == nil {
		return p.contentSourceMissing(ctx, a, vol, secrets)
	}
	faultpoint.Hit(faultpoint.ProvisionerAfterCreateVolume)
	return p.finish(ctx, a, vol)
}

// leaveToPopulator ends the attempt for a claim whose data source is kind,
// a volume populator's, as external-provisioner v6.3.0 does: two Normal
// Provisioning events, no ProvisioningFailed, nothing asked of the driver
// nor journaled, and FINISHED without a volume (its IgnoredError with
// ProvisioningFinished), so it is not tried again until the claim changes
// or is resynced. The populator makes the volume (through a claim of its
// own, which is provisioned as any other).
func (p *provisioner) leaveToPopulator(claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass, kind string) result {
	p.events(class.Provisioner).Eventf(claim, corev1.EventTypeNormal, kube.EventProvisioning,
		"External provisioner is provisioning volume for claim %q", claim.Namespace+"/"+claim.Name)
	// external-provisioner's own recorder, not the library's, says this.
	p.events(upstreamRecorder).Event(claim, corev1.EventTypeNormal, kube.EventProvisioning, "Assuming an external populator will provision the volume")
	msg := fmt.Sprintf("ignored because data source (%s) is not handled by the provisioner, assuming an external populator will provision it", kind)
	p.log.Debug("claim left to its volume populator", logging.Claim(claim), "kind", kind)
	return result{outcome: provisionerv1.Outcome_OUTCOME_FINISHED, message: msg}
}

// attempt is one provisioning attempt, from its journal record on.
type attempt struct {
	claim    *corev1.PersistentVolumeClaim
	class    *storagev1.StorageClass
	d        *driver
	name     string
	recorder record.EventRecorder
	// found: an earlier attempt's record holds op and req.
	found bool
	op    provisionOp
	req   *csi.CreateVolumeRequest
	spec  volumeSpec
}

// msgFinishedMeanwhile is the message of a recovery that found its
// operation finished by the time it held the lock: it did nothing.
const msgFinishedMeanwhile = "finished meanwhile"

// lock takes the operation's lock and reads an earlier attempt's record.
// done says the attempt ends here, with res and err: another replica
// holds the operation, or a recovery (journaledOnly) finds it finished.
func (p *provisioner) lock(ctx context.Context, a *attempt, journaledOnly bool) (res result, done bool, err error) {
	rec, found, err := p.journal.AcquireGet(ctx, kindProvision, a.name, p.member)
	if errors.Is(err, coord.ErrReserved) {
		return result{outcome: provisionerv1.Outcome_OUTCOME_IN_BACKGROUND, message: fmt.Sprintf("%s is being provisioned by another replica (%v)", a.name, err)}, true, nil
	}
	if err != nil {
		return result{}, true, err
	}
	if journaledOnly && !found {
		if err := p.journal.Unlock(ctx, kindProvision, a.name, p.member); err != nil {
			p.log.Warn("unlock provisioning", logging.Claim(a.claim), "volume", a.name, "error", err)
		}
		return result{outcome: provisionerv1.Outcome_OUTCOME_NO_CHANGE, message: msgFinishedMeanwhile}, true, nil
	}
	if !found {
		return result{}, false, nil
	}
	a.found = true
	if err := json.Unmarshal(rec.Value, &a.op); err != nil {
		return result{}, true, fmt.Errorf("journal record of %s: %w", a.name, err)
	}
	a.req = &csi.CreateVolumeRequest{}
	if err := proto.Unmarshal(a.op.Request, a.req); err != nil {
		return result{}, true, fmt.Errorf("journal record of %s: request: %w", a.name, err)
	}
	return result{}, false, nil
}

// prepare finds the secrets the PV will name and, on a first attempt,
// builds the request and the record to journal.
func (p *provisioner) prepare(ctx context.Context, a *attempt) error {
	a.spec = p.spec(a.d, a.claim, a.class)
	a.spec.name = a.name // a recovery's journaled name
	if err := p.checkModifyVolume(a.d, a.claim); err != nil {
		return err
	}
	var err error
	a.spec.secrets, err = p.secretRefs(a.class, a.claim, a.name)
	if err != nil {
		return err
	}
	if a.found {
		a.spec.readOnly = readOnlyVolume(p.publishReadOnlyFor(a.d), a.req)
		return nil
	}
	if a.spec.node, err = p.volumeNode(ctx, a.d, a.claim, a.class, a.spec.fsType); err != nil {
		return err
	}
	a.req, err = p.createRequest(ctx, a.d, a.claim, a.class, a.spec)
	a.spec.readOnly = readOnlyVolume(p.publishReadOnlyFor(a.d), a.req)
	a.op = provisionOp{ClaimNamespace: a.claim.Namespace, ClaimName: a.claim.Name, ClaimUID: string(a.claim.UID),
		Class: a.class.Name, Provisioner: a.class.Provisioner, Secret: a.spec.secrets["provisioner"], Start: p.now(), Node: a.spec.node}
	if err == nil {
		a.op.Request, err = proto.Marshal(a.req)
	}
	return err
}

// createVolume asks the driver for the volume. done says the attempt
// ends here, with res and err: the driver may still be making it (the
// record stays), or it made nothing (the record goes).
func (p *provisioner) createVolume(ctx context.Context, a *attempt, secrets map[string]string) (vol *csi.Volume, res result, done bool, err error) {
	call := proto.Clone(a.req).(*csi.CreateVolumeRequest)
	call.Secrets = secrets
	cctx, cancel := context.WithTimeout(withNode(ctx, a.op.Node), p.timeoutFor(a.d))
	cctx, step := p.timeline.Start(cctx, string(a.claim.UID), "CreateVolume")
	resp, err := a.d.controller.CreateVolume(cctx, call)
	step.EndErr(err, a.name)
	cancel()
	// As external-provisioner: rescheduling helps only a driver with
	// topology, whose next request names the newly selected node.
	out := classify(err, p.topologyFor(a.d) && a.claim.Annotations[kube.AnnSelectedNode] != "")
	if out == provisionerv1.Outcome_OUTCOME_FINISHED {
		return resp.GetVolume(), result{}, false, nil
	}
	failed(a.class.Provisioner, stageCreateVolume, err)
	if out == provisionerv1.Outcome_OUTCOME_IN_BACKGROUND {
		a.op.failed(err, p.now())
		if perr := p.put(ctx, kindProvision, a.name, a.op); perr != nil {
			p.log.Warn("journal provisioning attempt", logging.Claim(a.claim), "volume", a.name, "error", perr)
		}
	} else if ferr := p.journal.Finish(ctx, kindProvision, a.name, p.member); ferr != nil {
		// The driver made nothing: the operation is over.
		return nil, result{}, true, ferr
	}
	msg := failedMessage(err)
	a.recorder.Event(a.claim, corev1.EventTypeWarning, kube.EventProvisioningFailed, msg)
	return nil, result{outcome: out, message: msg, infeasible: infeasible(err)}, true, nil
}

// finish saves the PV of the volume the driver made, and removes the
// record; a claim deleted while the driver worked gets no PV, and its new
// volume is deleted here.
func (p *provisioner) finish(ctx context.Context, a *attempt, vol *csi.Volume) (result, error) {
	why, err := p.recheck(ctx, a.claim, a.name)
	if err == nil && why != "" {
		return p.discard(ctx, a.d, a.name, a.op, vol.GetVolumeId(), why)
	}
	var pv *corev1.PersistentVolume
	if err == nil {
		_, step := p.timeline.Start(ctx, string(a.claim.UID), "write PV")
		pv, err = p.saveVolume(ctx, buildVolume(a.spec, vol), a.claim)
		step.EndErr(err, a.name)
	}
	if err != nil {
		failed(a.class.Provisioner, stageSaveVolume, err)
		a.op.failed(fmt.Errorf("the volume was created but its PersistentVolume could not be saved: %w", err), p.now())
		if perr := p.put(ctx, kindProvision, a.name, a.op); perr != nil {
			p.log.Warn("journal provisioning attempt", logging.Claim(a.claim), "volume", a.name, "error", perr)
		}
		a.recorder.Event(a.claim, corev1.EventTypeWarning, kube.EventProvisioningFailed, a.op.LastError)
		return result{outcome: provisionerv1.Outcome_OUTCOME_IN_BACKGROUND, message: a.op.LastError}, nil
	}
	faultpoint.Hit(faultpoint.ProvisionerAfterSaveVolume)
	if err := p.journal.Finish(ctx, kindProvision, a.name, p.member); err != nil {
		// The PV exists: whoever recovers the record sees it and finishes.
		p.log.Warn("finish journal record", logging.Claim(a.claim), "volume", a.name, "error", err)
	}
	p.sources.releaseSnapshot(ctx, p.log, a.claim)
	a.recorder.Eventf(a.claim, corev1.EventTypeNormal, kube.EventProvisioningSucceeded, "Successfully provisioned volume %s", a.name)
	p.log.Info("provisioned", logging.Claim(a.claim), "volume", a.name, "handle", vol.GetVolumeId(), "attempts", a.op.Attempts)
	return result{outcome: provisionerv1.Outcome_OUTCOME_FINISHED, volume: pv}, nil
}

// failedMessage is the ProvisioningFailed event's message for a failed
// CreateVolume, as external-provisioner's controller words it: the error
// itself, and for InvalidArgument (infeasible, retried slowly) its note.
func failedMessage(err error) string {
	if infeasible(err) {
		return "Volume provisioning failed with infeasible error. Retries will be delayed. " + err.Error()
	}
	return err.Error()
}

// failBeforeCall ends an attempt that failed before the driver was asked.
// A journal record of an earlier attempt stays (that attempt may still be
// making the volume); with no earlier attempt there is nothing to keep.
func (p *provisioner) failBeforeCall(ctx context.Context, claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass, name string, journaled bool, op provisionOp, cause error) result {
	msg := cause.Error()
	failed(class.Provisioner, stageBeforeCall, cause)
	if journaled {
		op.failed(cause, p.now())
		if err := p.put(ctx, kindProvision, name, op); err != nil {
			p.log.Warn("journal provisioning attempt", logging.Claim(claim), "volume", name, "error", err)
		}
	} else if err := p.journal.Unlock(ctx, kindProvision, name, p.member); err != nil {
		p.log.Warn("unlock provisioning", logging.Claim(claim), "volume", name, "error", err)
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
		Parameters:         driverParameters(class, claim, spec.name, p.extraMetadataFor(d)),
	}
	node := spec.node
	if node == "" {
		node = claim.Annotations[kube.AnnSelectedNode]
	}
	if p.topologyFor(d) && (spec.node != "" || !unconstrained(p.immediateTopologyFor(d), class, claim)) {
		n, err := p.nodesFor(d, node)
		if err != nil {
			return nil, err
		}
		req.AccessibilityRequirements, err = accessibilityRequirements(n, d.name(), class, node, claim.Name, p.strictTopologyFor(d))
		if err != nil {
			return nil, err
		}
	}
	req.VolumeContentSource, err = p.sources.contentSource(ctx, claim, d)
	if err != nil {
		return nil, err
	}
	if req.MutableParameters, err = p.mutableParameters(ctx, d, claim); err != nil {
		return nil, err
	}
	return req, nil
}

// volumeNode is the node a node-deployed driver makes the claim's volume
// on: its selected node, else (Immediate binding) the one placeImmediate
// chooses. "" for a driver served cluster-wide.
func (p *provisioner) volumeNode(ctx context.Context, d *driver, claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass, fsType string) (string, error) {
	if !d.nodeDeployed() {
		return "", nil
	}
	if node := claim.Annotations[kube.AnnSelectedNode]; node != "" {
		return node, nil
	}
	caps, err := volumeCapabilities(claim, fsType, class.MountOptions, d.has(csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER))
	if err != nil {
		return "", err
	}
	return p.placeImmediate(ctx, d, claim, class, caps)
}

// saveVolume creates the PV; one that exists already for this claim (an
// earlier attempt got this far) is fine.
func (p *provisioner) saveVolume(ctx context.Context, pv *corev1.PersistentVolume, claim *corev1.PersistentVolumeClaim) (*corev1.PersistentVolume, error) {
	created, err := p.client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
	if err == nil {
		if !claim.CreationTimestamp.IsZero() {
			provisionSeconds.WithLabelValues(pv.Annotations[kube.AnnDynamicallyProvisioned]).Observe(p.now().Sub(claim.CreationTimestamp.Time).Seconds())
		}
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
