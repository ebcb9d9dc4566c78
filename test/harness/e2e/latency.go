package e2e

import (
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// LatencyProxy is a TCP proxy in front of a server (kube-apiserver, TLS
// and all pass through untouched) that holds every byte a client sends for
// a delay before passing it on, in order: each request then reaches the
// server that much later, as with a server slow to answer, while what the
// server sends (answers, watch events) flows at once. The delay of each
// chunk is drawn between Min and Max, never letting a chunk overtake the
// one before it. Zero delays pass bytes on at once.
type LatencyProxy struct {
	lis     net.Listener
	backend string
	min     atomic.Int64 // nanoseconds
	max     atomic.Int64
	mu      sync.Mutex
	conns   map[net.Conn]bool
	closed  bool
}

// NewLatencyProxy listens on 127.0.0.1 and forwards to backend
// (host:port).
func NewLatencyProxy(backend string) (*LatencyProxy, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &LatencyProxy{lis: lis, backend: backend, conns: map[net.Conn]bool{}}
	go p.serve()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *LatencyProxy) Addr() string { return p.lis.Addr().String() }

// SetDelay makes every chunk sent from now on wait between min and max.
func (p *LatencyProxy) SetDelay(min, max time.Duration) {
	p.min.Store(int64(min))
	p.max.Store(int64(max))
}

func (p *LatencyProxy) delay() time.Duration {
	lo, hi := p.min.Load(), p.max.Load()
	if hi <= lo {
		return time.Duration(lo)
	}
	return time.Duration(lo + rand.Int64N(hi-lo))
}

// Close stops listening and closes every connection.
func (p *LatencyProxy) Close() {
	p.lis.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
}

func (p *LatencyProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.conns[c] = true
	return true
}

func (p *LatencyProxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
	c.Close()
}

func (p *LatencyProxy) serve() {
	for {
		c, err := p.lis.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		go p.handle(c)
	}
}

// chunk is what a client sent, due at the server at due.
type chunk struct {
	b   []byte
	due time.Time
}

func (p *LatencyProxy) handle(c net.Conn) {
	if !p.track(c) {
		return
	}
	defer p.untrack(c)
	s, err := net.Dial("tcp", p.backend)
	if err != nil {
		return
	}
	if !p.track(s) {
		return
	}
	defer p.untrack(s)
	done := make(chan struct{}, 2)
	quit := make(chan struct{})
	defer close(quit)
	// Server to client: at once.
	go func() {
		_, _ = io.Copy(c, s)
		done <- struct{}{}
	}()
	// Client to server: through the delay line.
	line := make(chan chunk, 4096)
	go func() {
		defer close(line)
		var last time.Time
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				due := time.Now().Add(p.delay())
				if due.Before(last) {
					due = last
				}
				last = due
				select {
				case line <- chunk{b: append([]byte(nil), buf[:n]...), due: due}:
				case <-quit:
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	go func() {
		defer func() { done <- struct{}{} }()
		for ch := range line {
			if d := time.Until(ch.due); d > 0 {
				select {
				case <-time.After(d):
				case <-quit:
					return
				}
			}
			if _, err := s.Write(ch.b); err != nil {
				return
			}
		}
	}()
	<-done
}
