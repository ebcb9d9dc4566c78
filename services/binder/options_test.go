package binder

import (
	"strings"
	"testing"
	"time"

	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/replica"
)

// A binder refuses to start on options that cannot work: a valid
// baseline, then one mutation per row, each refused with an error that
// names the flag to fix; several mistakes are reported at once.
func TestOptionsValidate(t *testing.T) {
	base := func() Options {
		return Options{
			Options: replica.Options{Listen: "127.0.0.1:7702", EtcdEndpoints: []string{"http://127.0.0.1:2379"},
				TLS: grpcutil.TLSFiles{CAFile: "ca.crt", CertFile: "tls.crt", KeyFile: "tls.key"}},
			WatcherAddress: "127.0.0.1:7701",
		}
	}
	for _, tc := range []struct {
		name   string
		modify func(*Options)
		want   []string // texts the error holds; none means valid
	}{
		{"baseline", func(*Options) {}, nil},
		{"stale-after at its least", func(o *Options) { o.StaleAfter = 2 * time.Second }, nil},
		{"no watcher", func(o *Options) { o.WatcherAddress = "" }, []string{"--watcher-address"}},
		{"stale-after below what works", func(o *Options) { o.StaleAfter = time.Second }, []string{"--watcher-stale-after", "at least 2s"}},
		{"negative stale-after", func(o *Options) { o.StaleAfter = -time.Second }, []string{"--watcher-stale-after"}},
		{"negative workers", func(o *Options) { o.Workers = -1 }, []string{"--workers"}},
		{"negative provision calls", func(o *Options) { o.ProvisionCalls = -1 }, []string{"--provision-calls"}},
		{"negative retry interval start", func(o *Options) { o.RetryIntervalStart = -time.Second }, []string{"--retry-interval-start"}},
		{"negative retry interval max", func(o *Options) { o.RetryIntervalMax = -time.Second }, []string{"--retry-interval-max"}},
		{"retry interval max below start", func(o *Options) { o.RetryIntervalStart, o.RetryIntervalMax = time.Minute, time.Second }, []string{"--retry-interval-max", "--retry-interval-start"}},
		{"retry interval max below the default start", func(o *Options) { o.RetryIntervalMax = 500 * time.Millisecond }, []string{"--retry-interval-max"}},
		{"retry intervals set", func(o *Options) { o.RetryIntervalStart, o.RetryIntervalMax = 200*time.Millisecond, time.Minute }, nil},
		{"negative resync", func(o *Options) { o.ResyncPeriod = -time.Second }, []string{"--resync-period"}},
		{"negative ownership settle", func(o *Options) { o.OwnershipSettle = -time.Second }, []string{"--ownership-settle"}},
		{"unreachable by its peers", func(o *Options) { o.Listen = ":7702" }, []string{"--advertise-address"}},
		{"plaintext and TLS files", func(o *Options) { o.TLS.InsecurePlaintext = true }, []string{"--insecure-plaintext"}},
		{"certificate without key", func(o *Options) { o.TLS.KeyFile = "" }, []string{"--tls-key-file"}},
		{"all at once", func(o *Options) { o.WatcherAddress, o.StaleAfter, o.Workers = "", time.Millisecond, -1 },
			[]string{"--watcher-address", "--watcher-stale-after", "--workers"}},
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
