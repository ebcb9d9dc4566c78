package certs_test

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/volplane/volplane/internal/certs"
)

func parse(t *testing.T, b []byte) *x509.Certificate {
	t.Helper()
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("not PEM: %q", b)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func pool(t *testing.T, b []byte) *x509.CertPool {
	t.Helper()
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(b) {
		t.Fatalf("no CA in %q", b)
	}
	return p
}

func byName(ss []*corev1.Secret) map[string]*corev1.Secret {
	m := map[string]*corev1.Secret{}
	for _, s := range ss {
		m[s.Name] = s
	}
	return m
}

// Every component's Secret verifies, for server and client
// authentication, under the services' CA, for every name of it; the
// gateway's client CA is another CA; a second run keeps both CAs and
// issues new certificates.
func TestMake(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	o := certs.Options{StateDir: dir, GatewayHosts: []string{"volplane.example.com", "203.0.113.7"}}
	first, err := certs.Make(o)
	if err != nil {
		t.Fatal(err)
	}
	if len(first) != len(certs.Components)+len(certs.Clients)+1 {
		t.Fatalf("%d Secrets", len(first))
	}
	m := byName(first)
	for _, c := range certs.Components {
		s := m[c.Secret]
		if s == nil || s.Type != corev1.SecretTypeTLS || s.Namespace != "volplane-system" {
			t.Fatalf("%s: %+v", c.Secret, s)
		}
		leaf := parse(t, s.Data["tls.crt"])
		if leaf.Subject.CommonName != "volplane-"+c.Name {
			t.Errorf("%s: CN %q", c.Name, leaf.Subject.CommonName)
		}
		hosts := o.Hosts(c)
		if c.Name == "gateway" && !strings.Contains(strings.Join(hosts, ","), "volplane.example.com") {
			t.Errorf("gateway hosts %v", hosts)
		}
		for _, h := range append(hosts, "volplane-"+c.Name+".volplane-system.svc") {
			if strings.HasPrefix(h, "*.") {
				h = c.Name + "-0" + h[1:]
			}
			for _, u := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
				if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool(t, s.Data["ca.crt"]), DNSName: h, KeyUsages: []x509.ExtKeyUsage{u}}); err != nil {
					t.Errorf("%s for %s (%v): %v", c.Name, h, u, err)
				}
			}
		}
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool(t, s.Data["ca.crt"]), DNSName: "volplane-other.volplane-system.svc"}); err == nil {
			t.Errorf("%s verifies for another Service's name", c.Name)
		}
	}
	for _, c := range certs.Clients {
		clientOnly(t, c, m[c.Secret])
	}
	svcCA := m["volplane-binder-tls"].Data["ca.crt"]
	clientCA := m[certs.ClientCASecret].Data["ca.crt"]
	if bytes.Equal(svcCA, clientCA) || parse(t, clientCA).Subject.CommonName != "volplane-users-ca" {
		t.Fatal("the users' client CA must be a CA of its own")
	}
	for _, f := range []string{"services-ca.key", "users-ca.key"} {
		if fi, err := os.Stat(filepath.Join(dir, f)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v %v", f, fi, err)
		}
	}

	second, err := certs.Make(o)
	if err != nil {
		t.Fatal(err)
	}
	m2 := byName(second)
	if !bytes.Equal(m2["volplane-binder-tls"].Data["ca.crt"], svcCA) || !bytes.Equal(m2[certs.ClientCASecret].Data["ca.crt"], clientCA) {
		t.Error("a second run must keep the CAs")
	}
	if bytes.Equal(m2["volplane-binder-tls"].Data["tls.crt"], m["volplane-binder-tls"].Data["tls.crt"]) {
		t.Error("a second run must issue new certificates")
	}

	// A REST user's certificate verifies against the gateway's client CA.
	crt, key, err := certs.User(dir, t.TempDir(), "alice", []string{"sre"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(crt)
	alice := parse(t, b)
	if _, err := alice.Verify(x509.VerifyOptions{Roots: pool(t, clientCA), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Error(err)
	}
	if alice.Subject.CommonName != "alice" || len(alice.Subject.Organization) != 1 || alice.Subject.Organization[0] != "sre" {
		t.Errorf("alice's subject %v", alice.Subject)
	}
	if _, err := alice.Verify(x509.VerifyOptions{Roots: pool(t, svcCA), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Error("a user's certificate must not verify as a service's")
	}
	if fi, err := os.Stat(key); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("alice's key: %v %v", fi, err)
	}
}

// The YAML decodes strictly as the Secrets it was made from.
func TestWriteYAML(t *testing.T) {
	ss, err := certs.Make(certs.Options{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := certs.WriteYAML(&out, ss); err != nil {
		t.Fatal(err)
	}
	strict := json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme.Scheme, scheme.Scheme, json.SerializerOptions{Strict: true})
	n := 0
	for _, doc := range strings.Split(out.String(), "\n---\n") {
		if strings.TrimSpace(doc) == "" || strings.HasPrefix(strings.TrimSpace(doc), "#") && !strings.Contains(doc, "kind:") {
			continue
		}
		j, err := yaml.ToJSON([]byte(strings.TrimPrefix(doc, "---\n")))
		if err != nil {
			t.Fatal(err)
		}
		obj, _, err := strict.Decode(j, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		s := obj.(*corev1.Secret)
		if !bytes.Equal(s.Data["ca.crt"], ss[n].Data["ca.crt"]) {
			t.Errorf("%s: ca.crt changed on the way", s.Name)
		}
		n++
	}
	if n != len(ss) {
		t.Fatalf("%d documents, want %d", n, len(ss))
	}
}

// --client-ca-file: the cluster's CA certificate is the client CA; a file
// with a key or without a certificate is refused.
func TestClientCAFile(t *testing.T) {
	dir := t.TempDir()
	ss, err := certs.Make(certs.Options{StateDir: filepath.Join(dir, "a")})
	if err != nil {
		t.Fatal(err)
	}
	ca := byName(ss)["volplane-binder-tls"].Data["ca.crt"]
	good := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(good, ca, 0o644); err != nil {
		t.Fatal(err)
	}
	ss, err = certs.Make(certs.Options{StateDir: filepath.Join(dir, "b"), ClientCAFile: good})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(byName(ss)[certs.ClientCASecret].Data["ca.crt"], ca) {
		t.Error("the client CA Secret must hold the given CA")
	}
	if _, err := os.Stat(filepath.Join(dir, "b", "users-ca.key")); err == nil {
		t.Error("no users' CA is made when one is given")
	}
	key, _ := os.ReadFile(filepath.Join(dir, "a", "services-ca.key"))
	for name, content := range map[string][]byte{"with-key.pem": append(append([]byte{}, ca...), key...), "empty.pem": []byte("nothing")} {
		p := filepath.Join(dir, name)
		_ = os.WriteFile(p, content, 0o600)
		if _, err := certs.Make(certs.Options{StateDir: filepath.Join(dir, "c"), ClientCAFile: p}); err == nil {
			t.Errorf("%s: want an error", name)
		}
	}
}

func TestOptionsRefused(t *testing.T) {
	for name, o := range map[string]certs.Options{
		"no state directory":   {},
		"bad namespace":        {StateDir: t.TempDir(), Namespace: "Volplane_System"},
		"bad gateway host":     {StateDir: t.TempDir(), GatewayHosts: []string{"not a host"}},
		"longer than the CA":   {StateDir: t.TempDir(), Validity: 20 * certs.DefaultValidity},
		"negative validity":    {StateDir: t.TempDir(), Validity: -time.Hour},
		"bad cluster domain":   {StateDir: t.TempDir(), ClusterDomain: "-x"},
		"client CA is missing": {StateDir: t.TempDir(), ClientCAFile: "/nonexistent/ca.crt"},
	} {
		if _, err := certs.Make(o); err == nil {
			t.Errorf("%s: want an error", name)
		}
	}
	// Half a CA in the state directory is not replaced by a new one.
	dir := t.TempDir()
	if _, err := certs.Make(certs.Options{StateDir: dir}); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "services-ca.key")); err != nil {
		t.Fatal(err)
	}
	if _, err := certs.Make(certs.Options{StateDir: dir}); err == nil || !strings.Contains(err.Error(), "without its key") {
		t.Errorf("a CA certificate without its key: %v", err)
	}
	if _, _, err := certs.User(t.TempDir(), t.TempDir(), "bob", nil, 0); err == nil {
		t.Error("a user certificate without a users' CA: want an error")
	}
	if _, _, err := certs.User(dir, t.TempDir(), "../bob", nil, 0); err == nil {
		t.Error("a user name with a slash: want an error")
	}
}

// clientOnly checks a client-only certificate: under the services CA,
// named as the manifests' Certificate names it, a client of it, and
// refused as a server for any name.
func clientOnly(t *testing.T, c certs.Client, s *corev1.Secret) {
	t.Helper()
	if s == nil || s.Type != corev1.SecretTypeTLS || s.Namespace != "volplane-system" || len(s.Data["tls.key"]) == 0 {
		t.Fatalf("%s: %+v", c.Secret, s)
	}
	leaf := parse(t, s.Data["tls.crt"])
	if leaf.Subject.CommonName != c.Name || len(leaf.DNSNames)+len(leaf.IPAddresses) != 0 {
		t.Errorf("%s: CN %q, names %v %v", c.Secret, leaf.Subject.CommonName, leaf.DNSNames, leaf.IPAddresses)
	}
	roots := pool(t, s.Data["ca.crt"])
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("%s as a client: %v", c.Secret, err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err == nil {
		t.Errorf("%s verifies as a server", c.Secret)
	}
}
