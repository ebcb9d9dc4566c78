package provisioner

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/volplane/volplane/pkg/sidecar"
)

// GateCrossNamespaceVolumeDataSource lets a claim's dataSourceRef name a
// claim or VolumeSnapshot of another namespace that a ReferenceGrant there
// allows (crossns.go), as external-provisioner's feature gate of that name;
// off by default (alpha), as there.
const GateCrossNamespaceVolumeDataSource = sidecar.GateCrossNamespaceVolumeDataSource

// FeatureGates is the value of --feature-gates, written as Kubernetes
// components and external-provisioner write it: comma-separated
// Name=true|false pairs, the flag repeatable. It accepts what
// csi-provisioner v6.3.0 accepts (pkg/sidecar.Gates): a gate it does not
// know is refused, and so is a locked gate set to the other value, as
// there. Of those gates, Topology, VolumeAttributesClass and
// CrossNamespaceVolumeDataSource change what the provisioner does; the
// others change nothing, as in csi-provisioner.
type FeatureGates map[string]bool

// Enabled reports whether gate is on, as csi-provisioner decides it
// (sidecar.GateEnabled: its default when not set, AllAlpha and AllBeta
// included).
func (g FeatureGates) Enabled(gate string) bool { return sidecar.GateEnabled(g, gate) }

// Set parses one --feature-gates value into g.
func (g *FeatureGates) Set(s string) error {
	if *g == nil {
		*g = FeatureGates{}
	}
	set := map[string]bool{}
	for _, pair := range strings.Split(s, ",") {
		pair = strings.TrimSpace(pair)
		if pair == "" {
			continue
		}
		name, value, ok := strings.Cut(pair, "=")
		name = strings.TrimSpace(name)
		if !ok {
			return fmt.Errorf("missing bool value for feature gate %q (--feature-gates %s=true)", name, name)
		}
		on, err := strconv.ParseBool(strings.TrimSpace(value))
		if err != nil {
			return fmt.Errorf("invalid value of feature gate %s=%s, err: %w", name, value, err)
		}
		set[name] = on
	}
	if err := sidecar.CheckGates(set); err != nil {
		return fmt.Errorf("%w (--feature-gates takes csi-provisioner v6.3.0's gates, docs/compatibility.md)", err)
	}
	for name, on := range set {
		(*g)[name] = on
	}
	return nil
}

// String is the gates set, sorted.
func (g *FeatureGates) String() string {
	if g == nil {
		return ""
	}
	var parts []string
	for name, on := range *g {
		parts = append(parts, name+"="+strconv.FormatBool(on))
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}

// Type names the flag's value in --help.
func (*FeatureGates) Type() string { return "mapStringBool" }
