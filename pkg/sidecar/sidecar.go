package sidecar

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

const (
	// LabelRegistration marks a Lease as a sidecar's registration; its
	// value is the contract's version.
	LabelRegistration = "volplane.io/csi-sidecar"
	// Version is this contract's version (LabelRegistration's value).
	Version = "v1"

	// AnnotationDriver is the CSI driver name (GetPluginInfo).
	AnnotationDriver = "volplane.io/csi-driver"
	// AnnotationPod is the sidecar's pod, in the Lease's namespace.
	AnnotationPod = "volplane.io/pod"
	// AnnotationPort is the TLS port the sidecar serves the driver on.
	AnnotationPort = "volplane.io/port"
	// AnnotationCertSHA256 is the hex SHA-256 of the DER of the port's
	// serving certificate.
	AnnotationCertSHA256 = "volplane.io/cert-sha256"
	// AnnotationLeaderElection is "true" when the sidecar registers only
	// while it holds the driver's leader lock.
	AnnotationLeaderElection = "volplane.io/leader-election"
	// AnnotationSettings is the JSON of Settings: the csi-provisioner
	// flags of the sidecar's command line that shape requests and PVs.
	AnnotationSettings = "volplane.io/provisioning-settings"
	// AnnotationNode is, for a sidecar started with --node-deployment, the
	// node its pod runs on: the driver behind it makes volumes for claims
	// whose selected node is this one only. Absent: the driver serves the
	// whole cluster.
	AnnotationNode = "volplane.io/node"
	// AnnotationNodeTopology is the JSON object of the node's topology
	// segment as the driver's NodeGetInfo reports it (node deployment).
	AnnotationNodeTopology = "volplane.io/node-topology"
	// AnnotationNodeImmediateBinding is "false" when the node-deployed
	// sidecar was started with --node-deployment-immediate-binding=false:
	// claims of Immediate binding are not provisioned on its node.
	AnnotationNodeImmediateBinding = "volplane.io/node-immediate-binding"

	// Group, ResourceDrivers and VerbServe are what a SubjectAccessReview
	// asks of a sidecar pod's ServiceAccount, with the driver's name as
	// the resource name.
	Group           = "volplane.io"
	ResourceDrivers = "csidrivers"
	VerbServe       = "serve"
	// ClusterRole is the shipped role granting VerbServe on every driver
	// and reading CAConfigMap.
	ClusterRole = "volplane-csi-sidecar"

	// CAConfigMap is the ConfigMap, in volplane's namespace, whose
	// CAConfigMapKey is the CA bundle the sidecar verifies the
	// provisioner's client certificate with.
	CAConfigMap    = "volplane-provisioner-ca"
	CAConfigMapKey = "ca.crt"

	// DefaultPort is the sidecar's default TLS port.
	DefaultPort = 7710
	// LeaseDuration is how long a registration holds without renewal;
	// RenewInterval how often the sidecar renews it.
	LeaseDuration = 30 * time.Second
	RenewInterval = 10 * time.Second
)

// Registration is what a sidecar's Lease says.
type Registration struct {
	Namespace      string
	Pod            string
	Driver         string
	Port           int
	CertSHA256     string // lower-case hex
	LeaderElection bool
	// Settings are the sidecar's request-shaping flags.
	Settings Settings
	// Node is the node of a node-deployed sidecar (--node-deployment),
	// "" for one serving the whole cluster. NodeTopology is that node's
	// segment (NodeGetInfo), NodeImmediateBinding whether claims of
	// Immediate binding may be placed on it. These are annotations of
	// their own, not Settings, so that a provisioner that predates them
	// reads the Lease as before.
	Node                 string
	NodeTopology         map[string]string
	NodeImmediateBinding bool
	// RenewTime and Duration say until when the registration holds.
	RenewTime time.Time
	Duration  time.Duration
}

// Settings are the csi-provisioner flags on a sidecar's command line that
// change what is sent to the driver or written to PVs. The sidecar does
// not act on them itself; it carries them to the provisioner, which
// provisions for that driver with them or, where it cannot, marks the
// driver not ready and says which flag differs. Nothing is dropped
// silently.
type Settings struct {
	VolumeNamePrefix     string        `json:"volumeNamePrefix,omitempty"`
	VolumeNameUUIDLength int           `json:"volumeNameUUIDLength,omitempty"`
	ExtraCreateMetadata  bool          `json:"extraCreateMetadata,omitempty"`
	DefaultFSType        string        `json:"defaultFSType,omitempty"`
	StrictTopology       bool          `json:"strictTopology,omitempty"`
	ImmediateTopology    *bool         `json:"immediateTopology,omitempty"`
	Timeout              time.Duration `json:"timeout,omitempty"`
	// PreventVolumeModeConversion is --prevent-volume-mode-conversion
	// (nil from a sidecar that predates it); the provisioner checks
	// restores with its own flag and refuses a driver whose sidecar says
	// otherwise.
	PreventVolumeModeConversion *bool `json:"preventVolumeModeConversion,omitempty"`
	// FeatureGates are csi-provisioner's --feature-gates as given.
	FeatureGates map[string]bool `json:"featureGates,omitempty"`
	// ControllerPublishReadOnly is --controller-publish-readonly: the PV
	// of a claim whose only access mode is ReadOnlyMany gets
	// spec.csi.readOnly.
	ControllerPublishReadOnly bool `json:"controllerPublishReadOnly,omitempty"`
	// NodeDeployment is --node-deployment: the registration names its
	// node (AnnotationNode). It is a setting as well as the annotations so
	// that a provisioner that predates node deployment, whose strict
	// decoding refuses the unknown field, never uses a node's sidecar as
	// one serving the whole cluster (which would send it other nodes'
	// claims); a sidecar serving the whole cluster omits it.
	NodeDeployment bool `json:"nodeDeployment,omitempty"`
}

// RegistrationName is the name of the Lease that registers pod.
func RegistrationName(pod string) string {
	name := "volplane-csi-" + pod
	if len(name) > validation.DNS1123SubdomainMaxLength {
		name = name[:validation.DNS1123SubdomainMaxLength]
	}
	return strings.TrimRight(name, "-.")
}

// CertSHA256 is the fingerprint a registration pins for a certificate's
// DER bytes.
func CertSHA256(der []byte) string {
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:])
}

// Expires is when the registration stops holding.
func (r Registration) Expires() time.Time { return r.RenewTime.Add(r.Duration) }

// Fresh reports whether the registration holds at now.
func (r Registration) Fresh(now time.Time) bool { return now.Before(r.Expires()) }

// Key identifies the registration: namespace/pod.
func (r Registration) Key() string { return r.Namespace + "/" + r.Pod }

// Lease is the registration as its Lease, renewed at now.
func (r Registration) Lease(now time.Time) *coordinationv1.Lease {
	secs := int32(r.Duration / time.Second)
	holder := r.Pod
	renew := metav1.NewMicroTime(now)
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name:      RegistrationName(r.Pod),
			Namespace: r.Namespace,
			Labels:    map[string]string{LabelRegistration: Version},
			Annotations: map[string]string{
				AnnotationDriver:         r.Driver,
				AnnotationPod:            r.Pod,
				AnnotationPort:           strconv.Itoa(r.Port),
				AnnotationCertSHA256:     r.CertSHA256,
				AnnotationLeaderElection: strconv.FormatBool(r.LeaderElection),
				AnnotationSettings:       mustJSON(r.Settings),
			},
		},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &secs, RenewTime: &renew},
	}
	if r.Node != "" {
		l.Annotations[AnnotationNode] = r.Node
		l.Annotations[AnnotationNodeTopology] = mustJSON(r.NodeTopology)
		l.Annotations[AnnotationNodeImmediateBinding] = strconv.FormatBool(r.NodeImmediateBinding)
	}
	return l
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil { // plain maps and structs always marshal
		panic(err)
	}
	return string(b)
}

// ErrNotRegistration is returned for a Lease without LabelRegistration.
var ErrNotRegistration = errors.New("not a volplane sidecar registration")

// FromLease reads a registration, refusing one that is malformed: a
// forged or damaged Lease is reported, never half-trusted.
func FromLease(l *coordinationv1.Lease) (Registration, error) {
	if l.Labels[LabelRegistration] == "" {
		return Registration{}, ErrNotRegistration
	}
	if v := l.Labels[LabelRegistration]; v != Version {
		return Registration{}, fmt.Errorf("lease %s/%s: registration version %q, this provisioner reads %q", l.Namespace, l.Name, v, Version)
	}
	a := l.Annotations
	r := Registration{Namespace: l.Namespace, Pod: a[AnnotationPod], Driver: a[AnnotationDriver], CertSHA256: a[AnnotationCertSHA256]}
	var errs []error
	if msgs := validation.IsDNS1123Subdomain(r.Pod); r.Pod == "" || len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("%s %q is not a pod name", AnnotationPod, r.Pod))
	} else if l.Name != RegistrationName(r.Pod) {
		errs = append(errs, fmt.Errorf("named %q, but a registration of pod %q is named %q", l.Name, r.Pod, RegistrationName(r.Pod)))
	}
	if r.Driver == "" || len(r.Driver) > 63 {
		errs = append(errs, fmt.Errorf("%s %q is not a CSI driver name (1 to 63 characters)", AnnotationDriver, r.Driver))
	}
	port, err := strconv.Atoi(a[AnnotationPort])
	if err != nil || port < 1 || port > 65535 {
		errs = append(errs, fmt.Errorf("%s %q is not a port", AnnotationPort, a[AnnotationPort]))
	}
	r.Port = port
	if b, err := hex.DecodeString(r.CertSHA256); err != nil || len(b) != sha256.Size || r.CertSHA256 != strings.ToLower(r.CertSHA256) {
		errs = append(errs, fmt.Errorf("%s %q is not a lower-case hex SHA-256", AnnotationCertSHA256, r.CertSHA256))
	}
	r.LeaderElection = a[AnnotationLeaderElection] == "true"
	if js := a[AnnotationSettings]; js != "" {
		dec := json.NewDecoder(strings.NewReader(js))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&r.Settings); err != nil {
			errs = append(errs, fmt.Errorf("%s: %v", AnnotationSettings, err))
		}
	}
	errs = append(errs, r.readNode(a)...)
	if l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil || *l.Spec.LeaseDurationSeconds <= 0 {
		errs = append(errs, errors.New("spec.renewTime and a positive spec.leaseDurationSeconds are required"))
	} else {
		r.RenewTime = l.Spec.RenewTime.Time
		r.Duration = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	if len(errs) > 0 {
		return Registration{}, fmt.Errorf("lease %s/%s: %w", l.Namespace, l.Name, errors.Join(errs...))
	}
	return r, nil
}

// readNode reads the node-deployment annotations into r, if any: a node
// name, its topology (a JSON object of label keys and values) and the
// immediate-binding switch, checked as the API server checks a Node's name
// and labels.
func (r *Registration) readNode(a map[string]string) []error {
	node, ok := a[AnnotationNode]
	if ok != r.Settings.NodeDeployment {
		return []error{fmt.Errorf("%s is set: %v, but the settings' nodeDeployment is %v", AnnotationNode, ok, r.Settings.NodeDeployment)}
	}
	if !ok {
		return nil
	}
	var errs []error
	if msgs := validation.IsDNS1123Subdomain(node); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("%s %q is not a node name", AnnotationNode, node))
	}
	r.Node = node
	if err := json.Unmarshal([]byte(a[AnnotationNodeTopology]), &r.NodeTopology); err != nil {
		errs = append(errs, fmt.Errorf("%s: %v", AnnotationNodeTopology, err))
	}
	for k, v := range r.NodeTopology {
		if len(validation.IsQualifiedName(k)) > 0 || len(validation.IsValidLabelValue(v)) > 0 {
			errs = append(errs, fmt.Errorf("%s: %q=%q is not a topology label", AnnotationNodeTopology, k, v))
		}
	}
	switch v := a[AnnotationNodeImmediateBinding]; v {
	case "true", "false":
		r.NodeImmediateBinding = v == "true"
	default:
		errs = append(errs, fmt.Errorf("%s %q is not true or false", AnnotationNodeImmediateBinding, v))
	}
	return errs
}
