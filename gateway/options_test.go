package gateway

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/test/harness/pki"
)

// The gateway refuses to start on options that cannot work: a valid
// baseline, then one mutation per row, each refused with an error that
// names the flag to fix; several mistakes are reported at once.
func TestOptionsValidate(t *testing.T) {
	dir := t.TempDir()
	services, err := pki.Generate(filepath.Join(dir, "services"), "gateway")
	if err != nil {
		t.Fatal(err)
	}
	users, err := pki.NewCA(filepath.Join(dir, "users"), "users")
	if err != nil {
		t.Fatal(err)
	}
	// The services' CA among others in a bundle: still the services' CA.
	bundle := filepath.Join(dir, "bundle.crt")
	u, _ := os.ReadFile(users.CertFile)
	s, _ := os.ReadFile(services["gateway"].CAFile)
	if err := os.WriteFile(bundle, append(u, s...), 0o600); err != nil {
		t.Fatal(err)
	}
	gw := services["gateway"]
	base := func() Options {
		return Options{Listen: "127.0.0.1:8443", BinderAddress: "binder:7702", TLS: gw,
			Auth: AuthOptions{ClientCAFile: users.CertFile},
			HTTP: HTTPOptions{TLSCertFile: gw.CertFile, TLSKeyFile: gw.KeyFile}}
	}
	for _, tc := range []struct {
		name   string
		modify func(*Options)
		want   []string // texts the error holds; none means valid
	}{
		{"baseline", func(*Options) {}, nil},
		{"plain HTTP, tokens only", func(o *Options) { o.Auth.ClientCAFile, o.HTTP = "", HTTPOptions{} }, nil},
		{"no binder", func(o *Options) { o.BinderAddress = "" }, []string{"--binder-address"}},
		{"no listen", func(o *Options) { o.Listen = "" }, []string{"--listen"}},
		{"client certificates over plain HTTP", func(o *Options) { o.HTTP.TLSCertFile, o.HTTP.TLSKeyFile = "", "" },
			[]string{"--client-ca-file", "--tls-serving-cert-file"}},
		{"the services' CA for users", func(o *Options) { o.Auth.ClientCAFile = gw.CAFile },
			[]string{"--client-ca-file", "--tls-ca-file", "separate CA"}},
		{"the services' CA in a users' bundle", func(o *Options) { o.Auth.ClientCAFile = bundle },
			[]string{"--client-ca-file", "--tls-ca-file"}},
		{"serving certificate without key", func(o *Options) { o.HTTP.TLSKeyFile = "" }, []string{"--tls-serving-key-file"}},
		{"negative read timeout", func(o *Options) { o.HTTP.ReadTimeout = -time.Second }, []string{"--read-timeout"}},
		{"negative write timeout", func(o *Options) { o.HTTP.WriteTimeout = -time.Second }, []string{"--write-timeout"}},
		{"negative request size", func(o *Options) { o.HTTP.MaxRequestBytes = -1 }, []string{"--max-request-bytes"}},
		{"negative header size", func(o *Options) { o.HTTP.MaxHeaderBytes = -1 }, []string{"--max-header-bytes"}},
		{"plaintext and TLS files", func(o *Options) { o.TLS.InsecurePlaintext = true }, []string{"--insecure-plaintext"}},
		{"certificate without key", func(o *Options) { o.TLS.KeyFile = "" }, []string{"--tls-key-file"}},
		{"all at once", func(o *Options) { o.BinderAddress, o.HTTP.ReadTimeout, o.TLS = "", -time.Second, grpcutil.TLSFiles{} },
			[]string{"--binder-address", "--read-timeout", "--tls-ca-file"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := base()
			tc.modify(&o)
			err := o.validateRun()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			for _, w := range tc.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("error %v does not say %s", err, w)
				}
			}
		})
	}
}
