package devenv

import (
	"net"
	"strconv"
	"testing"
)

// TestFreeAddrNeverRepeats asks for many ports and checks that none comes
// back twice and none lies in the kernel's ephemeral range, where an
// outgoing connection could take it before its server binds it.
func TestFreeAddrNeverRepeats(t *testing.T) {
	seen := map[string]bool{}
	for range 500 {
		addr, err := FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		if seen[addr] {
			t.Fatalf("FreeAddr returned %s twice", addr)
		}
		seen[addr] = true
		_, ps, _ := net.SplitHostPort(addr)
		if p, _ := strconv.Atoi(ps); p < portLow || p > portHigh {
			t.Fatalf("FreeAddr returned %s, outside %d-%d", addr, portLow, portHigh)
		}
	}
}

// TestFreeAddrSkipsABoundPort holds a port of the range and checks that it is
// never handed out while held.
func TestFreeAddrSkipsABoundPort(t *testing.T) {
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	bound := map[string]bool{}
	for p := portLow; p < portLow+2000; p++ {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
		if l, err := net.Listen("tcp", addr); err == nil {
			held = append(held, l)
			bound[addr] = true
		}
	}
	for range 300 {
		addr, err := FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		if bound[addr] {
			t.Fatalf("FreeAddr returned %s, which a listener holds", addr)
		}
	}
}
