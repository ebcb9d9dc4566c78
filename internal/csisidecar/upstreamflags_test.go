package csisidecar

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/volplane/volplane/pkg/sidecar"
)

// --controller-publish-readonly, --immediate-topology=false and
// --volume-name-uuid-length are carried, not refused.
func TestUpstreamFlagsAreCarried(t *testing.T) {
	o, err := Parse([]string{"--controller-publish-readonly", "--immediate-topology=false", "--volume-name-uuid-length=16",
		"--feature-gates=Topology=false,VolumeAttributesClass=false"})
	if err != nil {
		t.Fatal(err)
	}
	if r := o.Refusals(); len(r) != 0 {
		t.Fatalf("refused: %v", r)
	}
	s := o.Settings
	if !s.ControllerPublishReadOnly || s.ImmediateTopology == nil || *s.ImmediateTopology || s.VolumeNameUUIDLength != 16 ||
		s.FeatureGates[sidecar.GateTopology] || s.FeatureGates[sidecar.GateVolumeAttributesClass] {
		t.Fatalf("carried %+v", s)
	}
	for _, name := range []string{"controller-publish-readonly", "immediate-topology", "volume-name-uuid-length", "feature-gates"} {
		if f, _ := FlagByName(name); f.Class != Carried {
			t.Errorf("--%s is %s, want carried", name, f.Class)
		}
	}
}

// The sidecar refuses at start the gates csi-provisioner v6.3.0 refuses,
// with its words, and accepts the others.
func TestFeatureGatesRefusedAsCSIProvisioner(t *testing.T) {
	for _, tc := range []struct {
		gates string
		want  string // "" accepted
	}{
		{"Topology=false", ""},
		{"ReleaseLeaderElectionOnExit=true,AllAlpha=true", ""},
		{"StructuredAuthenticationConfiguration=true", ""},
		{"StructuredAuthenticationConfiguration=false", "cannot set feature gate StructuredAuthenticationConfiguration to false, feature is locked to true"},
		{"HonorPVReclaimPolicy=true", "unrecognized feature gate: HonorPVReclaimPolicy"},
	} {
		o, err := Parse([]string{"--feature-gates=" + tc.gates})
		if err != nil {
			t.Fatal(err)
		}
		err = o.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s refused: %v", tc.gates, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "--feature-gates")):
			t.Errorf("%s: %v, want a refusal of --feature-gates with %q", tc.gates, err, tc.want)
		}
	}
}

// pinnedProvisioner is $VOLPLANE_CSI_PROVISIONER, or a skip.
func pinnedProvisioner(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("VOLPLANE_CSI_PROVISIONER")
	if bin == "" {
		t.Skip("VOLPLANE_CSI_PROVISIONER is not set (make test sets it; make external-provisioner builds it)")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("VOLPLANE_CSI_PROVISIONER=%s: %v", bin, err)
	}
	return bin
}

// acceptsGates runs the pinned csi-provisioner with --feature-gates=gates
// and --version, which it reads after the gates: nil when it accepts
// them, else its complaint.
func acceptsGates(t *testing.T, bin, gates string) error {
	out, err := exec.CommandContext(t.Context(), bin, "--feature-gates="+gates, "--version").CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// TestGatesAreThePinnedProvisioners: every gate of sidecar.Gates is
// accepted and refused by the pinned csi-provisioner as by
// sidecar.CheckGates (set to its default, and to the other value), an
// unknown gate is refused by both, and the gates its --help lists are
// Gates' alpha and beta ones with the same defaults.
func TestGatesAreThePinnedProvisioners(t *testing.T) {
	bin := pinnedProvisioner(t)
	for _, g := range append(sidecar.Gates, sidecar.Gate{Name: "NoSuchGate"}) {
		for _, v := range []bool{g.Default, !g.Default} {
			gates := fmt.Sprintf("%s=%t", g.Name, v)
			theirs := acceptsGates(t, bin, gates)
			ours := sidecar.CheckGates(map[string]bool{g.Name: v})
			if (theirs == nil) != (ours == nil) {
				t.Errorf("--feature-gates=%s: csi-provisioner %v, volplane %v", gates, theirs, ours)
			}
			if ours != nil && theirs != nil && !strings.Contains(theirs.Error(), ours.Error()) {
				t.Errorf("--feature-gates=%s: csi-provisioner says %v, volplane %v", gates, theirs, ours)
			}
		}
	}
	out, _ := exec.CommandContext(t.Context(), bin, "--help").CombinedOutput()
	listed := map[string]string{}
	re := regexp.MustCompile(`^\s+([A-Za-z0-9]+)=true\|false \((ALPHA|BETA) - default=(true|false)\)`)
	for line := range strings.SplitSeq(string(out), "\n") {
		if m := re.FindStringSubmatch(line); m != nil {
			listed[m[1]] = m[2] + " " + m[3]
		}
	}
	if len(listed) < 10 {
		t.Fatalf("%s --help lists %d gates:\n%s", bin, len(listed), out)
	}
	var errs []error
	for _, g := range sidecar.Gates {
		if g.Stage != sidecar.Alpha && g.Stage != sidecar.Beta {
			continue
		}
		if want := fmt.Sprintf("%s %t", g.Stage, g.Default); listed[g.Name] != want {
			errs = append(errs, fmt.Errorf("%s: --help says %q, Gates %q", g.Name, listed[g.Name], want))
		}
		delete(listed, g.Name)
	}
	for name := range listed {
		errs = append(errs, fmt.Errorf("--help lists %s, which Gates lacks", name))
	}
	if err := errors.Join(errs...); err != nil {
		t.Error(err)
	}
}
