package coord_test

import (
	"context"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/connectivity"

	"github.com/volplane/volplane/pkg/coord"
)

// blackhole is a TCP proxy to etcd that can stop passing bytes without
// closing anything, as a member whose node lost its power: no answer, no
// RST.
type blackhole struct {
	ln     net.Listener
	target string
	dark   atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
}

func newBlackhole(t *testing.T, target string) *blackhole {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackhole{ln: ln, target: target}
	t.Cleanup(func() {
		ln.Close()
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, c := range b.conns {
			c.Close()
		}
	})
	go b.serve()
	return b
}

func (b *blackhole) serve() {
	for {
		in, err := b.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", b.target)
		if err != nil {
			in.Close()
			continue
		}
		b.mu.Lock()
		b.conns = append(b.conns, in, out)
		b.mu.Unlock()
		go b.pipe(in, out)
		go b.pipe(out, in)
	}
}

// pipe copies src to dst while the proxy is lit; dark, it reads and drops.
func (b *blackhole) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !b.dark.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				return
			}
			return
		}
	}
}

// A member that stops answering without closing its connection (its node
// powered off) is found dead by the client's pings: the connection leaves
// READY within KeepAliveTime+KeepAliveTimeout (and some slack), where
// without pings it would stay READY, every request and watch on it
// hanging. Once the member answers again, requests go through.
func TestAConnectionToASilentMemberIsFoundDead(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the client's keep-alive pings")
	}
	u, err := url.Parse(endpoints[0])
	if err != nil {
		t.Fatal(err)
	}
	b := newBlackhole(t, u.Host)
	c, err := coord.New(t.Context(), coord.Options{Endpoints: []string{"http://" + b.ln.Addr().String()}, Prefix: "/blackhole", TTL: time.Minute, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cli := c.Client()
	if _, err := cli.Get(t.Context(), "/blackhole/x"); err != nil {
		t.Fatal(err)
	}
	conn := cli.ActiveConnection()
	if s := conn.GetState(); s != connectivity.Ready {
		t.Fatalf("connection %s before the blackhole, want READY", s)
	}
	b.dark.Store(true)
	began := time.Now()
	bound := coord.KeepAliveTime + coord.KeepAliveTimeout + 10*time.Second
	ctx, cancel := context.WithTimeout(t.Context(), bound)
	defer cancel()
	for s := conn.GetState(); s == connectivity.Ready; s = conn.GetState() {
		if !conn.WaitForStateChange(ctx, s) {
			t.Fatalf("the connection to a member that answers nothing is still READY after %v: no keep-alive found it dead", bound)
		}
	}
	t.Logf("the connection left READY %v after the member went silent (now %s)", time.Since(began).Round(time.Second), conn.GetState())
	b.dark.Store(false)
	gctx, gcancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer gcancel()
	if _, err := cli.Get(gctx, "/blackhole/x"); err != nil {
		t.Fatalf("a request once the member answers again: %v", err)
	}
}
