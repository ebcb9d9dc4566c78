package binder

import (
	"runtime"
	"testing"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/test/harness/memstat"
)

// BenchmarkStoreMemory100k measures what 100,000 Bound volumes and their
// claims cost the binder's cache once listed, each decoded from its
// protobuf as the stream delivers it. It reports the heap held in MB and
// bytes per object. Run it once:
//
//	go test -run '^$' -bench StoreMemory100k -benchtime 1x ./services/binder/
func BenchmarkStoreMemory100k(b *testing.B) {
	const n = 100_000
	pbs := make([][2][]byte, n)
	for i := range n {
		pv, pvc := memstat.BoundPair(i)
		pbs[i][0], _ = kube.EncodeProto(pv)
		pbs[i][1], _ = kube.EncodeProto(pvc)
	}
	for b.Loop() {
		before := memstat.HeapInUse()
		s := newStore()
		for _, pb := range pbs {
			v, err := kube.DecodeVolume(pb[0])
			if err != nil {
				b.Fatal(err)
			}
			c, err := kube.DecodeClaim(pb[1])
			if err != nil {
				b.Fatal(err)
			}
			s.putVolume(v)
			s.putClaim(c)
		}
		after := memstat.HeapInUse()
		if len(s.volumes) != n || len(s.claims) != n {
			b.Fatalf("%d volumes, %d claims", len(s.volumes), len(s.claims))
		}
		b.ReportMetric(float64(after-before)/1e6, "MB")
		b.ReportMetric(float64(after-before)/(2*n), "bytes/object")
		runtime.KeepAlive(s)
	}
}
