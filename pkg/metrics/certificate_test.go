package metrics_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/volplane/volplane/pkg/metrics"
)

// expirySeries is the exposition of
// volplane_certificate_expiry_timestamp_seconds as /metrics serves it.
func expirySeries(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	mfs, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "volplane_certificate_expiry_timestamp_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			b.WriteString(strings.Join(labels, ",") + " " + time.Unix(int64(m.GetGauge().GetValue()), 0).UTC().Format(time.DateOnly) + "\n")
		}
	}
	return b.String()
}

func cert(cn string, notAfter string) *x509.Certificate {
	at, err := time.Parse(time.DateOnly, notAfter)
	if err != nil {
		panic(err)
	}
	return &x509.Certificate{Subject: pkix.Name{CommonName: cn}, NotAfter: at}
}

// Each source's certificates are one series each; a reload replaces the
// source's series (a rotated certificate's old subject goes), and a
// series two sources share stays while one of them still has it.
func TestSetCertificatesReplacesASourcesSeries(t *testing.T) {
	t.Cleanup(func() {
		for _, src := range [][2]string{{metrics.RoleService, "/a.crt"}, {metrics.RoleCA, "/ca.crt"}, {metrics.RoleCA, "/other-ca.crt"}} {
			metrics.SetCertificates(src[0], src[1], nil)
		}
	})
	steps := []struct {
		name       string
		role, file string
		certs      []*x509.Certificate
		want       string
	}{
		{"first load", metrics.RoleService, "/a.crt", []*x509.Certificate{cert("binder", "2027-01-01"), cert("intermediate", "2030-01-01")},
			"role=service,subject=CN=binder 2027-01-01\nrole=service,subject=CN=intermediate 2030-01-01\n"},
		{"CA", metrics.RoleCA, "/ca.crt", []*x509.Certificate{cert("volplane-ca", "2036-01-01"), nil},
			"role=ca,subject=CN=volplane-ca 2036-01-01\nrole=service,subject=CN=binder 2027-01-01\nrole=service,subject=CN=intermediate 2030-01-01\n"},
		{"rotation to a new subject drops the old", metrics.RoleService, "/a.crt", []*x509.Certificate{cert("binder-2", "2028-01-01")},
			"role=ca,subject=CN=volplane-ca 2036-01-01\nrole=service,subject=CN=binder-2 2028-01-01\n"},
		{"renewal keeps the subject, moves the date", metrics.RoleService, "/a.crt", []*x509.Certificate{cert("binder-2", "2029-01-01")},
			"role=ca,subject=CN=volplane-ca 2036-01-01\nrole=service,subject=CN=binder-2 2029-01-01\n"},
		{"a second source of the same CA", metrics.RoleCA, "/other-ca.crt", []*x509.Certificate{cert("volplane-ca", "2036-01-01")},
			"role=ca,subject=CN=volplane-ca 2036-01-01\nrole=service,subject=CN=binder-2 2029-01-01\n"},
		{"one source dropping a shared series keeps it", metrics.RoleCA, "/ca.crt", nil,
			"role=ca,subject=CN=volplane-ca 2036-01-01\nrole=service,subject=CN=binder-2 2029-01-01\n"},
		{"the last source dropping it removes it", metrics.RoleCA, "/other-ca.crt", nil,
			"role=service,subject=CN=binder-2 2029-01-01\n"},
	}
	for _, s := range steps {
		metrics.SetCertificates(s.role, s.file, s.certs)
		if got := expirySeries(t); got != s.want {
			t.Fatalf("%s: series\n%s\nwant\n%s", s.name, got, s.want)
		}
	}
}

// The metric is on the registry /metrics serves, a gauge of Unix seconds.
func TestCertificateExpiryRegistered(t *testing.T) {
	metrics.SetCertificates(metrics.RoleGatewayServing, "/gw.crt", []*x509.Certificate{cert("volplane-gateway", "2027-01-29")})
	t.Cleanup(func() { metrics.SetCertificates(metrics.RoleGatewayServing, "/gw.crt", nil) })
	mfs, err := metrics.Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "volplane_certificate_expiry_timestamp_seconds" {
			if mf.GetType().String() != "GAUGE" || len(mf.GetMetric()) != 1 || mf.GetMetric()[0].GetGauge().GetValue() != float64(time.Date(2027, 1, 29, 0, 0, 0, 0, time.UTC).Unix()) {
				t.Fatalf("got %v, want one gauge of 2027-01-29 in Unix seconds", mf)
			}
			return
		}
	}
	t.Fatal("/metrics serves no volplane_certificate_expiry_timestamp_seconds")
}

// writeCert writes to file a self-signed certificate of cn, valid until
// notAfter, as PEM after a block of another type (which is skipped).
func writeCert(t *testing.T, file, cn string, notAfter time.Time) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn}, NotBefore: time.Now().Add(-time.Hour), NotAfter: notAfter}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	b := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: []byte("not parsed")})
	b = append(b, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// A file's certificates are recorded; a file that is gone or holds no
// certificate leaves the series of what was loaded before.
func TestSetCertificatesFromFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "etcd-client.crt")
	t.Cleanup(func() { metrics.SetCertificates(metrics.RoleEtcdClient, file, nil) })
	writeCert(t, file, "volplane-binder", time.Date(2027, 3, 1, 0, 0, 0, 0, time.UTC))
	metrics.SetCertificatesFromFile(metrics.RoleEtcdClient, file)
	const want = "role=etcd-client,subject=CN=volplane-binder 2027-03-01\n"
	if got := expirySeries(t); got != want {
		t.Fatalf("series\n%s\nwant\n%s", got, want)
	}
	if err := os.WriteFile(file, []byte("half-written"), 0o600); err != nil {
		t.Fatal(err)
	}
	metrics.SetCertificatesFromFile(metrics.RoleEtcdClient, file)
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	metrics.SetCertificatesFromFile(metrics.RoleEtcdClient, file)
	if got := expirySeries(t); got != want {
		t.Fatalf("after a broken and a missing file: series\n%s\nwant the last loaded\n%s", got, want)
	}
	writeCert(t, file, "volplane-binder", time.Date(2027, 9, 1, 0, 0, 0, 0, time.UTC))
	metrics.SetCertificatesFromFile(metrics.RoleEtcdClient, file)
	if got, want := expirySeries(t), "role=etcd-client,subject=CN=volplane-binder 2027-09-01\n"; got != want {
		t.Fatalf("after the renewal: series\n%s\nwant\n%s", got, want)
	}
}
