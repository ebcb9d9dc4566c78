package conformance_test

import (
	"testing"

	"k8s.io/client-go/kubernetes"

	"github.com/volplane/volplane/pkg/conformance"
	"github.com/volplane/volplane/pkg/grpcutil"
)

// A Go test of another provisioner runs the provisioner suite against it,
// one subtest per check.
func ExampleRunTest() {
	var t *testing.T                // the test's
	var client kubernetes.Interface // a client of the test cluster
	conformance.RunTest(t, conformance.Provisioner, conformance.Config{
		Address: "127.0.0.1:7703",
		TLS:     grpcutil.TLSFiles{CAFile: "ca.crt", CertFile: "client.crt", KeyFile: "client.key"},
		Kube:    client,
	})
}
