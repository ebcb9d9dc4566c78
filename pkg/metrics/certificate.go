package metrics

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Certificate roles: which of a process's certificates a series is of.
const (
	// RoleService is the process's own certificate for volplane's mutual
	// TLS (--tls-cert-file), served and presented as a client.
	RoleService = "service"
	// RoleCA is a CA certificate the process trusts for volplane's mutual
	// TLS (--tls-ca-file): once it expires no peer verifies.
	RoleCA = "ca"
	// RoleGatewayServing is the gateway's REST serving certificate
	// (--tls-serving-cert-file).
	RoleGatewayServing = "gateway-serving"
	// RoleEtcdClient is the client certificate presented to etcd
	// (--etcd-cert).
	RoleEtcdClient = "etcd-client"
	// RoleEtcdCA is the CA the etcd client trusts (--etcd-cacert).
	RoleEtcdCA = "etcd-ca"
)

// certificateExpiry is volplane_certificate_expiry_timestamp_seconds: the
// notAfter of every certificate the process has loaded and uses now, as
// a Unix time, by role and subject. The alert VolplaneCertificateExpiring
// compares it with time().
var certificateExpiry = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "volplane_certificate_expiry_timestamp_seconds",
	Help: "When each certificate the process uses expires (notAfter, Unix seconds), by role (service, ca, gateway-serving, etcd-client, etcd-ca) and subject.",
}, []string{"role", "subject"})

// certSources remembers the series each source (a role and the file it
// was read from) set, so that a reload replaces them: a rotated
// certificate's series goes, the new one's comes.
var certSources = struct {
	sync.Mutex
	series map[[2]string][]prometheus.Labels
}{series: map[[2]string][]prometheus.Labels{}}

// certRefreshers are called before the metric is collected: each reads
// its files again (at most as often as it rereads them anyway), so the
// series say what a new connection would get, even in a process that
// made no new connection since the files were renewed.
var certRefreshers struct {
	sync.Mutex
	fs []func()
}

// RefreshCertificatesWith has f called before every collection of
// volplane_certificate_expiry_timestamp_seconds; f loads the
// certificates again if their files changed and calls SetCertificates.
func RefreshCertificatesWith(f func()) {
	certRefreshers.Lock()
	defer certRefreshers.Unlock()
	certRefreshers.fs = append(certRefreshers.fs, f)
}

// certCollector collects certificateExpiry after the refreshers ran.
type certCollector struct{}

func (certCollector) Describe(ch chan<- *prometheus.Desc) { certificateExpiry.Describe(ch) }

func (certCollector) Collect(ch chan<- prometheus.Metric) {
	certRefreshers.Lock()
	fs := append([]func(){}, certRefreshers.fs...)
	certRefreshers.Unlock()
	for _, f := range fs {
		f()
	}
	certificateExpiry.Collect(ch)
}

func init() {
	Registry.MustRegister(certCollector{})
}

// SetCertificates records the certificates now in use from one source
// (role and file; file only tells sources apart and is not a label),
// replacing what that source recorded before. Certificates that two
// sources share (one CA file named twice) have one series.
func SetCertificates(role, file string, certs []*x509.Certificate) {
	certSources.Lock()
	defer certSources.Unlock()
	key := [2]string{role, file}
	for _, l := range certSources.series[key] {
		if !usedElsewhere(key, l) {
			certificateExpiry.Delete(l)
		}
	}
	var set []prometheus.Labels
	for _, c := range certs {
		if c == nil {
			continue
		}
		l := prometheus.Labels{"role": role, "subject": c.Subject.String()}
		certificateExpiry.With(l).Set(float64(c.NotAfter.Unix()))
		set = append(set, l)
	}
	certSources.series[key] = set
}

// usedElsewhere reports whether a source other than key set the series l.
func usedElsewhere(key [2]string, l prometheus.Labels) bool {
	for k, ls := range certSources.series {
		if k == key {
			continue
		}
		for _, o := range ls {
			if o["role"] == l["role"] && o["subject"] == l["subject"] {
				return true
			}
		}
	}
	return false
}

// SetCertificatesFromFile reads the PEM file and records its
// certificates as SetCertificates does. A file that cannot be read or
// holds no certificate changes nothing: the process goes on with what it
// loaded before, and so do its series.
func SetCertificatesFromFile(role, file string) {
	b, err := os.ReadFile(file)
	if err != nil {
		return
	}
	var certs []*x509.Certificate
	for len(b) > 0 {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		if c, err := x509.ParseCertificate(block.Bytes); err == nil {
			certs = append(certs, c)
		}
	}
	if len(certs) > 0 {
		SetCertificates(role, file, certs)
	}
}

// CertificateExpiries reads volplane_certificate_expiry_timestamp_seconds
// back from g: each series' value (a Unix time) by "role subject".
func CertificateExpiries(g prometheus.Gatherer) (map[string]float64, error) {
	mfs, err := g.Gather()
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "volplane_certificate_expiry_timestamp_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			out[l["role"]+" "+l["subject"]] = m.GetGauge().GetValue()
		}
	}
	return out, nil
}
