package binder

import (
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"testing"

	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
	"github.com/volplane/volplane/test/harness/memstat"
)

// BenchmarkPodIndexMemory100k measures what 100,000 pods that use claims
// cost the binder once listed (the pod index), with every pod scheduled
// and with every pod waiting for the scheduler (the index keeps the claims
// of waiting pods only). It reports the heap held in MB and bytes per pod.
// Run it once:
//
//	go test -run '^$' -bench PodIndexMemory100k -benchtime 1x ./services/binder/
func BenchmarkPodIndexMemory100k(b *testing.B) {
	const n = 100_000
	for _, waiting := range []bool{false, true} {
		name := "scheduled"
		if waiting {
			name = "unscheduled"
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				c := newController(slog.New(slog.NewTextHandler(io.Discard, nil)), fake.NewClientset(), record.NewFakeRecorder(1))
				before := memstat.HeapInUse()
				for i := range n {
					// Each event is garbage once applied, as from the
					// stream: the heap keeps what the index holds.
					p := &watcherv1.Pod{
						Namespace: fmt.Sprintf("team-%d", i%500), Name: fmt.Sprintf("web-%d", i),
						Uid: fmt.Sprintf("0b7c1a2e-5f3d-4c1b-9a8e-%012d", i), ClaimNames: []string{fmt.Sprintf("data-web-%d", i)}, Phase: "Running",
					}
					if !waiting {
						p.NodeName = fmt.Sprintf("node-%d", i%1000)
					}
					if err := c.Event(podEv(watcherv1.EventType_EVENT_TYPE_ADDED, fmt.Sprint(1000+i), p)); err != nil {
						b.Fatal(err)
					}
				}
				after := memstat.HeapInUse()
				if got := len(c.pods.keys()); got != n {
					b.Fatalf("%d pods indexed", got)
				}
				b.ReportMetric(float64(after-before)/1e6, "MB")
				b.ReportMetric(float64(after-before)/n, "bytes/pod")
				runtime.KeepAlive(c)
			}
		})
	}
}
