package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/volplane/volplane/gateway"
)

// A bounded REST fuzz against the real services: thousands of malformed
// requests to every route, with an operator's credential, get no server
// error, only JSON errors, and leave the gateway as it was (serving, and
// with no goroutine left behind).
func TestGatewayRESTFuzz(t *testing.T) {
	n := ns(t)
	roles := clusterRoles(t, "roles.yaml")
	applyClusterRole(t, roles["volplane-operator"])
	applyClusterRole(t, clusterRoles(t, "rbac.yaml")["volplane-gateway"])
	operator := serviceAccountToken(t, n, "operator")
	serviceAccountToken(t, n, "gateway")
	bind(t, n+"-operator", "volplane-operator", rbacv1.Subject{Kind: "ServiceAccount", Name: "operator", Namespace: n})
	bind(t, n+"-gateway", "volplane-gateway", rbacv1.Subject{Kind: "ServiceAccount", Name: "gateway", Namespace: n})
	// One operator sends thousands of requests: the per-user limits of
	// the expensive routes are lifted so that they reach the services, as
	// they did before there were limits (429 would be a fine answer, but
	// would leave the services' decoding untested).
	g := startAuthGateway(t, n+"/gateway", "", func(o *gateway.Options) {
		o.Expensive = gateway.ExpensiveOptions{RequestsPerSecond: 1e6, Burst: 1e6, MaxInFlightPerUser: 1000, MaxInFlight: 1000}
	})

	// Warm up (a connection to each backend, the caches), then count.
	for _, p := range []string{"/v1/claims", "/v1/watcher/status", "/v1/reclaims", "/v1/drivers"} {
		if code, body := g.call(t, nil, "GET", p, operator, ""); code != http.StatusOK && code != http.StatusNotFound {
			t.Fatalf("warm-up %s: %d %s", p, code, body)
		}
	}
	g.client.CloseIdleConnections()
	start := runtime.NumGoroutine()

	names := []string{"fz-" + n[len(n)-5:], "UPPER", "under_score", "ñame", "%ff%fe", "a%00b", "..", "%2e%2e", "a%2Fb", "a%20b",
		strings.Repeat("x", 300), "😀", "-lead", "trail-", "a..b", "%c3%28", "%0d%0aX-Injected:%201", "*", "%25", "a:b"}
	templates := []string{
		"/v1/watch", "/v1/watcher/status", "/v1/claims", "/v1/namespaces/{ns}/claims", "/v1/namespaces/{ns}/claims/{name}",
		"/v1/volumes", "/v1/volumes/{name}", "/v1/namespaces/{ns}/claims/{name}:sync", "/v1/volumes/{name}:sync",
		"/v1/binder/status", "/v1/provisions", "/v1/volumes/{name}:deleteBacking", "/v1/drivers", "/v1/provisioner/operations",
		"/v1/reclaims", "/v1/reclaims/{name}", "/v1/reclaims/{name}:retry",
		"/v1/volumes/{name}:nope", "/v1/namespaces/{ns}", "/v2/claims", "/v1//claims", "/v1/claims/", "/v1/./claims",
	}
	queries := []string{"", "?pageSize=-1", "?pageSize=99999999999999999999", "?pageSize=abc", "?phase=%ff", "?pageToken=%00",
		"?namespace=" + n, "?state=STATE_BOGUS", "?volume=AAAA", "?a=1&a=2&" + strings.Repeat("k=v&", 200)}
	methods := []string{"GET", "GET", "POST", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"}
	big := strings.Repeat("A", 10<<20)
	bodies := []string{"", "{}", "{", "null", "[]", "5", `"str"`, `{"volumeName": 5}`, `{"volumeName": ["a"]}`,
		`{"claimNamespace": "x", "claimName": "y", "claimUid": -1}`, `{"claimName": 1e400}`, `{"volumeUid": 18446744073709551616}`,
		`{"volume": "!!not base64!!"}`, `{"claim": "` + strings.Repeat("QUFB", 1000) + `"}`, "{\"volumeName\": \"\xff\xfe\"}",
		`{"unknownField": true}`, strings.Repeat("[", 10000) + strings.Repeat("]", 10000), `{"volumeName": "\u0000"}`}

	const total = 3000
	deadline := time.Now().Add(50 * time.Second)
	var sent, fails atomic.Int32
	statuses := sync.Map{}
	work := make(chan int)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				r := rand.New(rand.NewPCG(uint64(i), 1))
				pick := func(l []string) string { return l[r.IntN(len(l))] }
				path := strings.NewReplacer("{ns}", pick(names), "{name}", pick(names)).Replace(pick(templates)) + pick(queries)
				method, body := pick(methods), pick(bodies)
				if i%300 == 7 {
					// 10 MiB to a route that reads a body, or to one that
					// does not.
					method, body = "POST", big
					path = pick([]string{"/v1/provisions", "/v1/reclaims", "/v1/namespaces/" + n + "/claims/x:sync"})
				}
				req, err := http.NewRequest(method, g.url+path, strings.NewReader(body))
				if err != nil {
					continue // not a URL a client can send
				}
				req.Header.Set("Authorization", "Bearer "+operator)
				req.Header.Set("Content-Type", "application/json")
				if strings.HasPrefix(path, "/v1/watch") && method == "GET" {
					continue // a stream: not a single answer
				}
				sent.Add(1)
				resp, err := g.client.Do(req)
				if err != nil {
					if len(body) < 1<<20 {
						fails.Add(1)
						t.Errorf("%s %s: %v", method, path, err)
					}
					continue
				}
				b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
				resp.Body.Close()
				v, _ := statuses.LoadOrStore(resp.StatusCode, new(atomic.Int32))
				v.(*atomic.Int32).Add(1)
				if resp.StatusCode >= 500 {
					fails.Add(1)
					t.Errorf("%s %s (body %.60q): %d %s", method, path, body, resp.StatusCode, b)
				}
				var e struct {
					Code    *int
					Message string
				}
				if resp.StatusCode >= 400 && method != "HEAD" && (json.Unmarshal(b, &e) != nil || e.Code == nil || e.Message == "") {
					fails.Add(1)
					t.Errorf("%s %s: %d with a body that is not a JSON error: %.200q", method, path, resp.StatusCode, b)
				}
				if len(body) >= 10<<20 && resp.StatusCode != http.StatusRequestEntityTooLarge {
					t.Errorf("%s %s with a 10 MiB body: %d, want 413", method, path, resp.StatusCode)
				}
				if fails.Load() > 20 {
					return
				}
			}
		}()
	}
	for i := 0; i < total && time.Now().Before(deadline) && fails.Load() <= 20; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	var summary []string
	statuses.Range(func(k, v any) bool {
		summary = append(summary, fmt.Sprintf("%d×%d", k, v.(*atomic.Int32).Load()))
		return true
	})
	t.Logf("%d requests: %s", sent.Load(), strings.Join(summary, " "))
	if sent.Load() < 1000 {
		t.Errorf("only %d requests sent within the time bound", sent.Load())
	}

	// Still serving, and back to the goroutines it had.
	if code, body := g.call(t, nil, "GET", "/v1/claims", operator, ""); code != http.StatusOK {
		t.Fatalf("after the fuzz: %d %s", code, body)
	}
	g.client.CloseIdleConnections()
	eventually(t, 30*time.Second, func() string {
		if now := runtime.NumGoroutine(); now > start+5 {
			return fmt.Sprintf("%d goroutines, %d before the fuzz", now, start)
		}
		return ""
	})
}
