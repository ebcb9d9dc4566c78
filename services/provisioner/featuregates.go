package provisioner

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// GateCrossNamespaceVolumeDataSource lets a claim's dataSourceRef name a
// claim or VolumeSnapshot of another namespace that a ReferenceGrant there
// allows (crossns.go), as external-provisioner's feature gate of that name;
// off by default (alpha), as there.
const GateCrossNamespaceVolumeDataSource = "CrossNamespaceVolumeDataSource"

// knownGates are the gates --feature-gates accepts, with their defaults.
var knownGates = map[string]bool{GateCrossNamespaceVolumeDataSource: false}

// FeatureGates is the value of --feature-gates, written as Kubernetes
// components and external-provisioner write it: comma-separated
// Name=true|false pairs, the flag repeatable. A gate it does not know is
// refused, as there.
type FeatureGates map[string]bool

// Enabled reports whether gate is on (its default when not set).
func (g FeatureGates) Enabled(gate string) bool {
	if on, ok := g[gate]; ok {
		return on
	}
	return knownGates[gate]
}

// Set parses one --feature-gates value into g.
func (g *FeatureGates) Set(s string) error {
	if *g == nil {
		*g = FeatureGates{}
	}
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
		if _, known := knownGates[name]; !known {
			return fmt.Errorf("unrecognized feature gate: %s (--feature-gates knows %s)", name, strings.Join(gateNames(), ", "))
		}
		on, err := strconv.ParseBool(strings.TrimSpace(value))
		if err != nil {
			return fmt.Errorf("invalid value of feature gate %s=%s, err: %w", name, value, err)
		}
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

func gateNames() []string {
	var names []string
	for name := range knownGates {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}
