package gateway

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/volplane/volplane/pkg/grpcutil"
	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

// /v1/watch streams past the write and read timeouts that bound every
// other response.
func TestWatchOutlivesTheWriteTimeout(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnknownServiceHandler(func(_ any, stream grpc.ServerStream) error {
		for i := range 8 {
			if err := stream.SendMsg(&watcherv1.WatchResponse{}); err != nil {
				return err
			}
			if i < 7 {
				select {
				case <-time.After(100 * time.Millisecond):
				case <-stream.Context().Done():
					return nil
				}
			}
		}
		return nil
	}))
	go srv.Serve(lis)
	defer srv.Stop()

	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := gl.Addr().String()
	gl.Close()
	c := newFakeCluster()
	o := Options{Listen: addr, BinderAddress: lis.Addr().String(), WatcherAddress: lis.Addr().String(),
		TLS: grpcutil.TLSFiles{InsecurePlaintext: true}, Logger: discard(), Auth: AuthOptions{Client: c.cs},
		HTTP: HTTPOptions{WriteTimeout: 300 * time.Millisecond, ReadTimeout: 300 * time.Millisecond}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, o) }()
	defer func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Run: %v", err)
		}
	}()
	var resp *http.Response
	for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		req, _ := http.NewRequest("GET", "http://"+addr+"/v1/watch", nil)
		req.Header.Set("Authorization", "Bearer viewer-token")
		if resp, err = http.DefaultClient.Do(req); err == nil {
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatal(err)
		}
	}
	defer resp.Body.Close()
	lines := 0
	for sc := bufio.NewScanner(resp.Body); sc.Scan(); {
		lines++
	}
	// 8 messages over 700ms, more than twice the timeouts.
	if resp.StatusCode != http.StatusOK || lines != 8 {
		t.Fatalf("watch: %s, %d of 8 events", resp.Status, lines)
	}
}
