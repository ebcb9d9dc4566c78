package conformance

import (
	"testing"

	"github.com/volplane/volplane/pkg/conformance"
	"github.com/volplane/volplane/test/harness/e2e"
)

// config is the suites' configuration against this package's cluster.
func config(address string) conformance.Config {
	return conformance.Config{
		Address:     address,
		TLS:         cluster.e2e.TLS(e2e.Client),
		Kube:        cluster.e2e.Client,
		CSIEndpoint: cluster.csiEndpoint,
	}
}

// TestWatcherConforms runs the watcher suite against volplane's watcher;
// its history is small enough that the relist of a cursor that is too old
// is checked too.
func TestWatcherConforms(t *testing.T) {
	cfg := config(cluster.watcherAddr)
	cfg.HistoryWrites = 5 * historySize
	expectAllPass(t, conformance.RunTest(t, conformance.Watcher, cfg))
}

// TestProvisionerConforms runs the provisioner suite against volplane's
// provisioner, with the binder and reclaimer running beside it.
func TestProvisionerConforms(t *testing.T) {
	cfg := config(cluster.provisionerAddr)
	cfg.ProvisionerName = driverName
	expectAllPass(t, conformance.RunTest(t, conformance.Provisioner, cfg))
}

// TestReclaimerConforms runs the reclaimer suite, the Delete check through
// volplane's provisioner.
func TestReclaimerConforms(t *testing.T) {
	cfg := config(cluster.reclaimerAddr)
	cfg.ProvisionerAddress, cfg.ProvisionerName = cluster.provisionerAddr, driverName
	expectAllPass(t, conformance.RunTest(t, conformance.Reclaimer, cfg))
}

// TestBinderConforms runs the binder suite, dynamic provisioning through
// volplane's provisioner included.
func TestBinderConforms(t *testing.T) {
	cfg := config(cluster.binderAddr)
	cfg.ProvisionerName = driverName
	expectAllPass(t, conformance.RunTest(t, conformance.Binder, cfg))
}

// expectAllPass fails the test when a check was skipped (RunTest fails
// it for a failed check): volplane's services implement the whole
// contract, and the cluster here gives every check what it needs.
func expectAllPass(t *testing.T, results []conformance.Result) {
	t.Helper()
	for _, r := range results {
		if r.Outcome == conformance.Skipped {
			t.Errorf("%s was skipped against volplane's own service: %s", r.Check, r.Message)
		}
	}
}
