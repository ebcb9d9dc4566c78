package gateway

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// FuzzRequest sends arbitrary requests, as a client could put them on the
// wire, through the whole gateway (authentication, routing, validation,
// authorization, decoding) to a backend that answers NotFound: the answer
// is never a server error, and every error is the JSON the README
// promises.
func FuzzRequest(f *testing.F) {
	for _, rt := range routes {
		f.Add(rt.Method, concrete(rt.Path), "{}")
	}
	for _, s := range [][3]string{
		{"GET", "/v1/namespaces/%ff/claims/x", ""},
		{"GET", "/v1/namespaces/team/claims/a%00b", ""},
		{"GET", "/v1/claims?pageSize=-1&phase=%c3%28", ""},
		{"GET", "/v1/claims?pageSize=1e99", ""},
		{"POST", "/v1/provisions", `{"claimName": 5, "claim": "%%%"}`},
		{"POST", "/v1/provisions", `{"claimNamespace": "\ud800", "claimUid": 9223372036854775808}`},
		{"POST", "/v1/reclaims", `[1,2,3]`},
		{"POST", "/v1/reclaims", `{"volumeName": null, "volume": "not base64!"}`},
		{"POST", "/v1/volumes/..%2f..%2fetc:deleteBacking", "{}"},
		{"DELETE", "/v1/volumes/x", ""},
		{"PATCH", "/v1/watch", ""},
		{"GET", "/v1/volumes/x:deleteBacking", ""},
		{"POST", "/v1/namespaces/team/claims/c:sync?volume=AAAA", `{"x":`},
		{"GET", "//v1//claims", ""},
		{"GET", "/v1/reclaims/" + strings.Repeat("x", 5000), ""},
	} {
		f.Add(s[0], s[1], s[2])
	}
	g := startGateway(f, func(o *Options) { o.HTTP.MaxRequestBytes = 4096 })
	f.Fuzz(func(t *testing.T, method, target, body string) {
		raw := fmt.Sprintf("%s %s HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer operator-token\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
			method, target, len(body), body)
		req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw)))
		if err != nil {
			return // net/http refuses it before any handler
		}
		req.RemoteAddr = "127.0.0.1:1"
		if strings.HasPrefix(req.URL.Path, "/v1/watch") && req.Method == http.MethodGet {
			return // a stream; FuzzRequest covers single answers
		}
		rec := httptest.NewRecorder()
		g.handler.ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("%q %q %q: %d %s", method, target, body, rec.Code, rec.Body.String())
		}
		if rec.Code >= 400 {
			var e struct {
				Code    *int
				Message string
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Code == nil || e.Message == "" {
				t.Fatalf("%q %q: %d with a body that is not a JSON error: %q", method, target, rec.Code, rec.Body.String())
			}
		}
		g.backend.take()
	})
}

// FuzzValidateParams: whatever a path parameter holds, validation answers
// without panicking, and what it accepts is a name Kubernetes accepts.
func FuzzValidateParams(f *testing.F) {
	for _, s := range []string{"team", "vol-1", "a.b", "", "-a", "A", "a/b", "..", "a\x00", strings.Repeat("a", 254), "\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for key := range pathParams {
			err := validateParams(map[string]string{key: s})
			if err == nil && (s == "" || strings.ContainsAny(s, "/%:\x00 ") || len(s) > 253) {
				t.Fatalf("%s %q accepted", key, s)
			}
		}
		for _, rt := range routes {
			rt.matchPath("/" + s)
		}
	})
}

// The shipped ClusterRoles grant what the table asks: the operator every
// route, the viewer every read and no write.
func TestRolesGrantTheTable(t *testing.T) {
	f, err := os.Open("../deploy/kubernetes/roles.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	roles := map[string]rbacv1.ClusterRole{}
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	for {
		var cr rbacv1.ClusterRole
		if err := dec.Decode(&cr); err != nil {
			break
		}
		if cr.Kind == "ClusterRole" {
			roles[cr.Name] = cr
		}
	}
	grants := func(role string, rt route) bool {
		res := rt.Resource
		if rt.Subresource != "" {
			res += "/" + rt.Subresource
		}
		for _, r := range roles[role].Rules {
			if contains(r.APIGroups, "volplane.io") && contains(r.Resources, res) && contains(r.Verbs, rt.Verb) {
				return true
			}
		}
		return false
	}
	if len(roles) != 2 {
		t.Fatalf("roles.yaml: %d ClusterRoles, want volplane-viewer and volplane-operator", len(roles))
	}
	for _, rt := range routes {
		if !grants("volplane-operator", rt) {
			t.Errorf("volplane-operator cannot %s %s", rt.Method, rt.Path)
		}
		if grants("volplane-viewer", rt) == rt.write() {
			t.Errorf("volplane-viewer and %s %s: granted=%v", rt.Method, rt.Path, !rt.write())
		}
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
