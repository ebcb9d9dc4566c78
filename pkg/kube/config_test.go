package kube

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// kubeconfig writes a kubeconfig with one cluster per name (server
// https://<name>.example) and a context of the same name, the first
// current unless current says otherwise.
func kubeconfig(t *testing.T, current string, names ...string) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("apiVersion: v1\nkind: Config\nclusters:\n")
	for _, n := range names {
		b.WriteString("- name: " + n + "\n  cluster:\n    server: https://" + n + ".example\n")
	}
	b.WriteString("users:\n- name: u\n  user:\n    token: t\ncontexts:\n")
	for _, n := range names {
		b.WriteString("- name: " + n + "\n  context:\n    cluster: " + n + "\n    user: u\n")
	}
	if current != "" {
		b.WriteString("current-context: " + current + "\n")
	}
	p := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(p, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRESTConfigLoadingRules(t *testing.T) {
	a := kubeconfig(t, "a", "a", "other")
	b := kubeconfig(t, "", "b")
	for _, tc := range []struct {
		name, env string
		o         ClientOptions
		host      string
	}{
		{"explicit file", "", ClientOptions{Kubeconfig: b}, ""}, // b has no current-context
		{"explicit file and context", "", ClientOptions{Kubeconfig: b, Context: "b"}, "https://b.example"},
		{"explicit file over $KUBECONFIG", b, ClientOptions{Kubeconfig: a}, "https://a.example"},
		{"$KUBECONFIG list, merged", b + string(os.PathListSeparator) + a, ClientOptions{}, "https://a.example"},
		{"$KUBECONFIG list, a context of the second file", a + string(os.PathListSeparator) + b, ClientOptions{Context: "b"}, "https://b.example"},
		{"another context", "", ClientOptions{Kubeconfig: a, Context: "other"}, "https://other.example"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("KUBECONFIG", tc.env)
			t.Setenv("HOME", t.TempDir()) // no ~/.kube/config
			cfg, err := RESTConfig(tc.o)
			if tc.host == "" {
				if err == nil {
					t.Fatalf("got host %q, want an error (no context)", cfg.Host)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Host != tc.host {
				t.Fatalf("host %q, want %q", cfg.Host, tc.host)
			}
		})
	}
}

func TestRESTConfigOutsideAClusterSaysWhatToSet(t *testing.T) {
	t.Setenv("KUBECONFIG", "")
	t.Setenv("HOME", t.TempDir())
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	if _, err := RESTConfig(ClientOptions{}); err == nil || !strings.Contains(err.Error(), "--kubeconfig") {
		t.Fatalf("got %v, want an error naming --kubeconfig", err)
	}
}
