package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/volplane/volplane/gateway"
	"github.com/volplane/volplane/test/harness/devenv"
)

// pathologicalClaims are :match bodies a viewer might send to make the API
// server (or volplane) work: quantities whose parsing, comparison or
// printing takes minutes, sizes beyond an int64, bodies too deep or too
// wide.
func pathologicalClaims() []struct{ name, ctype, body string } {
	claim := func(spec string) string {
		return `{"metadata":{"name":"abuse"},"spec":{"accessModes":["ReadWriteOnce"],` + spec + `}}`
	}
	storage := func(q string) string {
		return claim(`"resources":{"requests":{"storage":` + q + `}}`)
	}
	var laughs strings.Builder
	laughs.WriteString(`a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]` + "\n")
	for c := 'b'; c <= 'i'; c++ {
		p := string(c - 1)
		fmt.Fprintf(&laughs, "%c: &%c [*%s,*%s,*%s,*%s,*%s,*%s,*%s,*%s,*%s,*%s]\n", c, c, p, p, p, p, p, p, p, p, p, p)
	}
	return []struct{ name, ctype, body string }{
		{"huge exponent", "application/json", storage(`"1E+999999999"`)},
		{"huge negative exponent", "application/json", storage(`"1E-999999999"`)},
		{"long mantissa, huge exponent", "application/json", storage(`"1234567890123456789E+999999999"`)},
		{"huge exponent, YAML", "application/yaml", "metadata: {name: abuse}\nspec:\n  accessModes: [ReadWriteOnce]\n  resources: {requests: {storage: 1E+999999999}}\n"},
		{"huge limit", "application/json", claim(`"resources":{"requests":{"storage":"1Gi"},"limits":{"storage":"9e999999999"}}`)},
		{"huge status", "application/json", `{"metadata":{"name":"abuse"},"status":{"capacity":{"storage":"1e-999999999"}},"spec":{"accessModes":["ReadWriteOnce"],"resources":{"requests":{"storage":"1Gi"}}}}`},
		{"beyond an int64", "application/json", storage(`"100E"`)},
		{"ten thousand digits", "application/json", storage(`"` + strings.Repeat("9", 10000) + `"`)},
		{"deep", "application/json", `{"metadata":{"name":"abuse"},"spec":` + strings.Repeat(`{"a":`, 5000) + "1" + strings.Repeat("}", 5000) + `}`},
		{"billion laughs", "application/yaml", laughs.String()},
	}
}

// A viewer sending :match 100 pathological claims through the gateway,
// ten at a time, gets 400 for each at once, and the API server's CPU time
// and memory stay where they were: nothing absurd reaches it (the binder
// checks the claim as the API server would before its dry run, the
// gateway the body's shape). The gateway's per-user limits are lifted for
// this: what protects the API server here is the validation alone. With
// the default limits, the same viewer is throttled: 429 and Retry-After.
func TestPathologicalMatchesLeaveTheAPIServerAlone(t *testing.T) {
	n := ns(t)
	g := matchGateway(t, n, func(o *gateway.Options) {
		o.Expensive = gateway.ExpensiveOptions{RequestsPerSecond: 1e6, Burst: 1e6, MaxInFlightPerUser: 1000, MaxInFlight: 1000}
	})
	path := "/v1/namespaces/" + n + "/claims:match"
	// A valid claim is matched as before, and warms every cache (token
	// review, access review, connections) before the measurement.
	valid := `{"metadata":{"name":"fine"},"spec":{"accessModes":["ReadWriteOnce"],"resources":{"requests":{"storage":"1Gi"}}}}`
	if code, body := g.callType(t, "POST", path, g.viewer, valid, "application/json"); code != http.StatusOK {
		t.Fatalf("a valid claim: %d %s", code, body)
	}

	pid := cluster.env.APIServerPID()
	if pid == 0 {
		t.Fatal("no kube-apiserver process")
	}
	rss0, cpu0, err := devenv.PIDUsage(pid)
	if err != nil {
		t.Fatal(err)
	}
	claims := pathologicalClaims()
	var (
		mu      sync.Mutex
		slowest time.Duration
		wg      sync.WaitGroup
		next    = make(chan int)
	)
	start := time.Now()
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				c := claims[i%len(claims)]
				t0 := time.Now()
				r, err := g.send(t, path, g.viewer, c.body, c.ctype)
				took := time.Since(t0)
				if err != nil {
					t.Errorf("%s (request %d): %v", c.name, i, err)
					continue
				}
				code, msg := r.code, r.message
				mu.Lock()
				slowest = max(slowest, took)
				mu.Unlock()
				if code != http.StatusBadRequest {
					t.Errorf("%s (request %d): %d %.300s, want 400", c.name, i, code, msg)
				}
				if took > 3*time.Second {
					t.Errorf("%s (request %d) took %v", c.name, i, took)
				}
			}
		}()
	}
	for i := range 100 {
		next <- i
	}
	close(next)
	wg.Wait()
	sent := time.Since(start)
	// Whatever the API server would still be doing (post-timeout
	// activity, the upstream bug) shows within seconds.
	time.Sleep(10 * time.Second)
	rss1, cpu1, err := devenv.PIDUsage(pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("100 pathological matches in %v (slowest %v); kube-apiserver: CPU %v -> %v (+%v), RSS %d MiB -> %d MiB",
		sent.Round(time.Millisecond), slowest.Round(time.Millisecond), cpu0, cpu1, cpu1-cpu0, rss0>>20, rss1>>20)
	if d := cpu1 - cpu0; d > 2*time.Second {
		t.Errorf("kube-apiserver used %v of CPU meanwhile, want under 2s", d)
	}
	if d := rss1 - rss0; d > 100<<20 {
		t.Errorf("kube-apiserver grew by %d MiB, want under 100", d>>20)
	}

	t.Run("throttled with the default limits", func(t *testing.T) {
		g := matchGateway(t, ns(t))
		var throttled int
		for i := range 40 {
			c := claims[i%len(claims)]
			resp, err := g.send(t, path, g.viewer, c.body, c.ctype)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case resp.code == http.StatusTooManyRequests:
				throttled++
				if resp.retryAfter == "" {
					t.Errorf("429 without Retry-After")
				}
			case resp.code != http.StatusBadRequest:
				t.Errorf("%s: %d, want 400 or 429", c.name, resp.code)
			}
		}
		if throttled == 0 {
			t.Fatalf("40 matches at once and none throttled")
		}
	})
}

type postResult struct {
	code       int
	message    string
	retryAfter string
}

// send posts a body and returns the status, the JSON error's message and
// Retry-After. It does not fail the test: goroutines may call it.
func (g *authGateway) send(t *testing.T, path, token, body, ctype string) (postResult, error) {
	req, err := http.NewRequestWithContext(t.Context(), "POST", g.url+path, strings.NewReader(body))
	if err != nil {
		return postResult{}, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", ctype)
	resp, err := g.client.Do(req)
	if err != nil {
		return postResult{}, err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var e struct{ Message string }
	msg := string(raw)
	if json.Unmarshal(raw, &e) == nil && e.Message != "" {
		msg = e.Message
	}
	return postResult{code: resp.StatusCode, message: msg, retryAfter: resp.Header.Get("Retry-After")}, nil
}
