package coord_test

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/pkg/metrics"
	"github.com/volplane/volplane/test/harness/devenv"
	"github.com/volplane/volplane/test/harness/pki"
)

// TestSecurity runs an etcd that serves clients over TLS only, requires
// client certificates and has authentication on, and checks that the
// coordinator gets in with the right certificate and password, and not
// without either.
func TestSecurity(t *testing.T) {
	dir := t.TempDir()
	ca, err := pki.NewCA(filepath.Join(dir, "pki"), "etcd-ca")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ca.Issue("etcd")
	if err != nil {
		t.Fatal(err)
	}
	cli, err := ca.Issue("volplane")
	if err != nil {
		t.Fatal(err)
	}
	e, err := devenv.StartEtcdTLS(filepath.Join(dir, "data"), &devenv.EtcdTLS{CAFile: ca.CertFile, CertFile: srv.CertFile, KeyFile: srv.KeyFile})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Stop()
	if !strings.HasPrefix(e.Endpoints[0], "https://") {
		t.Fatalf("endpoint %s, want https", e.Endpoints[0])
	}

	// Turn etcd's authentication on: root, and a user "volplane" that may
	// read and write under /secure.
	tc, err := transport.TLSInfo{TrustedCAFile: ca.CertFile, CertFile: cli.CertFile, KeyFile: cli.KeyFile}.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	admin, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints, TLS: tc, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	for _, step := range []func() error{
		func() error { _, err := admin.UserAdd(ctx, "root", "rootpw"); return err },
		func() error { _, err := admin.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := admin.RoleAdd(ctx, "volplane"); return err },
		func() error {
			_, err := admin.RoleGrantPermission(ctx, "volplane", "/secure", clientv3.GetPrefixRangeEnd("/secure"), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := admin.UserAdd(ctx, "volplane", "s3cret"); return err },
		func() error { _, err := admin.UserGrantRole(ctx, "volplane", "volplane"); return err },
		func() error { _, err := admin.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatalf("set up etcd auth: %v", err)
		}
	}
	admin.Close()

	pw := filepath.Join(dir, "password")
	if err := os.WriteFile(pw, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad-password")
	if err := os.WriteFile(bad, []byte("guess"), 0o600); err != nil {
		t.Fatal(err)
	}
	good := coord.Security{CAFile: ca.CertFile, CertFile: cli.CertFile, KeyFile: cli.KeyFile, Username: "volplane", PasswordFile: pw}
	open := func(s coord.Security, endpoints []string) (*coord.Coordinator, error) {
		return coord.New(ctx, coord.Options{Endpoints: endpoints, Prefix: "/secure", Security: s, DialTimeout: 3 * time.Second})
	}

	c, err := open(good, e.Endpoints)
	if err != nil {
		t.Fatalf("with certificate and password: %v", err)
	}
	if err := c.Register(ctx, "binder", "b-1", "127.0.0.1:1"); err != nil {
		t.Fatal(err)
	}
	if ms, err := c.Members(ctx, "binder"); err != nil || len(ms) != 1 {
		t.Fatalf("members %v, %v", ms, err)
	}
	c.Close()
	// The client certificate's and the CA's expiry are published.
	expiry := etcdCertificateExpiry(t)
	for _, f := range []struct{ role, file string }{{metrics.RoleEtcdClient, cli.CertFile}, {metrics.RoleEtcdCA, ca.CertFile}} {
		subject, notAfter := firstCertificate(t, f.file)
		if got := expiry[f.role+" "+subject]; got != notAfter {
			t.Errorf("%s %s expiry %v, want %v (series %v)", f.role, subject, got, notAfter, expiry)
		}
	}

	for name, tc := range map[string]struct {
		s         coord.Security
		endpoints []string
		want      string
	}{
		"wrong password":          {s: with(good, func(s *coord.Security) { s.PasswordFile = bad }), want: "authentication failed"},
		"no client certificate":   {s: with(good, func(s *coord.Security) { s.CertFile, s.KeyFile = "", "" })},
		"no TLS":                  {s: coord.Security{Username: "volplane", PasswordFile: pw}, endpoints: []string{strings.Replace(e.Endpoints[0], "https", "http", 1)}},
		"http endpoint with TLS":  {s: good, endpoints: []string{"http://127.0.0.1:2379"}, want: "https://"},
		"user without password":   {s: with(good, func(s *coord.Security) { s.PasswordFile = "" }), want: "--etcd-password-file"},
		"certificate without key": {s: with(good, func(s *coord.Security) { s.KeyFile = "" }), want: "--etcd-key"},
	} {
		t.Run(name, func(t *testing.T) {
			if tc.endpoints == nil {
				tc.endpoints = e.Endpoints
			}
			c, err := open(tc.s, tc.endpoints)
			if err == nil {
				c.Close()
				t.Fatal("connected")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not say %q", err, tc.want)
			}
		})
	}
}

func with(s coord.Security, f func(*coord.Security)) coord.Security {
	f(&s)
	return s
}

// etcdCertificateExpiry is volplane_certificate_expiry_timestamp_seconds
// by "role subject".
func etcdCertificateExpiry(t *testing.T) map[string]float64 {
	t.Helper()
	out, err := metrics.CertificateExpiries(metrics.Gatherer())
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// firstCertificate is the subject and notAfter (Unix seconds) of a PEM
// file's first certificate.
func firstCertificate(t *testing.T, file string) (string, float64) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	if block == nil {
		t.Fatalf("%s: no PEM", file)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c.Subject.String(), float64(c.NotAfter.Unix())
}
