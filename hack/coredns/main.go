// Command coredns is CoreDNS at the version go.mod pins, with only the
// plugins the local cluster's DNS needs (make cluster; the Deployment is
// hack/cluster/manifests/coredns.yaml): kubernetes serves the Service and
// pod names of cluster.local and the reverse zones, cache, loadbalance,
// errors, and health and ready for the probes. There is no forward plugin:
// the cluster resolves its own names only and sends no query off the host.
//
// CoreDNS's own main imports every plugin through a generated list
// (core/plugin); this one imports six and keeps CoreDNS's order for them
// (dnsserver.Directives, the order the plugins run in).
package main

import (
	"fmt"
	"os"
	"slices"

	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/ready"
)

// plugins are the directives compiled in.
var plugins = []string{"errors", "health", "ready", "kubernetes", "cache", "loadbalance"}

func main() {
	var order []string
	for _, d := range dnsserver.Directives {
		if slices.Contains(plugins, d) {
			order = append(order, d)
		}
	}
	if len(order) != len(plugins) {
		fmt.Fprintf(os.Stderr, "coredns: CoreDNS knows only %v of %v\n", order, plugins)
		os.Exit(1)
	}
	dnsserver.Directives = order
	coremain.Run()
}
