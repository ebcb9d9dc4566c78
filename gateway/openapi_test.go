package gateway

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
)

// projectVersion is the project's version: the VERSION file when there is
// one, else the Makefile's VERSION (the images' tag).
func projectVersion(t *testing.T) string {
	t.Helper()
	if b, err := os.ReadFile("../VERSION"); err == nil {
		return strings.TrimSpace(string(b))
	}
	b, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^VERSION\s*\?=\s*(\S+)\s*$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("the Makefile sets no VERSION")
	}
	return string(m[1])
}

// The OpenAPI document the gateway serves (generated with
// proto/volplane/openapi.yaml) has a real title and the project's version,
// and declares how to authenticate, so that a client generated from it
// can: a bearer token in the Authorization header, required of every
// operation, and mutual TLS, which Swagger 2.0 cannot declare, in an x-
// extension. The declared scheme is then used as a generated client would
// use it, and the gateway accepts it.
func TestOpenAPIDocument(t *testing.T) {
	g := startGateway(t, nil)
	resp, err := http.Get(g.url + "/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET /openapi.json: %s %q", resp.Status, resp.Header.Get("Content-Type"))
	}
	type scheme struct {
		Type, In, Name, Description string
	}
	var doc struct {
		Swagger string
		Info    struct {
			Title, Version, Description string
		}
		Schemes             []string
		SecurityDefinitions map[string]scheme
		Security            []map[string][]string
		ClientCertificate   *scheme `json:"x-volplane-client-certificate"`
		Paths               map[string]map[string]struct {
			Security  *[]map[string][]string
			Responses map[string]any
		}
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatal(err)
	}

	if doc.Swagger != "2.0" {
		t.Errorf("swagger %q", doc.Swagger)
	}
	if doc.Info.Title != "volplane API" {
		t.Errorf("title %q, want %q", doc.Info.Title, "volplane API")
	}
	if v := projectVersion(t); doc.Info.Version != v {
		t.Errorf("version %q, want the project's %q (proto/volplane/openapi.yaml, then make generate)", doc.Info.Version, v)
	}
	for _, s := range []string{"Authorization: Bearer", "client certificate", "--client-ca-file", "SubjectAccessReview"} {
		if !strings.Contains(doc.Info.Description, s) {
			t.Errorf("info.description does not say %q", s)
		}
	}
	if !strings.Contains(strings.Join(doc.Schemes, ","), "https") {
		t.Errorf("schemes %v without https", doc.Schemes)
	}

	bearer, ok := doc.SecurityDefinitions["BearerToken"]
	if want := (scheme{Type: "apiKey", In: "header", Name: "Authorization"}); !ok || bearer.Type != want.Type || bearer.In != want.In || bearer.Name != want.Name {
		t.Errorf("securityDefinitions.BearerToken = %+v, want %+v", bearer, want)
	}
	if !strings.HasPrefix(bearer.Description, `"Bearer " followed by a token`) {
		t.Errorf("BearerToken does not say what the header holds: %q", bearer.Description)
	}
	if len(doc.Security) != 1 || len(doc.Security[0]) != 1 || doc.Security[0]["BearerToken"] == nil {
		t.Errorf("global security %v, want [{BearerToken: []}]", doc.Security)
	}
	if c := doc.ClientCertificate; c == nil || c.Type != "mutualTLS" || !strings.Contains(c.Description, "--client-ca-file") {
		t.Errorf("x-volplane-client-certificate = %+v, want a mutualTLS scheme naming --client-ca-file", c)
	}

	// No operation drops the global requirement, and each documents the
	// answers of the authentication and authorization in front of it.
	if len(doc.Paths) == 0 {
		t.Fatal("no paths")
	}
	for path, ops := range doc.Paths {
		for method, op := range ops {
			if op.Security != nil {
				t.Errorf("%s %s overrides the global security with %v", method, path, *op.Security)
			}
			for _, code := range []string{"401", "403", "503"} {
				if op.Responses[code] == nil {
					t.Errorf("%s %s documents no %s", method, path, code)
				}
			}
		}
	}

	// A client that follows the declaration gets through to the backend;
	// one that sends the token without the "Bearer " the description asks
	// for does not.
	if bearer.Name == "" {
		t.FailNow()
	}
	g.backend.take()
	g.do(t, "GET", "/v1/claims", "", nil, bearer.Name, "Bearer viewer-token")
	if calls := g.backend.take(); len(calls) != 1 || calls[0].method != "/volplane.binder.v1.BinderService/ListClaims" {
		t.Errorf("GET /v1/claims with %s: Bearer viewer-token reached the backend as %+v, want one ListClaims", bearer.Name, calls)
	}
	if resp, _ := g.do(t, "GET", "/v1/claims", "", nil, bearer.Name, "viewer-token"); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET /v1/claims with a bare token in %s: %s, want 401", bearer.Name, resp.Status)
	}
}
