package replica

import (
	"strings"
	"testing"

	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/pkg/grpcutil"
)

// The options every replica shares: a valid baseline, then one mutation
// per row, each refused with an error naming the flag to fix; several
// mistakes are all reported at once.
func TestSharedOptions(t *testing.T) {
	base := func() Options {
		return Options{Listen: "127.0.0.1:7702", EtcdEndpoints: []string{"http://127.0.0.1:2379"},
			TLS: grpcutil.TLSFiles{CAFile: "ca.crt", CertFile: "tls.crt", KeyFile: "tls.key"}}
	}
	for _, tc := range []struct {
		name   string
		modify func(*Options)
		peers  bool     // checked as a replica its peers dial
		want   []string // texts the error holds; none means valid
	}{
		{"baseline", func(*Options) {}, true, nil},
		{"a unix socket, no peers", func(o *Options) { o.Listen = "unix:///run/volplane.sock" }, false, nil},
		{"every interface, advertised", func(o *Options) { o.Listen, o.AdvertiseAddress = ":7702", "binder-0.peers:7702" }, true, nil},
		{"every interface, not advertised, no peers", func(o *Options) { o.Listen = ":7702" }, false, nil},
		{"no listen", func(o *Options) { o.Listen = "" }, false, []string{"--listen"}},
		{"no etcd", func(o *Options) { o.EtcdEndpoints = nil }, false, []string{"--etcd-endpoints"}},
		{"no TLS", func(o *Options) { o.TLS = grpcutil.TLSFiles{} }, false, []string{"--tls-ca-file", "--insecure-plaintext"}},
		{"certificate without key", func(o *Options) { o.TLS.KeyFile = "" }, false, []string{"--tls-key-file"}},
		{"plaintext and TLS files", func(o *Options) { o.TLS.InsecurePlaintext = true }, false, []string{"--insecure-plaintext", "exclusive"}},
		{"negative burst", func(o *Options) { o.KubeBurst = -1 }, false, []string{"--kube-api-burst"}},
		{"etcd certificate without key", func(o *Options) {
			o.EtcdEndpoints, o.Etcd = []string{"https://etcd:2379"}, coord.Security{CAFile: "ca.crt", CertFile: "etcd.crt"}
		}, false, []string{"--etcd-cert", "--etcd-key"}},
		{"etcd TLS on http", func(o *Options) { o.Etcd = coord.Security{CAFile: "ca.crt"} }, false, []string{"https://", "--etcd-endpoints"}},
		{"etcd user without password", func(o *Options) { o.Etcd.Username = "volplane" }, false, []string{"--etcd-password-file"}},
		{"every interface, not advertised", func(o *Options) { o.Listen = ":7702" }, true, []string{"--advertise-address", `":7702"`, "--listen"}},
		{"unspecified address advertised", func(o *Options) { o.AdvertiseAddress = "0.0.0.0:7702" }, true, []string{"--advertise-address", "0.0.0.0:7702"}},
		{"port 0 advertised", func(o *Options) { o.Listen = "127.0.0.1:0" }, true, []string{"--advertise-address", "port 0"}},
		{"advertised address without a port", func(o *Options) { o.AdvertiseAddress = "binder-0.peers" }, true, []string{"--advertise-address", "host:port"}},
		{"all at once", func(o *Options) { o.Listen, o.EtcdEndpoints, o.TLS.CertFile = "", nil, "" }, false,
			[]string{"--listen", "--etcd-endpoints", "--tls-cert-file"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := base()
			tc.modify(&o)
			errs := o.Validate("reservations")
			if tc.peers {
				if err := o.ValidatePeerAddress(); err != nil {
					errs = append(errs, err)
				}
			}
			if len(tc.want) == 0 {
				if len(errs) > 0 {
					t.Fatal(errs)
				}
				return
			}
			if len(errs) == 0 {
				t.Fatalf("valid, want an error naming %v", tc.want)
			}
			msg := ""
			for _, e := range errs {
				msg += e.Error() + "\n"
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not say %s", msg, w)
				}
			}
		})
	}
}
