package bench

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/pprof/profile"
)

// A CPU profile's samples are split two ways, each sample counted once in
// each (its CPU nanoseconds, or its count when a profile has no cpu
// type):
//
// By cause (what the CPU did), decided by the first rule that holds:
//
//  1. The Go runtime's own work, wherever it is in the stack, in this
//     priority: GC (mark workers, assists, sweeping, scavenging), then
//     stack growth (newstack, morestack, copystack), then scheduling
//     (schedule, findRunnable, park_m, mcall, waking and readying
//     goroutines). A GC assist inside a Marshal is GC's, not encode's.
//  2. Otherwise the frame nearest the leaf that names a mechanism: syscalls
//     and network I/O (syscall, internal/poll, net), TLS and crypto
//     (crypto/…, x/crypto), HTTP/2 and gRPC transport framing (net/http's
//     and x/net's http2, grpc's internal/transport; a handler's
//     runHandler and ServeHTTP excluded, so that what a server does for a
//     request is not framing's), decode (Unmarshal, Decode, protobuf's
//     consume*), encode (Marshal, Encode, protobuf's append*/size*, the
//     generated Size methods). Frames of other packages, the runtime's
//     malloc and memmove among them, are passed over: an allocation is
//     charged to whoever allocates. Leaf-first, a write's syscall under
//     TLS under HTTP/2 is a syscall, its encryption crypto, and the rest
//     of the write framing.
//  3. Otherwise, anywhere in the stack: the etcd client (go.etcd.io/etcd/
//     client, and kube-apiserver's storage/etcd3 above it: "etcd
//     transactions"), then client-go's REST client (k8s.io/client-go/rest:
//     "API requests"), then other.
//
// On behalf of (who asked for the CPU): the first frame from the root that
// is not the runtime's, a goroutine launcher's (errgroup, wait.Until,
// sync) or a crash handler's decides: a gRPC server's handler, gRPC
// transport, an HTTP server's handler, an HTTP/2 connection's loop,
// informers and watches, the etcd client, or the process's own code; a
// stack of runtime frames only is the Go runtime's (GC workers, the idle
// scheduler).

// The causes, in the order of the table.
const (
	causeGC = iota
	causeSched
	causeStack
	causeSyscall
	causeCrypto
	causeFraming
	causeEncode
	causeDecode
	causeEtcd
	causeAPI
	causeOther
	numCauses
)

var causeNames = [numCauses]string{"GC", "scheduling", "stack growth", "syscalls, net I/O", "TLS, crypto",
	"HTTP/2, gRPC framing", "encode", "decode", "etcd client", "API requests", "other"}

// The callers of the on-behalf-of view, in the order of the table.
const (
	forRuntime = iota
	forGRPCServer
	forGRPCTransport
	forHTTPServer
	forHTTP2Conn
	forInformers
	forEtcd
	forOwn
	numFor
)

var forNames = [numFor]string{"Go runtime", "gRPC server", "gRPC transport", "HTTP server", "HTTP/2 conn",
	"informers, watches", "etcd client", "own code"}

// runtimeCause is rule 1: the runtime's own work anywhere in the stack.
func runtimeCause(frames []string) (int, bool) {
	has := func(names ...string) bool {
		for _, f := range frames {
			for _, n := range names {
				if f == n || strings.HasPrefix(f, n+".") { // closures: runtime.gcBgMarkWorker.func1
					return true
				}
			}
		}
		return false
	}
	switch {
	case has("runtime.gcBgMarkWorker", "runtime.gcAssistAlloc", "runtime.gcAssistAlloc1", "runtime.gcDrain", "runtime.gcDrainN",
		"runtime.markroot", "runtime.scanobject", "runtime.wbBufFlush", "runtime.wbBufFlush1", "runtime.bgsweep", "runtime.sweepone",
		"runtime.bgscavenge", "runtime.gcStart", "runtime.gcMarkDone", "runtime.gcMarkTermination", "runtime.GC", "runtime.deductSweepCredit",
		"runtime.(*mspan).sweep", "runtime.(*sweepLocked).sweep", "runtime.(*gcWork).balance", "runtime.gcFlushBgCredit"):
		return causeGC, true
	case has("runtime.newstack", "runtime.morestack", "runtime.morestack_noctxt", "runtime.copystack"):
		return causeStack, true
	case has("runtime.schedule", "runtime.findRunnable", "runtime.park_m", "runtime.mcall", "runtime.goschedImpl",
		"runtime.gopreempt_m", "runtime.goexit0", "runtime.stopm", "runtime.startm", "runtime.wakep", "runtime.handoffp",
		"runtime.ready", "runtime.goready", "runtime.notewakeup", "runtime.sysmon", "runtime.newproc"):
		return causeSched, true
	}
	return 0, false
}

// frameCause is rule 2 for one frame: the mechanism it names, if any.
func frameCause(f string) (int, bool) {
	prefixed := func(ps ...string) bool {
		for _, p := range ps {
			if strings.HasPrefix(f, p) {
				return true
			}
		}
		return false
	}
	lower := strings.ToLower(f)
	switch {
	case prefixed("syscall.", "internal/poll.", "net.", "golang.org/x/sys/unix.", "internal/syscall/", "internal/runtime/syscall.",
		"runtime/internal/syscall.", "runtime.entersyscall", "runtime.exitsyscall", "runtime.reentersyscall", "os.(*File)."):
		return causeSyscall, true
	case prefixed("crypto/", "vendor/golang.org/x/crypto/", "golang.org/x/crypto/"):
		return causeCrypto, true
	case prefixed("golang.org/x/net/http2", "net/http.(*http2", "net/http.http2", "google.golang.org/grpc/internal/transport."):
		if strings.Contains(f, "runHandler") || strings.Contains(f, "ServeHTTP") {
			return 0, false
		}
		return causeFraming, true
	case strings.Contains(lower, "unmarshal"), strings.Contains(lower, "decod"),
		strings.HasPrefix(f, "google.golang.org/protobuf/internal/impl.consume"),
		strings.HasPrefix(f, "github.com/json-iterator/go.(*Iterator)"):
		return causeDecode, true
	case strings.Contains(lower, "marshal"), strings.Contains(lower, "encod"),
		strings.HasPrefix(f, "google.golang.org/protobuf/internal/impl.append"),
		strings.HasPrefix(f, "google.golang.org/protobuf/internal/impl.size"),
		strings.HasPrefix(f, "github.com/json-iterator/go.(*Stream)"),
		(strings.HasPrefix(f, "k8s.io/api/") || strings.HasPrefix(f, "k8s.io/apimachinery/pkg/apis/")) && strings.HasSuffix(f, ").Size"):
		return causeEncode, true
	}
	return 0, false
}

// sampleCause is a stack's cause; frames run from the leaf to the root.
func sampleCause(frames []string) int {
	if c, ok := runtimeCause(frames); ok {
		return c
	}
	for _, f := range frames {
		if c, ok := frameCause(f); ok {
			return c
		}
	}
	for _, f := range frames {
		if strings.HasPrefix(f, "go.etcd.io/etcd/client/") || strings.HasPrefix(f, "k8s.io/apiserver/pkg/storage/etcd3") {
			return causeEtcd
		}
	}
	for _, f := range frames {
		if strings.HasPrefix(f, "k8s.io/client-go/rest.") {
			return causeAPI
		}
	}
	return causeOther
}

// onBehalfOf is the caller a stack works for; frames run from the leaf to
// the root.
func onBehalfOf(frames []string) int {
	for i := len(frames) - 1; i >= 0; i-- {
		f := frames[i]
		switch {
		case strings.HasPrefix(f, "runtime."), strings.HasPrefix(f, "runtime/"), strings.HasPrefix(f, "internal/"),
			strings.HasPrefix(f, "sync."), strings.HasPrefix(f, "golang.org/x/sync/"),
			strings.HasPrefix(f, "k8s.io/apimachinery/pkg/util/wait."), strings.HasPrefix(f, "k8s.io/apimachinery/pkg/util/runtime."),
			strings.HasPrefix(f, "k8s.io/utils/"):
			continue
		case strings.HasPrefix(f, "google.golang.org/grpc/internal/transport."):
			return forGRPCTransport
		case strings.HasPrefix(f, "google.golang.org/grpc.(*Server)"), strings.HasPrefix(f, "google.golang.org/grpc.(*serverWorker"):
			return forGRPCServer
		case strings.HasPrefix(f, "google.golang.org/grpc"):
			return forGRPCTransport
		case strings.Contains(f, "runHandler"), strings.Contains(f, "ServeHTTP"), strings.HasPrefix(f, "net/http.(*conn).serve"):
			return forHTTPServer
		case strings.HasPrefix(f, "net/http."), strings.HasPrefix(f, "golang.org/x/net/http2"):
			return forHTTP2Conn
		case strings.HasPrefix(f, "k8s.io/client-go/tools/cache"), strings.HasPrefix(f, "k8s.io/client-go/informers"),
			strings.HasPrefix(f, "k8s.io/apimachinery/pkg/watch"), strings.HasPrefix(f, "k8s.io/client-go/tools/watch"):
			return forInformers
		case strings.HasPrefix(f, "go.etcd.io/etcd/client/"):
			return forEtcd
		default:
			return forOwn
		}
	}
	return forRuntime
}

// frames is a sample's functions from the leaf to the root, inlined ones
// included (a location's first line is its innermost).
func frames(s *profile.Sample) []string {
	var out []string
	for _, loc := range s.Location {
		for _, l := range loc.Line {
			if l.Function != nil {
				out = append(out, l.Function.Name)
			}
		}
	}
	return out
}

// split is a profile's samples by cause and by caller, as fractions of
// its total.
type split struct {
	samples int           // how many samples the profile holds
	cpu     time.Duration // their CPU time (0 when the profile has no cpu type)
	cause   [numCauses]float64
	caller  [numFor]float64
}

// classify splits p's samples.
func classify(p *profile.Profile) split {
	idx, ns := len(p.SampleType)-1, false
	for i, st := range p.SampleType {
		if st.Type == "cpu" && st.Unit == "nanoseconds" {
			idx, ns = i, true
		}
	}
	var s split
	var total float64
	for _, smp := range p.Sample {
		if idx < 0 || idx >= len(smp.Value) {
			continue
		}
		v := float64(smp.Value[idx])
		f := frames(smp)
		s.cause[sampleCause(f)] += v
		s.caller[onBehalfOf(f)] += v
		s.samples++
		total += v
	}
	if ns {
		s.cpu = time.Duration(total)
	}
	if total > 0 {
		for i := range s.cause {
			s.cause[i] /= total
		}
		for i := range s.caller {
			s.caller[i] /= total
		}
	}
	return s
}

// profiled is one process's measured CPU per claim and its profile's
// split.
type profiled struct {
	name               string
	perClaim, measured time.Duration
	split              split
}

// readCauses classifies dir/<process>.pprof for every process of r that
// has one.
func readCauses(r *Result, dir string) ([]profiled, error) {
	var out []profiled
	for _, u := range r.Procs {
		f, err := os.Open(filepath.Join(dir, u.Name+".pprof"))
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		p, err := profile.Parse(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s's profile: %w", u.Name, err)
		}
		out = append(out, profiled{name: u.Name, perClaim: u.Measured / time.Duration(max(r.Claims, 1)), measured: u.Measured, split: classify(p)})
	}
	return out, nil
}

// coverage is the profile's CPU as a percentage of the measured CPU: how
// much of what the split divides the samples saw.
func coverage(profiled, measured time.Duration) string {
	if profiled <= 0 || measured <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f %%", 100*float64(profiled)/float64(measured))
}

// printCauses writes two Markdown tables: each profiled process's measured
// CPU per claim split by cause, and by caller, in proportion to its
// profile's samples.
func printCauses(w io.Writer, r *Result, dir string) error {
	ps, err := readCauses(r, dir)
	if err != nil || len(ps) == 0 {
		return err
	}
	ms := func(d time.Duration, frac float64) string {
		return fmt.Sprintf("%.3f", frac*float64(d)/float64(time.Millisecond))
	}
	fmt.Fprintf(w, "\nCPU ms per claim by cause: %s, %s, %d claims (the measured CPU per claim of each process, split in proportion to its CPU profile's samples; profiled: the profile's CPU over the measured CPU; profiles in %s)\n\n",
		r.System, r.mode(), r.Claims, dir)
	fmt.Fprintf(w, "| process | CPU ms/claim | samples | profiled | %s |\n", strings.Join(causeNames[:], " | "))
	fmt.Fprintf(w, "|---|---:|---:|---:|%s\n", strings.Repeat("---:|", numCauses))
	for _, p := range ps {
		cells := make([]string, numCauses)
		for i := range cells {
			cells[i] = ms(p.perClaim, p.split.cause[i])
		}
		fmt.Fprintf(w, "| %s | %s | %d | %s | %s |\n", p.name, ms(p.perClaim, 1), p.split.samples, coverage(p.split.cpu, p.measured), strings.Join(cells, " | "))
	}
	fmt.Fprintf(w, "\nCPU ms per claim on behalf of (the first frame from the root that is not the runtime's or a goroutine launcher's)\n\n")
	fmt.Fprintf(w, "| process | CPU ms/claim | %s |\n", strings.Join(forNames[:], " | "))
	fmt.Fprintf(w, "|---|---:|%s\n", strings.Repeat("---:|", numFor))
	for _, p := range ps {
		cells := make([]string, numFor)
		for i := range cells {
			cells[i] = ms(p.perClaim, p.split.caller[i])
		}
		fmt.Fprintf(w, "| %s | %s | %s |\n", p.name, ms(p.perClaim, 1), strings.Join(cells, " | "))
	}
	return nil
}
