package reclaimer

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/volplane/volplane/pkg/grpcutil"
	startup "github.com/volplane/volplane/pkg/replica"
)

func TestOptionsValidate(t *testing.T) {
	base := func() Options {
		return Options{
			Options: startup.Options{Listen: "127.0.0.1:0", EtcdEndpoints: []string{"http://127.0.0.1:2379"}, TLS: grpcutil.TLSFiles{CAFile: "ca.crt", CertFile: "tls.crt", KeyFile: "tls.key"}},
		}
	}
	for _, tc := range []struct {
		name   string
		modify func(*Options)
		want   []string // flags named in the error; none means valid
	}{
		{"defaults", func(*Options) {}, nil},
		{"no listen, no etcd", func(o *Options) { o.Listen, o.EtcdEndpoints = "", nil }, []string{"--listen", "--etcd-endpoints"}},
		{"no TLS", func(o *Options) { o.TLS = grpcutil.TLSFiles{} }, []string{"--tls-ca-file", "--insecure-plaintext"}},
		{"unknown mode", func(o *Options) { o.RecycleMode = "shred" }, []string{"--recycle-mode"}},
		{"node-local without a node", func(o *Options) { o.RecycleMode = RecycleNodeLocal }, []string{"--node-name"}},
		{"template and image", func(o *Options) { o.RecyclerPodTemplate, o.RecyclerImage = "x.yaml", "busybox" }, []string{"--recycler-image", "--recycler-pod-template"}},
		{"missing template", func(o *Options) { o.RecyclerPodTemplate = filepath.Join(t.TempDir(), "none.yaml") }, []string{"--recycler-pod-template"}},
		{"negative durations", func(o *Options) { o.RetryIntervalStart, o.RecordTTL = -time.Second, -time.Second }, []string{"--retry-interval-start", "--record-ttl"}},
		{"max below start", func(o *Options) { o.RetryIntervalStart, o.RetryIntervalMax = time.Minute, time.Second }, []string{"--retry-interval-max"}},
		{"negative workers", func(o *Options) { o.Workers = -2 }, []string{"--workers"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := base()
			tc.modify(&o)
			err := o.validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				if o.RecycleMode != RecyclePod || o.RecyclerImage != DefaultRecyclerImage || o.RecyclerNamespace != "default" ||
					o.Workers != DefaultWorkers || o.RetryIntervalMax != DefaultRetryIntervalMax || o.MemberID == "" || o.AdvertiseAddress != o.Listen {
					t.Errorf("defaults not applied: %+v", o)
				}
				return
			}
			for _, flag := range tc.want {
				if err == nil || !strings.Contains(err.Error(), flag) {
					t.Errorf("error %v does not name %s", err, flag)
				}
			}
		})
	}
}
