package cluster

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNodeAddressing sources lib.sh as up.sh does with NODES=4 and checks
// each node's name, address, zone and pod range: distinct, the addresses
// on the bridge's network, the zones cycling through three.
func TestNodeAddressing(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	cmd := exec.Command("bash", "-c", `source ./lib.sh; multi_node && echo multi; echo "$node_net $node_gateway"
		for i in 1 2 3 4; do echo "$(node_name_of $i) $(node_ip_of $i) $(node_zone_of $i) $(node_pod_cidr_of $i)"; done`)
	cmd.Env = append(cmd.Environ(), "VOLPLANE_CLUSTER_NODES=4")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	want := `multi
10.250.0.0/24 10.250.0.1
volplane-node-1 10.250.0.11 zone-a 10.244.1.0/24
volplane-node-2 10.250.0.12 zone-b 10.244.2.0/24
volplane-node-3 10.250.0.13 zone-c 10.244.3.0/24
volplane-node-4 10.250.0.14 zone-a 10.244.4.0/24
`
	if string(out) != want {
		t.Errorf("got:\n%s\nwant:\n%s", out, want)
	}
}

// TestNodesRefused checks that a NODES that is not a node count stops
// every script at once, and that the default is the single node.
func TestNodesRefused(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	for _, n := range []string{"0", "abc", "-1", "3x", "100", ""} {
		cmd := exec.Command("bash", "-c", `source ./lib.sh; multi_node && echo multi || echo single`)
		cmd.Env = append(cmd.Environ(), "VOLPLANE_CLUSTER_NODES="+n)
		out, err := cmd.CombinedOutput()
		if n == "" {
			if err != nil || strings.TrimSpace(string(out)) != "single" {
				t.Errorf("NODES unset: %q %v, want single", out, err)
			}
			continue
		}
		if err == nil || !strings.Contains(string(out), "want a number from 1 to 99") {
			t.Errorf("NODES=%q: %q %v, want refused", n, out, err)
		}
	}
}
