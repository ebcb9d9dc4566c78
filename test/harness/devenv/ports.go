package devenv

import (
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
)

// Ports for test servers are picked below the kernel's ephemeral range
// (32768-60999 by default), so that neither an outgoing connection's source
// port nor another process's bind to port 0 can take one between the moment
// it is picked and the moment its server binds it. A port is never handed out
// twice by one process: two services of one test once both got 41331, and
// the binder dialled the reclaimer as its watcher.
const (
	portLow  = 20000
	portHigh = 32767
)

var (
	portsMu   sync.Mutex
	portsUsed = map[int]bool{}
)

// pickPort returns a loopback port that nobody listens on right now and that
// this process has not handed out before.
func pickPort() (int, error) {
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 200 {
		p := portLow + rand.IntN(portHigh-portLow+1)
		if portsUsed[p] {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue // taken by someone else
		}
		l.Close()
		portsUsed[p] = true
		return p, nil
	}
	return 0, fmt.Errorf("find a free port: no free loopback port in %d-%d after 200 tries", portLow, portHigh)
}

// FreeAddr returns a loopback host:port nobody listens on right now and that
// this process has not handed out before.
func FreeAddr() (string, error) {
	p, err := pickPort()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p)), nil
}

func freePort() (int, error) { return pickPort() }
