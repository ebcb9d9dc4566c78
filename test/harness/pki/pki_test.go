package pki_test

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/volplane/volplane/pkg/callers"
	"github.com/volplane/volplane/test/harness/pki"
)

func TestIssuedCertificatesVerifyForTheirNames(t *testing.T) {
	certs, err := pki.Generate(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, svc := range pki.Services {
		f := certs[svc]
		pool := x509.NewCertPool()
		b, err := os.ReadFile(f.CAFile)
		if err != nil || !pool.AppendCertsFromPEM(b) {
			t.Fatalf("CA %s: %v", f.CAFile, err)
		}
		b, err = os.ReadFile(f.CertFile)
		if err != nil {
			t.Fatal(err)
		}
		blk, _ := pem.Decode(b)
		cert, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		if cert.Subject.CommonName != callers.ServiceIdentity(svc) {
			t.Errorf("%s: CN %q, want its identity %q", svc, cert.Subject.CommonName, callers.ServiceIdentity(svc))
		}
		for _, host := range []string{"localhost", "127.0.0.1", "::1", svc, callers.ServiceIdentity(svc)} {
			for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
				if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: host, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
					t.Errorf("%s for %s, usage %v: %v", svc, host, usage, err)
				}
			}
		}
		if fi, err := os.Stat(f.KeyFile); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s key %s: mode %v, %v", svc, f.KeyFile, fi.Mode(), err)
		}
	}
}

func TestUserCertificatesAreClientOnly(t *testing.T) {
	ca, err := pki.NewCA(t.TempDir(), "users")
	if err != nil {
		t.Fatal(err)
	}
	f, err := ca.IssueUser("alice", "ops", "dev")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(f.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if org := slices.Sorted(slices.Values(cert.Subject.Organization)); cert.Subject.CommonName != "alice" || strings.Join(org, ",") != "dev,ops" {
		t.Errorf("subject %v, want CN alice, O ops and dev", cert.Subject)
	}
	if len(cert.ExtKeyUsage) != 1 || cert.ExtKeyUsage[0] != x509.ExtKeyUsageClientAuth || len(cert.DNSNames)+len(cert.IPAddresses) != 0 {
		t.Errorf("usages %v, names %v %v: want client authentication only, no host", cert.ExtKeyUsage, cert.DNSNames, cert.IPAddresses)
	}
}
