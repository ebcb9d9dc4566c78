package watcher

import (
	"log/slog"
	"runtime"
	"testing"

	"k8s.io/client-go/tools/cache"

	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
	"github.com/volplane/volplane/test/harness/memstat"
)

// BenchmarkVolumeMemory100k measures what 100,000 Bound volumes and their
// claims cost the watcher once listed: the informers' caches (after the
// transform, as the informers keep them) and the hub's state and history
// (history 100,000, the default). It reports the heap they hold, in MB and
// bytes per object. Run it once:
//
//	go test -run '^$' -bench VolumeMemory100k -benchtime 1x ./services/watcher/
func BenchmarkVolumeMemory100k(b *testing.B) {
	const n = 100_000
	log := slog.New(slog.DiscardHandler)
	for b.Loop() {
		before := memstat.HeapInUse()
		pvs := cache.NewIndexer(cache.DeletionHandlingMetaNamespaceKeyFunc, cache.Indexers{})
		pvcs := cache.NewIndexer(cache.DeletionHandlingMetaNamespaceKeyFunc, cache.Indexers{})
		h := newHub(DefaultHistorySize)
		addPV := handler(h, watcherv1.Kind_KIND_PERSISTENT_VOLUME, log).OnAdd
		addPVC := handler(h, watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM, log).OnAdd
		for i := range n {
			pv, pvc := memstat.BoundPair(i)
			for _, o := range []struct {
				obj   any
				store cache.Indexer
				add   func(any, bool)
			}{{pv, pvs, addPV}, {pvc, pvcs, addPVC}} {
				v, err := transform(o.obj)
				if err != nil {
					b.Fatal(err)
				}
				if err := o.store.Add(v); err != nil {
					b.Fatal(err)
				}
				o.add(v, true)
			}
		}
		after := memstat.HeapInUse()
		if v, c, _, _ := h.counts(); v != n || c != n || len(pvs.ListKeys()) != n || len(pvcs.ListKeys()) != n {
			b.Fatalf("hub: %d volumes, %d claims; stores: %d, %d", v, c, len(pvs.ListKeys()), len(pvcs.ListKeys()))
		}
		b.ReportMetric(float64(after-before)/1e6, "MB")
		b.ReportMetric(float64(after-before)/(2*n), "bytes/object")
		runtime.KeepAlive(pvs)
		runtime.KeepAlive(pvcs)
		runtime.KeepAlive(h)
	}
}
