package provisioner

import (
	"strings"
	"testing"
	"time"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/replica"
)

// A provisioner refuses to start on options that cannot work: a valid
// baseline, then one mutation per row, each refused with an error that
// names the flag to fix; several mistakes are reported at once.
func TestOptionsValidate(t *testing.T) {
	base := func() Options {
		return Options{
			// The provisioner forwards nothing to its peers: --listen
			// :7703 without an advertised address is fine.
			Options: replica.Options{Listen: ":7703", EtcdEndpoints: []string{"http://127.0.0.1:2379"},
				TLS: grpcutil.TLSFiles{CAFile: "ca.crt", CertFile: "tls.crt", KeyFile: "tls.key"}},
			CSIEndpoints: []string{"unix:///run/csi/csi.sock"},
		}
	}
	for _, tc := range []struct {
		name   string
		modify func(*Options)
		want   []string // texts the error holds; none means valid
	}{
		{"baseline", func(*Options) {}, nil},
		{"several drivers", func(o *Options) {
			o.CSIEndpoints = []string{"unix:///a/csi.sock", "fast=unix:///b/csi.sock", "slow=unix:///b/csi.sock", "csi-driver:10000", "unix:/c/csi.sock"}
		}, nil},
		{"a short stale-after without a watcher", func(o *Options) { o.StaleAfter = time.Second }, nil},
		{"no driver", func(o *Options) { o.CSIEndpoints = nil }, []string{"--csi-endpoint", "no CSI driver"}},
		{"the same endpoint twice", func(o *Options) { o.CSIEndpoints = []string{"unix:///a/csi.sock", "unix:///a/csi.sock"} },
			[]string{"--csi-endpoint", `"unix:///a/csi.sock"`, "twice"}},
		{"a name mapped twice", func(o *Options) { o.CSIEndpoints = []string{"a=unix:///x", "a=unix:///y"} }, []string{"--csi-endpoint", "mapped to two"}},
		{"an endpoint without an address", func(o *Options) { o.CSIEndpoints = []string{"a="} }, []string{"--csi-endpoint", "no address"}},
		{"a path without unix://", func(o *Options) { o.CSIEndpoints = []string{"/run/csi/csi.sock"} }, []string{"--csi-endpoint", "unix:///run/csi/csi.sock"}},
		{"unix:// without a path", func(o *Options) { o.CSIEndpoints = []string{"unix://"} }, []string{"--csi-endpoint"}},
		{"stale-after below what works", func(o *Options) { o.WatcherAddress, o.StaleAfter = "127.0.0.1:7701", time.Second },
			[]string{"--watcher-stale-after", "at least 2s"}},
		{"negative timeout", func(o *Options) { o.Timeout = -time.Second }, []string{"--timeout"}},
		{"negative recovery period", func(o *Options) { o.RecoveryPeriod = -time.Second }, []string{"--recovery-period"}},
		{"negative snapshot orphan sweep interval", func(o *Options) { o.SnapshotOrphanSweepInterval = -time.Second }, []string{"--snapshot-orphan-sweep-interval"}},
		{"snapshot orphan sweep off", func(o *Options) { o.SnapshotOrphanSweepInterval = 0 }, nil},
		{"negative probe period", func(o *Options) { o.ProbePeriod = -time.Second }, []string{"--probe-period"}},
		{"bad volume name prefix", func(o *Options) { o.VolumeNamePrefix = "Bad/Prefix" }, []string{"--volume-name-prefix"}},
		{"capacity without a namespace", func(o *Options) { o.Capacity.Enabled = true }, []string{"--capacity-namespace"}},
		{"plaintext and TLS files", func(o *Options) { o.TLS.InsecurePlaintext = true }, []string{"--insecure-plaintext"}},
		{"certificate without key", func(o *Options) { o.TLS.KeyFile = "" }, []string{"--tls-key-file"}},
		{"all at once", func(o *Options) { o.CSIEndpoints, o.Timeout, o.TLS.KeyFile = nil, -time.Second, "" },
			[]string{"--csi-endpoint", "--timeout", "--tls-key-file"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := base()
			tc.modify(&o)
			err := o.validate()
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

// Two endpoints whose drivers report the same name cannot both be served:
// a class would go to one of them, and a volume's deletion to whichever
// the registry finds first. Both are reported not ready, saying why (so
// the provisioner is NOT_SERVING), until one goes; the same endpoint
// mapped to two provisioner names is one driver and fine.
func TestDriversWithTheSameNameAreNotReady(t *testing.T) {
	_, a := startDriver(t)
	_, b := startDriver(t)
	_, other := startDriverNamed(t, "other.csi.volplane.io")
	for _, tc := range []struct {
		name      string
		endpoints []string
		ready     []bool
		message   string
	}{
		{"one endpoint, two names", []string{"fast=" + a, "slow=" + a}, []bool{true, true}, ""},
		{"different drivers", []string{a, other}, []bool{true, true}, ""},
		{"two endpoints, one driver name", []string{a, b}, []bool{false, false}, "reported by 2 endpoints"},
		{"two endpoints, one provisioner name", []string{"fast=" + a, "fast=" + other}, []bool{false, false}, "served by 2 endpoints"},
		{"a mapped name equal to another's own", []string{devcsi.DefaultName + "=" + other, a}, []bool{false, false}, "served by 2 endpoints"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := newRegistry(discard)
			for _, e := range tc.endpoints {
				name, addr := parseEndpoint(e)
				cc, err := grpcutil.DialCSI(addr)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { cc.Close() })
				reg.add(newDriver(addr, name, cc))
			}
			reg.probeAll(t.Context())
			for i, d := range reg.all() {
				info := d.current().info
				if info.GetReady() != tc.ready[i] {
					t.Errorf("driver %d (%s): ready=%v (%s), want %v", i, tc.endpoints[i], info.GetReady(), info.GetMessage(), tc.ready[i])
				}
				if tc.message != "" && !strings.Contains(info.GetMessage(), tc.message) {
					t.Errorf("driver %d: message %q does not say %q", i, info.GetMessage(), tc.message)
				}
			}
		})
	}
}
