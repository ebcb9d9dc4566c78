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
			// A port peers can dial: RetryReclaim is forwarded to the
			// replica holding the reclaim.
			Options: startup.Options{Listen: "127.0.0.1:7704", EtcdEndpoints: []string{"http://127.0.0.1:2379"}, TLS: grpcutil.TLSFiles{CAFile: "ca.crt", CertFile: "tls.crt", KeyFile: "tls.key"}},
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
		// Node-local recycling allowed under no directory refuses every
		// volume: it would start, report ready and fail every Recycle.
		{"node-local without prefixes", func(o *Options) { o.RecycleMode, o.NodeName = RecycleNodeLocal, "node-a" },
			[]string{"--recycle-path-prefixes", "--recycle-mode=node-local"}},
		{"prefixes in pod mode", func(o *Options) { o.RecyclePathPrefixes = []string{"/data"} }, []string{"--recycle-path-prefixes", "--recycle-mode"}},
		{"an image in node-local mode", func(o *Options) {
			o.RecycleMode, o.NodeName, o.RecyclePathPrefixes, o.RecyclerImage = RecycleNodeLocal, "node-a", []string{"/data"}, "busybox"
		}, []string{"--recycler-image", "--recycle-mode"}},
		{"a template in node-local mode", func(o *Options) {
			o.RecycleMode, o.NodeName, o.RecyclePathPrefixes, o.RecyclerPodTemplate = RecycleNodeLocal, "node-a", []string{"/data"}, "pod.yaml"
		}, []string{"--recycler-pod-template", "--recycle-mode"}},
		{"relative prefix", func(o *Options) {
			o.RecycleMode, o.NodeName, o.RecyclePathPrefixes = RecycleNodeLocal, "node-a", []string{"data"}
		}, []string{"--recycle-path-prefixes"}},
		{"invalid recycler namespace", func(o *Options) { o.RecyclerNamespace = "Not_A_Namespace" }, []string{"--recycler-namespace"}},
		{"unreachable by its peers", func(o *Options) { o.Listen = ":7704" }, []string{"--advertise-address"}},
		{"plaintext and TLS files", func(o *Options) { o.TLS.InsecurePlaintext = true }, []string{"--insecure-plaintext"}},
		{"certificate without key", func(o *Options) { o.TLS.KeyFile = "" }, []string{"--tls-key-file"}},
		{"all at once", func(o *Options) {
			o.RecycleMode, o.Workers, o.RecordTTL, o.TLS.KeyFile = RecycleNodeLocal, -1, -time.Second, ""
		}, []string{"--node-name", "--recycle-path-prefixes", "--workers", "--record-ttl", "--tls-key-file"}},
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
