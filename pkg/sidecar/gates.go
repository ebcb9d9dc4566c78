package sidecar

import (
	"errors"
	"fmt"
	"maps"
	"slices"
)

// GateStage is a feature gate's maturity, as component-base's featuregate
// names it.
type GateStage string

// The stages of csi-provisioner's gates.
const (
	Alpha      GateStage = "ALPHA"
	Beta       GateStage = "BETA"
	GA         GateStage = "GA"
	Deprecated GateStage = "DEPRECATED"
)

// The gates of csi-provisioner v6.3.0 that change what it does.
const (
	// GateTopology: off, no accessibility requirements are sent and PVs
	// get no node affinity, whatever the driver can do (GA, on).
	GateTopology = "Topology"
	// GateVolumeAttributesClass: off, a claim's
	// volumeAttributesClassName is ignored (GA, on).
	GateVolumeAttributesClass = "VolumeAttributesClass"
	// GateCrossNamespaceVolumeDataSource lets a claim's dataSourceRef
	// name a source in another namespace (alpha, off).
	GateCrossNamespaceVolumeDataSource = "CrossNamespaceVolumeDataSource"
	// GateReleaseLeaderElectionOnExit releases the leader lock on exit
	// (alpha, off).
	GateReleaseLeaderElectionOnExit = "ReleaseLeaderElectionOnExit"
)

// Gate is one feature gate csi-provisioner v6.3.0 knows, as resolved at
// its binary version (component-base v0.36.1, emulation version 1.36).
type Gate struct {
	Name    string
	Stage   GateStage
	Default bool
	// Locked: the gate may only be set to Default.
	Locked bool
}

// Gates are every gate csi-provisioner v6.3.0's --feature-gates accepts:
// its own four (pkg/features), component-base's AllAlpha and AllBeta, and
// those that k8s.io/apiserver v0.36.1 and component-base's metrics, which
// its binary links, register (GA and deprecated ones included, which its
// --help hides). Those others change nothing that volplane does for
// csi-provisioner (NativeHistograms only the format of its own metrics).
// Generated from the module at the tag: the resolved
// utilfeature.DefaultMutableFeatureGate.GetAll() of a program importing
// what cmd/csi-provisioner imports; a test checks each gate against the
// pinned binary.
var Gates = []Gate{
	{"APIResponseCompression", Beta, true, false},
	{"APIServerIdentity", Beta, true, false},
	{"APIServerTracing", GA, true, true},
	{"APIServingWithRoutine", Alpha, false, false},
	{"AggregatedDiscoveryRemoveBetaType", Deprecated, true, true},
	{"AllAlpha", Alpha, false, false},
	{"AllBeta", Beta, false, false},
	{"AllowParsingUserUIDFromCertAuth", Beta, true, false},
	{"AllowUnsafeMalformedObjectDeletion", Alpha, false, false},
	{"AnonymousAuthConfigurableEndpoints", GA, true, true},
	{"AuthorizeWithSelectors", GA, true, true},
	{"BtreeWatchCache", GA, true, true},
	{"CBORServingAndStorage", Alpha, false, false},
	{"ComponentFlagz", Beta, true, false},
	{"ComponentStatusz", Beta, true, false},
	{"ConcurrentWatchObjectDecode", Beta, false, false},
	{"ConsistentListFromCache", GA, true, true},
	{"ConstrainedImpersonation", Beta, true, false},
	{"CoordinatedLeaderElection", Beta, false, false},
	{"CrossNamespaceVolumeDataSource", Alpha, false, false},
	{"DeclarativeValidation", GA, true, true},
	{"DeclarativeValidationBeta", Beta, true, false},
	{"DeclarativeValidationTakeover", Deprecated, false, false},
	{"DetectCacheInconsistency", Beta, true, false},
	{"KMSv1", Deprecated, false, false},
	{"ListFromCacheSnapshot", Beta, true, false},
	{"ManifestBasedAdmissionControlConfig", Alpha, false, false},
	{"MutatingAdmissionPolicy", GA, true, false},
	{"NativeHistograms", Alpha, false, false},
	{"OpenAPIEnums", Beta, true, false},
	{"ReleaseLeaderElectionOnExit", Alpha, false, false},
	{"RemoteRequestHeaderUID", Beta, true, false},
	{"ResilientWatchCacheInitialization", GA, true, true},
	{"RetryGenerateName", GA, true, true},
	{"SeparateCacheWatchRPC", Deprecated, false, true},
	{"ShardedListAndWatch", Alpha, false, false},
	{"SizeBasedListCostEstimate", Beta, true, false},
	{"StorageVersionAPI", Alpha, false, false},
	{"StorageVersionHash", Beta, true, false},
	{"StreamingCollectionEncodingToJSON", GA, true, true},
	{"StreamingCollectionEncodingToProtobuf", GA, true, true},
	{"StructuredAuthenticationConfiguration", GA, true, true},
	{"StructuredAuthenticationConfigurationEgressSelector", Beta, true, false},
	{"StructuredAuthenticationConfigurationJWKSMetrics", Beta, true, false},
	{"TokenRequestServiceAccountUIDValidation", Beta, true, false},
	{"Topology", GA, true, false},
	{"UnauthenticatedHTTP2DOSMitigation", Beta, true, false},
	{"UnknownVersionInteroperabilityProxy", Beta, true, false},
	{"VolumeAttributesClass", GA, true, false},
	{"WatchCacheInitializationPostStartHook", Beta, true, false},
	{"WatchList", Beta, true, false},
}

// GateByName is the gate named name.
func GateByName(name string) (Gate, bool) {
	for _, g := range Gates {
		if g.Name == name {
			return g, true
		}
	}
	return Gate{}, false
}

// CheckGates refuses what csi-provisioner v6.3.0 refuses in
// --feature-gates (featuregate's SetFromMap), with its words: a gate it
// does not know, and a locked gate set to the other value. GA and
// deprecated gates may be set (csi-provisioner logs a warning).
func CheckGates(gates map[string]bool) error {
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(gates)) {
		g, ok := GateByName(name)
		if !ok {
			return fmt.Errorf("unrecognized feature gate: %s", name)
		}
		if v := gates[name]; g.Locked && v != g.Default {
			errs = append(errs, fmt.Errorf("cannot set feature gate %s to %t, feature is locked to %t", name, v, g.Default))
		}
	}
	return errors.Join(errs...)
}

// GateEnabled is whether the gate name is on with gates set, as
// csi-provisioner decides it: the value set, else AllAlpha's for an alpha
// gate or AllBeta's for a beta one when that is set, else the default. An
// unknown gate is off.
func GateEnabled(gates map[string]bool, name string) bool {
	if v, ok := gates[name]; ok {
		return v
	}
	g, ok := GateByName(name)
	if !ok {
		return false
	}
	all := map[GateStage]string{Alpha: "AllAlpha", Beta: "AllBeta"}[g.Stage]
	if v, ok := gates[all]; ok && all != "" && name != all {
		return v
	}
	return g.Default
}
