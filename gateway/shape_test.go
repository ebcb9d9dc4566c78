package gateway

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// oversized are bodies whose shape exceeds one of the default limits
// (ShapeOptions), each with the flag its 400 must name. Each is small
// enough for --max-request-bytes: the shape, not the size, is refused.
func oversized() []struct{ name, ctype, body, flag string } {
	deep := func(n int) string { return strings.Repeat(`{"a":`, n) + "1" + strings.Repeat("}", n) }
	var wide, wideYAML, wideArray strings.Builder
	wide.WriteString("{")
	for i := range 20000 {
		if i > 0 {
			wide.WriteString(",")
		}
		fmt.Fprintf(&wide, `"k%d":0`, i)
		fmt.Fprintf(&wideYAML, "k%d: 0\n", i)
	}
	wide.WriteString("}")
	wideArray.WriteString(`{"a":[0`)
	wideArray.WriteString(strings.Repeat(",0", 20000))
	wideArray.WriteString("]}")
	// The billion laughs: nine levels of ten aliases, 10^9 strings once
	// expanded, in under a kilobyte.
	var laughs strings.Builder
	laughs.WriteString(`a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]` + "\n")
	for c := 'b'; c <= 'i'; c++ {
		p := string(c - 1)
		fmt.Fprintf(&laughs, "%c: &%c [*%s,*%s,*%s,*%s,*%s,*%s,*%s,*%s,*%s,*%s]\n", c, c, p, p, p, p, p, p, p, p, p, p)
	}
	// Fewer levels: a mere 100,000 strings, which YAML decoders let through.
	var chuckles strings.Builder
	chuckles.WriteString(`a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]` + "\n")
	for c := 'b'; c <= 'e'; c++ {
		p := string(c - 1)
		fmt.Fprintf(&chuckles, "%c: &%c [*%s,*%s,*%s,*%s,*%s,*%s,*%s,*%s,*%s,*%s]\n", c, c, p, p, p, p, p, p, p, p, p, p)
	}
	// Aliases nest too: each level holds the one below twice.
	var deepAlias strings.Builder
	deepAlias.WriteString("l0: &l0 1\n")
	for i := 1; i <= 200; i++ {
		fmt.Fprintf(&deepAlias, "l%d: &l%d [*l%d]\n", i, i, i-1)
	}
	return []struct{ name, ctype, body, flag string }{
		{"deep JSON, 5000 levels", "application/json", deep(5000), "--max-request-depth"},
		{"deep JSON, just over the limit", "application/json", deep(DefaultMaxRequestDepth + 1), "--max-request-depth"},
		{"deep JSON arrays", "application/json", `{"a":` + strings.Repeat("[", 5000) + strings.Repeat("]", 5000) + "}", "--max-request-depth"},
		{"wide object", "application/json", wide.String(), "--max-request-elements"},
		{"wide array", "application/json", wideArray.String(), "--max-request-elements"},
		{"long string", "application/json", `{"a":"` + strings.Repeat("x", DefaultMaxRequestStringBytes+1) + `"}`, "--max-request-string-bytes"},
		{"long string of two-byte characters", "application/json", `{"a":"` + strings.Repeat("é", DefaultMaxRequestStringBytes/2+1) + `"}`, "--max-request-string-bytes"},
		{"long key", "application/json", `{"` + strings.Repeat("k", DefaultMaxRequestKeyBytes+1) + `":1}`, "--max-request-key-bytes"},
		{"deep YAML, flow", "application/yaml", "a: " + strings.Repeat("[", 5000) + strings.Repeat("]", 5000) + "\n", "--max-request-depth"},
		{"deep YAML, block", "application/yaml", deepBlockYAML(DefaultMaxRequestDepth + 5), "--max-request-depth"},
		{"wide YAML", "application/x-yaml", wideYAML.String(), "--max-request-elements"},
		{"long YAML string", "application/yaml", "a: " + strings.Repeat("x", DefaultMaxRequestStringBytes+1) + "\n", "--max-request-string-bytes"},
		// An explicit key: YAML allows implicit ones up to 1024 characters.
		{"long YAML key", "application/yaml", "? " + strings.Repeat("k", DefaultMaxRequestKeyBytes+1) + "\n: 1\n", "--max-request-key-bytes"},
		{"YAML billion laughs", "application/yaml", laughs.String(), "--max-request-elements"},
		{"YAML hundred thousand laughs", "application/yaml", chuckles.String(), "--max-request-elements"},
		{"YAML aliases nesting deep", "application/yaml", deepAlias.String(), "--max-request-depth"},
	}
}

func deepBlockYAML(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString(strings.Repeat(" ", i) + "a:\n")
	}
	b.WriteString(strings.Repeat(" ", n) + "b: 1\n")
	return b.String()
}

// Every route that takes a body (http.yaml's "body:") refuses each kind of
// oversized body with 400 naming the limit it exceeds, quickly, without
// calling its service: never a 5xx.
func TestOversizedBodiesAreRefused(t *testing.T) {
	// Shapes, not rates, are tested here: the limiter lets everything in.
	g := startGateway(t, func(o *Options) { o.Expensive = ExpensiveOptions{RequestsPerSecond: 1e6, Burst: 1e6} })
	var bodyRoutes [][4]string
	for _, r := range httpRules(t) {
		if r[3] != "" {
			bodyRoutes = append(bodyRoutes, r)
		}
	}
	if len(bodyRoutes) < 5 {
		t.Fatalf("http.yaml has %d routes with a body, want at least 5", len(bodyRoutes))
	}
	for _, r := range bodyRoutes {
		for _, tc := range oversized() {
			t.Run(r[0]+" "+r[1]+"/"+tc.name, func(t *testing.T) {
				g.backend.take()
				start := time.Now()
				resp, e := g.do(t, r[0], concrete(r[1]), "operator-token", strings.NewReader(tc.body), "Content-Type", tc.ctype)
				took := time.Since(start)
				if resp.StatusCode != http.StatusBadRequest || !strings.Contains(e.Message, tc.flag) {
					t.Fatalf("%s %+v, want 400 naming %s", resp.Status, e, tc.flag)
				}
				if calls := g.backend.take(); len(calls) != 0 {
					t.Errorf("the body reached the service: %+v", calls)
				}
				if took > 2*time.Second {
					t.Errorf("took %v", took)
				}
			})
		}
	}
}

// A body just within every limit passes (as the limits' documentation
// says, they are inclusive).
func TestBodiesWithinTheLimitsPass(t *testing.T) {
	g := startGateway(t, nil)
	deep := strings.Repeat(`{"a":`, DefaultMaxRequestDepth-1) + "1" + strings.Repeat("}", DefaultMaxRequestDepth-1)
	for _, tc := range []struct{ name, ctype, body string }{
		{"deep", "application/json", deep},
		{"long string", "application/json", `{"a":"` + strings.Repeat("x", DefaultMaxRequestStringBytes) + `"}`},
		{"long key", "application/json", `{"` + strings.Repeat("k", DefaultMaxRequestKeyBytes) + `":1}`},
		{"deep YAML", "application/yaml", deepBlockYAML(DefaultMaxRequestDepth - 1)},
		{"a few aliases", "application/yaml", "a: &a [1, 2, 3]\nb: [*a, *a]\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, e := g.do(t, "POST", "/v1/claims:match", "viewer-token", strings.NewReader(tc.body), "Content-Type", tc.ctype)
			if resp.StatusCode != http.StatusNotFound || !strings.Contains(e.Message, "fake backend") {
				t.Fatalf("%s %+v, want the backend's 404", resp.Status, e)
			}
		})
	}
}
