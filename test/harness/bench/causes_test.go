package bench

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"
)

// Each stack, leaf first, lands in the cause and the caller the rules of
// causes.go give it.
func TestSampleCause(t *testing.T) {
	for _, tc := range []struct {
		name   string
		frames []string // leaf first
		cause  int
		caller int
	}{
		{"GC worker", []string{"runtime.scanobject", "runtime.gcDrain", "runtime.gcBgMarkWorker.func2", "runtime.systemstack", "runtime.gcBgMarkWorker", "runtime.goexit"}, causeGC, forRuntime},
		{"GC assist inside a Marshal is GC's", []string{"runtime.scanobject", "runtime.gcAssistAlloc1", "runtime.gcAssistAlloc", "runtime.mallocgc",
			"google.golang.org/protobuf/proto.MarshalOptions.marshal", "google.golang.org/grpc/encoding/proto.(*codecV2).Marshal",
			"google.golang.org/grpc.(*Server).sendResponse", "google.golang.org/grpc.(*Server).processUnaryRPC", "google.golang.org/grpc.(*Server).handleStream", "runtime.goexit"}, causeGC, forGRPCServer},
		{"idle scheduler", []string{"runtime.futex", "runtime.futexsleep", "runtime.notesleep", "runtime.stopm", "runtime.findRunnable", "runtime.schedule", "runtime.park_m", "runtime.mcall"}, causeSched, forRuntime},
		{"stack growth", []string{"runtime.memmove", "runtime.copystack", "runtime.newstack", "runtime.morestack", "github.com/volplane/volplane/services/binder.(*Controller).sync"}, causeStack, forOwn},
		{"a TLS write's syscall", []string{"internal/runtime/syscall.Syscall6", "syscall.Syscall", "syscall.write", "internal/poll.(*FD).Write", "net.(*conn).Write",
			"crypto/tls.(*Conn).write", "crypto/tls.(*Conn).Write", "google.golang.org/grpc/internal/transport.(*bufWriter).Flush", "google.golang.org/grpc/internal/transport.(*loopyWriter).run", "runtime.goexit"}, causeSyscall, forGRPCTransport},
		{"a TLS write's encryption", []string{"crypto/internal/fips140/aes/gcm.gcmAesEnc", "crypto/tls.(*halfConn).encrypt", "crypto/tls.(*Conn).Write",
			"net/http.(*http2Framer).WriteData", "net/http.(*http2serverConn).writeFrameAsync", "runtime.goexit"}, causeCrypto, forHTTP2Conn},
		{"HTTP/2 framing, malloc passed over", []string{"runtime.mallocgc", "runtime.makeslice", "net/http.(*http2Framer).ReadFrame", "net/http.(*http2serverConn).readFrames", "runtime.goexit"}, causeFraming, forHTTP2Conn},
		{"a handler's work is not framing", []string{"k8s.io/apiserver/pkg/admission.(*chain).Admit", "k8s.io/apiserver/pkg/endpoints/handlers.createHandler.func1",
			"net/http.HandlerFunc.ServeHTTP", "net/http.(*http2serverConn).runHandler", "runtime.goexit"}, causeOther, forHTTPServer},
		{"decode under the REST client", []string{"runtime.mallocgc", "k8s.io/api/core/v1.(*PersistentVolumeClaim).Unmarshal", "k8s.io/apimachinery/pkg/runtime/serializer/protobuf.(*Serializer).Decode",
			"k8s.io/client-go/rest.Result.Into", "github.com/volplane/volplane/services/binder.(*Controller).bind", "golang.org/x/sync/errgroup.(*Group).Go.func1", "runtime.goexit"}, causeDecode, forOwn},
		{"encode: a generated Size", []string{"k8s.io/api/core/v1.(*ObjectMeta).Size", "k8s.io/api/core/v1.(*PersistentVolume).Size",
			"k8s.io/apiserver/pkg/storage/cacher.(*cacheWatcher).processInterval", "runtime.goexit"}, causeEncode, forOwn},
		{"protobuf consume is decode", []string{"google.golang.org/protobuf/internal/impl.consumeBytes", "google.golang.org/protobuf/internal/impl.(*MessageInfo).unmarshalPointer",
			"go.etcd.io/etcd/client/v3.(*watchGRPCStream).run", "runtime.goexit"}, causeDecode, forEtcd},
		{"etcd transactions", []string{"context.WithValue", "go.etcd.io/etcd/client/v3.(*txn).Commit", "k8s.io/apiserver/pkg/storage/etcd3.(*store).GuaranteedUpdate",
			"net/http.(*http2serverConn).runHandler", "runtime.goexit"}, causeEtcd, forHTTPServer},
		{"API requests", []string{"net/url.(*URL).String", "k8s.io/client-go/rest.(*Request).URL", "k8s.io/client-go/rest.(*Request).Do",
			"k8s.io/kubernetes/pkg/controller/volume/persistentvolume.(*PersistentVolumeController).volumeWorker", "k8s.io/apimachinery/pkg/util/wait.JitterUntil", "runtime.goexit"}, causeAPI, forOwn},
		{"informer handler", []string{"k8s.io/client-go/tools/cache.(*threadSafeMap).Update", "k8s.io/client-go/tools/cache.(*processorListener).run", "k8s.io/apimachinery/pkg/util/wait.Until", "runtime.goexit"}, causeOther, forInformers},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := sampleCause(tc.frames); got != tc.cause {
				t.Errorf("cause %q, want %q", causeNames[got], causeNames[tc.cause])
			}
			if got := onBehalfOf(tc.frames); got != tc.caller {
				t.Errorf("on behalf of %q, want %q", forNames[got], forNames[tc.caller])
			}
		})
	}
}

// synthetic is a CPU profile whose samples have the given stacks (leaf
// first) and CPU nanoseconds; the last stack's leaf is an inlined frame.
func synthetic(stacks [][]string, ns []int64) *profile.Profile {
	p := &profile.Profile{
		SampleType: []*profile.ValueType{{Type: "samples", Unit: "count"}, {Type: "cpu", Unit: "nanoseconds"}},
		PeriodType: &profile.ValueType{Type: "cpu", Unit: "nanoseconds"},
		Period:     10_000_000,
	}
	funcs := map[string]*profile.Function{}
	fn := func(name string) *profile.Function {
		if f, ok := funcs[name]; ok {
			return f
		}
		f := &profile.Function{ID: uint64(len(funcs) + 1), Name: name}
		funcs[name] = f
		p.Function = append(p.Function, f)
		return f
	}
	for i, stack := range stacks {
		var locs []*profile.Location
		for j, name := range stack {
			loc := &profile.Location{ID: uint64(len(p.Location) + 1), Line: []profile.Line{{Function: fn(name)}}}
			if i == len(stacks)-1 && j == 1 {
				// The leaf inlined into its caller: one location, two lines.
				loc = locs[0]
				loc.Line = append(loc.Line, profile.Line{Function: fn(name)})
				continue
			}
			p.Location = append(p.Location, loc)
			locs = append(locs, loc)
		}
		p.Sample = append(p.Sample, &profile.Sample{Location: locs, Value: []int64{ns[i] / 10_000_000, ns[i]}})
	}
	return p
}

var syntheticStacks = [][]string{
	{"runtime.scanobject", "runtime.gcDrain", "runtime.gcBgMarkWorker", "runtime.goexit"},
	{"syscall.Syscall", "internal/poll.(*FD).Write", "net.(*conn).Write", "github.com/volplane/volplane/services/binder.run", "runtime.goexit"},
	{"google.golang.org/protobuf/internal/impl.appendBytes", "google.golang.org/protobuf/proto.MarshalOptions.marshal", "github.com/volplane/volplane/services/binder.run", "runtime.goexit"},
	{"runtime.memmove", "go.etcd.io/etcd/client/v3.(*txn).Commit", "github.com/volplane/volplane/pkg/coord.(*Fence).Write", "runtime.goexit"},
}

// classify weighs samples by their CPU, reads inlined frames, and its
// fractions add up to one in each view.
func TestClassify(t *testing.T) {
	s := classify(synthetic(syntheticStacks, []int64{40e6, 30e6, 20e6, 10e6}))
	if s.samples != 4 {
		t.Fatalf("samples %d, want 4", s.samples)
	}
	want := map[int]float64{causeGC: 0.4, causeSyscall: 0.3, causeEncode: 0.2, causeEtcd: 0.1}
	var sum, sumFor float64
	for c := range numCauses {
		if math.Abs(s.cause[c]-want[c]) > 1e-9 {
			t.Errorf("%s: %.3f, want %.3f", causeNames[c], s.cause[c], want[c])
		}
		sum += s.cause[c]
	}
	for c := range numFor {
		sumFor += s.caller[c]
	}
	if math.Abs(sum-1) > 1e-9 || math.Abs(sumFor-1) > 1e-9 {
		t.Errorf("fractions add up to %.3f and %.3f, want 1", sum, sumFor)
	}
	if math.Abs(s.caller[forRuntime]-0.4) > 1e-9 || math.Abs(s.caller[forOwn]-0.6) > 1e-9 {
		t.Errorf("on behalf of: runtime %.3f, own %.3f; want 0.4 and 0.6", s.caller[forRuntime], s.caller[forOwn])
	}
}

// printCauses reads <process>.pprof for the processes of the result and
// splits each one's measured CPU per claim.
func TestPrintCauses(t *testing.T) {
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, "binder.pprof"))
	if err != nil {
		t.Fatal(err)
	}
	if err := synthetic(syntheticStacks, []int64{40e6, 30e6, 20e6, 10e6}).Write(f); err != nil {
		t.Fatal(err)
	}
	f.Close()
	r := &Result{System: "volplane", Claims: 1000, Procs: []ProcUsage{
		{Name: "binder", Binds: true, Measured: 2 * time.Second}, // 2 ms per claim
		{Name: "etcd", Measured: time.Second},                    // no profile: no row
	}}
	var b bytes.Buffer
	if err := printCauses(&b, r, dir); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	// 2 ms, of which the profile's 100 ms of samples are 5 %: GC 0.8, scheduling 0, stack 0, syscalls 0.6, crypto 0, framing 0, encode 0.4, decode 0, etcd 0.2, API 0, other 0.
	if row := "| binder | 2.000 | 4 | 5 % | 0.800 | 0.000 | 0.000 | 0.600 | 0.000 | 0.000 | 0.400 | 0.000 | 0.200 | 0.000 | 0.000 |"; !strings.Contains(out, row) {
		t.Errorf("no row %q in\n%s", row, out)
	}
	if strings.Contains(out, "| etcd |") {
		t.Errorf("a row for a process without a profile:\n%s", out)
	}
}
