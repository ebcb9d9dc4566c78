package kubectlplugin

import (
	"bytes"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// explainAnswers are the binder's answers for claims of namespace team,
// with times relative to now (so that ages print the same every run):
// data waits with three candidates (the third fits), stuck waits for a
// provisioning the driver keeps failing, bound is bound.
func explainAnswers(now time.Time) map[string]*binderv1.ExplainClaimResponse {
	ts := func(d time.Duration) *timestamppb.Timestamp { return timestamppb.New(now.Add(d)) }
	claim := func(name, phase string) *binderv1.Claim {
		return &binderv1.Claim{Namespace: "team", Name: name, Uid: "uid-" + name, Phase: phase, StorageClassName: "fast",
			RequestedBytes: 1 << 30, AccessModes: []string{"ReadWriteOnce"}, VolumeMode: "Filesystem", ResourceVersion: "42", CreateTime: ts(-5 * time.Minute)}
	}
	bound := claim("bound", "Bound")
	bound.VolumeName, bound.CapacityBytes, bound.BindCompleted, bound.BoundByController = "pvc-uid-bound", 1<<30, true, true
	bound.StorageProvisioner = "fast.csi"
	stuck := claim("stuck", "Pending")
	stuck.StorageProvisioner = "fast.csi"
	return map[string]*binderv1.ExplainClaimResponse{
		"data": {
			Claim: claim("data", "Pending"), Decision: binderv1.Decision_DECISION_BIND, WouldBind: "pv-big",
			Message: "binds volume pv-big now: the first candidate in the binder's order that breaks no rule",
			Candidates: []*binderv1.Candidate{
				{Rank: 1, Name: "pv-small", StorageClassName: "fast", CapacityBytes: 512 << 20, AccessModes: []string{"ReadWriteOnce"}, VolumeMode: "Filesystem", Phase: "Available",
					RejectedBy: binderv1.Rule_RULE_CAPACITY, Message: "capacity 512Mi is less than the claim's request 1Gi"},
				{Rank: 2, Name: "pv-rox", StorageClassName: "fast", CapacityBytes: 2 << 30, AccessModes: []string{"ReadOnlyMany"}, VolumeMode: "Filesystem", Phase: "Available",
					RejectedBy: binderv1.Rule_RULE_ACCESS_MODES, Message: "lacks access mode ReadWriteOnce"},
				{Rank: 3, Name: "pv-big", StorageClassName: "fast", CapacityBytes: 5 << 30, AccessModes: []string{"ReadWriteOnce"}, VolumeMode: "Filesystem", Phase: "Available",
					Message: "fits"},
			},
			TotalCandidates: 3, MemberId: "binder-1",
		},
		"stuck": {
			Claim: stuck, Decision: binderv1.Decision_DECISION_PROVISION, MemberId: "binder-1",
			Message: `no volume fits: a volume is to be provisioned with StorageClass "fast" (no volume of StorageClass "fast" is free, and none names the claim)`,
			Provisioning: &binderv1.Provisioning{StorageClassName: "fast", ClassFound: true, Provisioner: "fast.csi", VolumeBindingMode: "Immediate",
				Served: true, DriverName: "fast.csi", DriverReady: true, Requested: true,
				Operation: &binderv1.ProvisioningOperation{VolumeName: "pvc-uid-stuck", Attempts: 4, LastErrorCode: "Unavailable", LastErrorMessage: "backend busy",
					LastAttemptTime: ts(-10 * time.Second), StartTime: ts(-2 * time.Minute), Owner: "provisioner-1"},
				NextRetryTime: ts(30*time.Second + 500*time.Millisecond),
				Message:       "volplane's provisioner creates the volume with CSI driver fast.csi; operation pvc-uid-stuck in flight after 4 attempt(s), last error Unavailable: backend busy"},
		},
		"bound": {
			Claim: bound, Decision: binderv1.Decision_DECISION_BOUND, MemberId: "binder-1",
			Message: "by the controller: fast.csi provisioned volume pvc-uid-bound for the claim, and the binder bound the claim to it",
			Binding: &binderv1.Binding{VolumeName: "pvc-uid-bound", ClaimBoundByController: true, ProvisionedBy: "fast.csi", VolumePhase: "Bound",
				Message: "by the controller: fast.csi provisioned volume pvc-uid-bound for the claim, and the binder bound the claim to it"},
		},
	}
}

// matchAnswer is the binder's answer to a match of a claim that would be
// provisioned.
func matchAnswer(now time.Time) *binderv1.MatchClaimResponse {
	return &binderv1.MatchClaimResponse{
		Claim: &binderv1.Claim{Namespace: "team", Name: "new", Uid: "uid-new", Phase: "Pending", StorageClassName: "fast",
			RequestedBytes: 1 << 30, AccessModes: []string{"ReadWriteOnce"}, VolumeMode: "Filesystem", CreateTime: timestamppb.New(now)},
		Decision: binderv1.Decision_DECISION_PROVISION,
		Message:  `no volume fits: a volume is to be provisioned with StorageClass "fast" (no volume of StorageClass "fast" is free, and none names the claim)`,
		Provisioning: &binderv1.Provisioning{StorageClassName: "fast", ClassFound: true, Provisioner: "fast.csi", VolumeBindingMode: "WaitForFirstConsumer",
			Served: true, DriverName: "fast.csi", DriverReady: true,
			Message: "volplane's provisioner creates the volume with CSI driver fast.csi"},
		CreateVolume: &provisionerv1.CreateVolumePlan{VolumeName: "pvc-uid-new", DriverName: "fast.csi", RequiredBytes: 1 << 30,
			VolumeCapabilities: []*provisionerv1.VolumeCapability{{AccessMode: "SINGLE_NODE_WRITER", FsType: "ext4", MountFlags: []string{"noatime"}}},
			Parameters:         map[string]string{"zone": "a", "type": "ssd"},
			RequisiteTopology:  []*provisionerv1.TopologySegment{{Segments: map[string]string{"topology.kubernetes.io/zone": "a"}}, {Segments: map[string]string{"topology.kubernetes.io/zone": "b"}}},
			PreferredTopology:  []*provisionerv1.TopologySegment{{Segments: map[string]string{"topology.kubernetes.io/zone": "a"}}},
			WithSecrets:        true},
	}
}

// The layouts of explain and match, as a person reads them: the decision
// and its reason first, the claim, the candidates table, the provisioning
// fields that say something; never a line for an unset field.
func TestExplainLayout(t *testing.T) {
	srv := httptest.NewServer(&fakeGateway{})
	defer srv.Close()
	claimFile := filepath.Join(t.TempDir(), "claim.yaml")
	if err := os.WriteFile(claimFile, []byte("metadata: {name: new}\nspec: {storageClassName: fast}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"candidates, in two pages": {[]string{"explain", "pvc", "data"}, `Decision:  Bind
Reason:    binds volume pv-big now: the first candidate in the binder's order that breaks no rule

Claim:         team/data
Status:        Pending
Request:       1Gi
Access Modes:  RWO
Volume Mode:   Filesystem
StorageClass:  fast
Age:           5m

Candidates (3):
  RANK   VOLUME     CAPACITY   ACCESS MODES   CLASS   REJECTED BY   MESSAGE
  1      pv-small   512Mi      RWO            fast    Capacity      capacity 512Mi is less than the claim's request 1Gi
  2      pv-rox     2Gi        ROX            fast    AccessModes   lacks access mode ReadWriteOnce
  3      pv-big     5Gi        RWO            fast    <none>        fits
`},
		"wide": {[]string{"explain", "pvc/data", "-o", "wide"}, `Decision:  Bind
Reason:    binds volume pv-big now: the first candidate in the binder's order that breaks no rule

Claim:             team/data
Status:            Pending
Request:           1Gi
Access Modes:      RWO
Volume Mode:       Filesystem
StorageClass:      fast
Age:               5m
UID:               uid-data
Resource Version:  42
Answered By:       binder-1

Candidates (3):
  RANK   VOLUME     CAPACITY   ACCESS MODES   CLASS   REJECTED BY   MESSAGE                                               VOLUME MODE   PHASE       PRE-BOUND
  1      pv-small   512Mi      RWO            fast    Capacity      capacity 512Mi is less than the claim's request 1Gi   Filesystem    Available   <none>
  2      pv-rox     2Gi        ROX            fast    AccessModes   lacks access mode ReadWriteOnce                       Filesystem    Available   <none>
  3      pv-big     5Gi        RWO            fast    <none>        fits                                                  Filesystem    Available   <none>
`},
		"provisioning": {[]string{"explain", "pvc", "stuck"}, `Decision:  Provision
Reason:    no volume fits: a volume is to be provisioned with StorageClass "fast" (no volume of StorageClass "fast" is free, and none names the claim)

Claim:         team/stuck
Status:        Pending
Request:       1Gi
Access Modes:  RWO
Volume Mode:   Filesystem
StorageClass:  fast
Provisioner:   fast.csi
Age:           5m

Provisioning:
  Status:        volplane's provisioner creates the volume with CSI driver fast.csi; operation pvc-uid-stuck in flight after 4 attempt(s), last error Unavailable: backend busy
  StorageClass:  fast (provisioner fast.csi, Immediate)
  Driver:        fast.csi (ready)
  Operation:     pvc-uid-stuck (4 attempts, started 2m ago, held by provisioner-1)
  Last Error:    Unavailable: backend busy (10s ago)
  Next Retry:    in 30s
`},
		"bound": {[]string{"explain", "pvc", "bound"}, `Decision:  Bound
Reason:    by the controller: fast.csi provisioned volume pvc-uid-bound for the claim, and the binder bound the claim to it

Claim:           team/bound
Status:          Bound
Volume:          pvc-uid-bound (Bound)
Capacity:        1Gi
Request:         1Gi
Access Modes:    RWO
Volume Mode:     Filesystem
StorageClass:    fast
Provisioned By:  fast.csi
Age:             5m
`},
		"match": {[]string{"match", "-f", claimFile}, `Decision:  Provision
Reason:    no volume fits: a volume is to be provisioned with StorageClass "fast" (no volume of StorageClass "fast" is free, and none names the claim)

Claim:         team/new
Status:        Pending
Request:       1Gi
Access Modes:  RWO
Volume Mode:   Filesystem
StorageClass:  fast

Provisioning:
  Status:        volplane's provisioner creates the volume with CSI driver fast.csi
  StorageClass:  fast (provisioner fast.csi, WaitForFirstConsumer)
  Driver:        fast.csi (ready)

Would Create Volume:
  Name:                pvc-uid-new
  Driver:              fast.csi
  Capacity:            1Gi
  Capabilities:        SINGLE_NODE_WRITER, filesystem ext4 (mount flags noatime)
  Parameters:          type=ssd, zone=a
  Requisite Topology:  topology.kubernetes.io/zone=a or topology.kubernetes.io/zone=b
  Preferred Topology:  topology.kubernetes.io/zone=a
  Secrets:             the StorageClass names provisioner secrets (never shown)
`},
	} {
		t.Run(name, func(t *testing.T) {
			out, _, err := run(t, srv.URL, tc.args...)
			if err != nil {
				t.Fatal(err)
			}
			if out != tc.want {
				t.Errorf("got:\n%s\nwant:\n%s", out, tc.want)
			}
			for _, bad := range []string{"<none>\n", "Bytes", ": 0\n", "UNSPECIFIED", "false"} {
				if strings.Contains(strings.Split(out, "Candidates")[0], bad) {
					t.Errorf("layout shows %q, an unset field:\n%s", bad, out)
				}
			}
		})
	}
}

// An answer that is not an explain answer (a gateway this plugin does not
// know) is shown field by field, without its unset fields.
func TestDescribeAny(t *testing.T) {
	o, err := decodeObject([]byte(`{"claim":{"name":"data","phase":"Pending","capacityBytes":"0","deleting":false},"wouldBind":"","state":"STATE_UNSPECIFIED","items":[{"name":"a","size":"1","extra":""},{"name":"b","size":"0","extra":""}],"tags":["x","y"],"empty":{"a":""}}`))
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := describeAny(&b, o); err != nil {
		t.Fatal(err)
	}
	want := `Claim:
  Name:   data
  Phase:  Pending
Items:
  NAME   SIZE
  a      1
  b      <none>
Tags:  x, y
`
	if b.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", b.String(), want)
	}
}

// The fixtures are the real messages: they encode as the gateway encodes
// them (every field, unset ones too), which is what the layout must skip.
func TestFixturesAreWhatTheGatewaySends(t *testing.T) {
	b, err := protojson.MarshalOptions{EmitUnpopulated: true}.Marshal(explainAnswers(time.Now())["bound"])
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"candidates":[]`, `"provisioning":null`, `"wouldBind":""`, `"deleting":false`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("the answer lacks %s: %s", want, b)
		}
	}
}
