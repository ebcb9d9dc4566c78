package devcsi

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// HangMode says what a hanging call does when its context ends before a
// test releases it.
type HangMode int

const (
	// HangAbandon: the call returns the context's error and does nothing;
	// no volume is created (a driver that lost the request).
	HangAbandon HangMode = iota
	// HangComplete: the call returns the context's error to the caller,
	// and then runs anyway with a context that is never cancelled, so the
	// volume IS created (a slow driver that keeps working after the caller
	// gave up). The server's graceful stop waits for that work.
	HangComplete
)

func (m HangMode) String() string {
	switch m {
	case HangAbandon:
		return "hang"
	case HangComplete:
		return "hang-complete"
	}
	return "HangMode(" + strconv.Itoa(int(m)) + ")"
}

// Fault is what the injector does to the calls of one method. The zero
// Fault passes every call through. Per call, in this order: Delay, then a
// failure while FailCount lasts, then a hang while HangCount lasts, then the
// real handler.
type Fault struct {
	// Delay is added to every call (the call returns early with the
	// context's error if its context ends first).
	Delay time.Duration
	// FailCount is how many of the next calls fail with Code and Message;
	// a negative count fails every call.
	FailCount int
	// Code is the gRPC code of injected failures; OK is taken as
	// Unavailable.
	Code codes.Code
	// Message is the failures' message; default "injected fault".
	Message string
	// HangCount is how many of the next calls hang (after Delay, when they
	// do not fail); a negative count hangs every call. A hanging call
	// blocks until Release, after which it runs normally, or until its
	// context ends, after which Hang decides.
	HangCount int
	// Hang says what a hanging call does when its context ends first.
	Hang HangMode
}

// Faults is a gRPC unary server interceptor that injects programmed faults
// per CSI method, for tests (from Go, at run time) and for `make up` users
// (the --fault flag). Methods are named by their short name, e.g.
// "CreateVolume"; a full name such as "/csi.v1.Controller/CreateVolume"
// works too. The zero value is ready to use and passes everything through;
// it is safe for concurrent use.
type Faults struct {
	mu    sync.Mutex
	state map[string]*methodFaults
}

type methodFaults struct {
	fault   Fault
	release chan struct{} // closed by Release; replaced after
	calls   int           // calls received
	hanging int           // calls blocked in a hang right now
	failed  int           // calls failed by injection
	handled int           // calls whose handler returned (including background ones)
}

// methodName reduces "/csi.v1.Controller/CreateVolume" to "CreateVolume".
func methodName(m string) string {
	if i := strings.LastIndexByte(m, '/'); i >= 0 {
		return m[i+1:]
	}
	return m
}

// get returns the method's record; f.mu must be held.
func (f *Faults) get(method string) *methodFaults {
	method = methodName(method)
	if f.state == nil {
		f.state = map[string]*methodFaults{}
	}
	m := f.state[method]
	if m == nil {
		m = &methodFaults{release: make(chan struct{})}
		f.state[method] = m
	}
	return m
}

// Set replaces the method's fault. Calls hanging under the previous fault
// keep hanging until Release or their context ends.
func (f *Faults) Set(method string, fault Fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.get(method).fault = fault
}

// Get returns the method's current fault (its counts are what is left).
func (f *Faults) Get(method string) Fault {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.get(method).fault
}

// Delay makes every call of method take at least d longer.
func (f *Faults) Delay(method string, d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.get(method).fault.Delay = d
}

// FailNext makes the next n calls of method fail with code and msg (n < 0:
// every call until changed).
func (f *Faults) FailNext(method string, n int, code codes.Code, msg string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := f.get(method)
	m.fault.FailCount, m.fault.Code, m.fault.Message = n, code, msg
}

// HangNext makes the next n calls of method hang (n < 0: every call until
// Release) in the given mode.
func (f *Faults) HangNext(method string, n int, mode HangMode) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := f.get(method)
	m.fault.HangCount, m.fault.Hang = n, mode
}

// Release lets every call of method that hangs right now run normally,
// stops further calls from hanging, and returns how many it released.
func (f *Faults) Release(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := f.get(method)
	m.fault.HangCount = 0
	n := m.hanging
	close(m.release)
	m.release = make(chan struct{})
	return n
}

// Clear removes the method's fault (its counters stay). Hanging calls are
// released.
func (f *Faults) Clear(method string) {
	f.Release(method)
	f.Set(method, Fault{})
}

// Reset removes every fault, releases every hanging call and zeroes the
// counters.
func (f *Faults) Reset() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range f.state {
		close(m.release)
	}
	f.state = nil
}

// Calls is how many calls of method arrived (faulted or not).
func (f *Faults) Calls(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.get(method).calls
}

// Hanging is how many calls of method are blocked in a hang right now; poll
// it to know a call has reached the hang.
func (f *Faults) Hanging(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.get(method).hanging
}

// Failed is how many calls of method failed by injection.
func (f *Faults) Failed(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.get(method).failed
}

// Handled is how many calls of method reached the driver and returned,
// including HangComplete calls finishing after their caller gave up; poll
// it to know background work is done.
func (f *Faults) Handled(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.get(method).handled
}

// UnaryServerInterceptor returns the interceptor that applies the faults.
func (f *Faults) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		return f.intercept(ctx, info.FullMethod, req, handler)
	}
}

// action is what one call does, decided at its arrival.
type action struct {
	m       *methodFaults // its counters (kept even if Reset drops them)
	delay   time.Duration
	fail    error
	hang    bool
	mode    HangMode
	release <-chan struct{}
}

func (f *Faults) arrive(method string) action {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := f.get(method)
	m.calls++
	a := action{m: m, delay: m.fault.Delay}
	fl := &m.fault
	switch {
	case fl.FailCount != 0:
		if fl.FailCount > 0 {
			fl.FailCount--
		}
		code, msg := fl.Code, fl.Message
		if code == codes.OK {
			code = codes.Unavailable
		}
		if msg == "" {
			msg = "injected fault"
		}
		a.fail = status.Error(code, msg)
	case fl.HangCount != 0:
		if fl.HangCount > 0 {
			fl.HangCount--
		}
		a.hang, a.mode, a.release = true, fl.Hang, m.release
		m.hanging++
	}
	return a
}

func (f *Faults) count(m *methodFaults, fn func(m *methodFaults)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(m)
}

func (f *Faults) intercept(ctx context.Context, method string, req any, handler grpc.UnaryHandler) (any, error) {
	a := f.arrive(method)
	if a.delay > 0 {
		t := time.NewTimer(a.delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	if a.fail != nil {
		f.count(a.m, func(m *methodFaults) { m.failed++ })
		return nil, a.fail
	}
	run := func(ctx context.Context) (any, error) {
		resp, err := handler(ctx, req)
		f.count(a.m, func(m *methodFaults) { m.handled++ })
		return resp, err
	}
	if !a.hang {
		return run(ctx)
	}
	select {
	case <-a.release:
		f.count(a.m, func(m *methodFaults) { m.hanging-- })
		return run(ctx)
	case <-ctx.Done():
	}
	f.count(a.m, func(m *methodFaults) { m.hanging-- })
	err := status.FromContextError(ctx.Err()).Err()
	if a.mode == HangComplete {
		// The caller is gone; finish the work as a slow driver would.
		_, _ = run(context.WithoutCancel(ctx))
	}
	return nil, err
}

// Parse programs one fault from its command-line form, METHOD=ACTION:
//
//	CreateVolume=delay:2s             every call waits 2s first
//	CreateVolume=unavailable:2        the next 2 calls fail with Unavailable
//	CreateVolume=resource_exhausted:*:disk full
//	                                  every call fails, with that message
//	CreateVolume=hang                 every call hangs until its context ends; nothing is done
//	CreateVolume=hang:1               only the next call hangs
//	CreateVolume=hang-complete:1      the next call hangs until its context ends, then is carried out
//
// A failure is any gRPC code name (case does not matter: unavailable,
// DEADLINE_EXCEEDED, internal, ...), then an optional count (default 1; "*"
// for every call) and an optional message. Several actions for one method
// combine (a delay and a failure, say). The method is a CSI method's short
// name (CreateVolume, NodePublishVolume, Probe, ...).
func (f *Faults) Parse(spec string) error {
	method, act, ok := strings.Cut(spec, "=")
	method, act = strings.TrimSpace(method), strings.TrimSpace(act)
	if !ok || method == "" || act == "" {
		return fmt.Errorf("fault %q: want METHOD=ACTION, e.g. CreateVolume=unavailable:2", spec)
	}
	if !knownMethods[methodName(method)] {
		return fmt.Errorf("fault %q: %q is not a CSI method (e.g. CreateVolume, DeleteVolume, NodePublishVolume)", spec, method)
	}
	word, rest, _ := strings.Cut(act, ":")
	count := func(s string) (int, error) {
		switch s {
		case "":
			return 1, nil
		case "*":
			return -1, nil
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return 0, fmt.Errorf("fault %q: count %q: want a positive number or *", spec, s)
		}
		return n, nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	fl := &f.get(method).fault
	switch strings.ToLower(word) {
	case "delay":
		d, err := time.ParseDuration(rest)
		if err != nil || d < 0 {
			return fmt.Errorf("fault %q: delay %q: want a duration such as 500ms or 2s", spec, rest)
		}
		fl.Delay = d
	case "hang", "hang-complete":
		n := -1
		if rest != "" {
			var err error
			if n, err = count(rest); err != nil {
				return err
			}
		}
		fl.HangCount, fl.Hang = n, HangAbandon
		if strings.ToLower(word) == "hang-complete" {
			fl.Hang = HangComplete
		}
	default:
		var code codes.Code
		if err := code.UnmarshalJSON([]byte(strconv.Quote(strings.ToUpper(word)))); err != nil || code == codes.OK {
			return fmt.Errorf("fault %q: %q is not delay, hang, hang-complete or a gRPC error code (unavailable, internal, ...)", spec, word)
		}
		n, msg, _ := strings.Cut(rest, ":")
		c, err := count(n)
		if err != nil {
			return err
		}
		fl.FailCount, fl.Code, fl.Message = c, code, msg
	}
	return nil
}

// knownMethods are the CSI methods this driver serves.
var knownMethods = func() map[string]bool {
	m := map[string]bool{}
	for _, d := range []grpc.ServiceDesc{csi.Identity_ServiceDesc, csi.Controller_ServiceDesc, csi.Node_ServiceDesc} {
		for _, md := range d.Methods {
			m[md.MethodName] = true
		}
	}
	return m
}()
