package main

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/volplane/volplane/pkg/callers"
	"github.com/volplane/volplane/test/harness/pki"
)

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s holds no PEM", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func pool(t *testing.T, path string) *x509.CertPool {
	t.Helper()
	p := x509.NewCertPool()
	p.AddCert(readCert(t, path))
	return p
}

// What --write-compose writes: the services' certificates carry their
// identities, users' certificates come from another CA (the one
// docker-compose.yaml gives the gateway as --client-ca-file), and no CA
// key stays in the directory every container mounts.
func TestComposeFilesSeparateUsersFromServices(t *testing.T) {
	dir := t.TempDir()
	if err := writeComposeFiles(dir); err != nil {
		t.Fatal(err)
	}
	services, users := pool(t, filepath.Join(dir, "ca.crt")), pool(t, filepath.Join(dir, "users", "ca.crt"))
	client := x509.VerifyOptions{KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	for _, svc := range pki.Services {
		c := readCert(t, filepath.Join(dir, svc+".crt"))
		if c.Subject.CommonName != callers.ServiceIdentity(svc) {
			t.Errorf("%s.crt: CN %q, want %q", svc, c.Subject.CommonName, callers.ServiceIdentity(svc))
		}
		if _, err := c.Verify(x509.VerifyOptions{Roots: services, DNSName: svc}); err != nil {
			t.Errorf("%s.crt for host %s: %v", svc, svc, err)
		}
		client.Roots = users
		if _, err := c.Verify(client); err == nil {
			t.Errorf("%s.crt verifies as a user's certificate", svc)
		}
	}
	admin := readCert(t, filepath.Join(dir, "users", composeAdmin+".crt"))
	client.Roots = users
	if _, err := admin.Verify(client); err != nil {
		t.Errorf("the admin's certificate does not verify against the users' CA: %v", err)
	}
	client.Roots = services
	if _, err := admin.Verify(client); err == nil {
		t.Error("the admin's certificate verifies against the services' CA")
	}
	for _, key := range []string{"ca.key", "users/ca.key"} {
		if _, err := os.Stat(filepath.Join(dir, key)); !os.IsNotExist(err) {
			t.Errorf("%s left in the mounted directory (%v)", key, err)
		}
	}

	b, err := os.ReadFile(filepath.Join("..", "..", "..", "docker-compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`--client-ca-file=/etc/volplane/compose/(\S+?)[\],\s]`).FindSubmatch(b)
	if m == nil {
		t.Fatal("docker-compose.yaml gives the gateway no --client-ca-file")
	}
	if got := string(m[1]); got != "users/ca.crt" {
		t.Errorf("docker-compose.yaml: the gateway's --client-ca-file is %s, want the users' CA users/ca.crt", got)
	}
}
