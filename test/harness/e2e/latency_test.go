package e2e

import (
	"bufio"
	"net"
	"testing"
	"time"
)

// Every line sent through the proxy reaches the server only after the
// delay, in order; the server's answers come back at once.
func TestLatencyProxy(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	p, err := NewLatencyProxy(lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	echo := func(s string) time.Duration {
		t.Helper()
		start := time.Now()
		if _, err := c.Write([]byte(s + "\n")); err != nil {
			t.Fatal(err)
		}
		got, err := r.ReadString('\n')
		if err != nil || got != s+"\n" {
			t.Fatalf("echo %q: %q, %v", s, got, err)
		}
		return time.Since(start)
	}
	if d := echo("fast"); d > time.Second {
		t.Fatalf("no delay set, the echo took %s", d)
	}
	p.SetDelay(200*time.Millisecond, 300*time.Millisecond)
	for _, s := range []string{"a", "b", "c"} {
		if d := echo(s); d < 200*time.Millisecond {
			t.Fatalf("echo %q took %s, less than the delay", s, d)
		}
	}
	p.SetDelay(0, 0)
	if d := echo("fast again"); d > time.Second {
		t.Fatalf("delay removed, the echo took %s", d)
	}
}
