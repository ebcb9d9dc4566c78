package conformance

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"k8s.io/client-go/kubernetes"

	"github.com/volplane/volplane/pkg/grpcutil"
)

// Service names the API a suite checks.
type Service string

// The services with a suite.
const (
	Provisioner Service = "provisioner"
	Reclaimer   Service = "reclaimer"
	Watcher     Service = "watcher"
	Binder      Service = "binder"
)

// Services lists every service with a suite.
var Services = []Service{Provisioner, Reclaimer, Watcher, Binder}

// Config says what to check and with what.
type Config struct {
	// Address is the implementation's gRPC address (host:port, dns:///...
	// or unix:///path).
	Address string
	// TLS is the client side of the services' mutual TLS: the CA that
	// signs the implementation's certificate and a client certificate it
	// accepts; or InsecurePlaintext.
	TLS grpcutil.TLSFiles
	// Kube is a client of the cluster the implementation serves, allowed
	// to create and delete namespaces, claims, volumes and classes. Nil
	// skips every check that needs Kubernetes objects.
	Kube kubernetes.Interface
	// ProvisionerName is a StorageClass provisioner name. Provisioner: the
	// driver to provision with (default: the first ready driver with
	// CREATE_DELETE_VOLUME in ListDrivers). Reclaimer and binder: the
	// provisioner volumes are made by in the checks that need a
	// dynamically provisioned volume; empty skips them.
	ProvisionerName string
	// ProvisionerAddress is the provisioner the reclaimer deletes through
	// (reclaimer suite: the Delete check provisions a volume with it);
	// dialed with TLS. Empty skips that check.
	ProvisionerAddress string
	// CSIEndpoint is the CSI driver behind the provisioner (plaintext, as
	// CSI sockets are), to see the backing volumes themselves; optional.
	CSIEndpoint string
	// Timeout bounds each check; 0 means DefaultTimeout.
	Timeout time.Duration
	// HistoryWrites bounds the writes the watcher suite makes to push a
	// cursor out of the watcher's history (to check relisting); 0 means
	// DefaultHistoryWrites.
	HistoryWrites int
	// Run selects the checks whose name it matches; nil runs all.
	Run *regexp.Regexp
	// Logf, when set, receives progress lines.
	Logf func(format string, args ...any)
}

// Defaults of Config.
const (
	DefaultTimeout       = 2 * time.Minute
	DefaultHistoryWrites = 1000
)

// LabelRun is on every object a suite creates; its value names the run.
const LabelRun = "conformance.volplane.io/run"

// Check is one assertion about an implementation.
type Check struct {
	// Name is "<service>/<check>".
	Name string
	// Doc says what the check asserts.
	Doc string
	// Needs lists what the check needs beyond the address: "kube",
	// "provisioner-name", "provisioner-address". It is skipped without.
	Needs []string
	run   func(t *T)
}

// Outcome is how a check ended.
type Outcome string

// Outcomes.
const (
	Passed  Outcome = "PASS"
	Failed  Outcome = "FAIL"
	Skipped Outcome = "SKIP"
)

// Result is one check's result.
type Result struct {
	Check    string
	Outcome  Outcome
	Message  string
	Duration time.Duration
}

// Checks lists the checks of a service's suite, in the order they run.
func Checks(s Service) []Check {
	var out []Check
	switch s {
	case Provisioner:
		out = provisionerChecks()
	case Reclaimer:
		out = reclaimerChecks()
	case Watcher:
		out = watcherChecks()
	case Binder:
		out = binderChecks()
	default:
		return nil
	}
	out = append(commonChecks(s), out...)
	for i := range out {
		out[i].Name = string(s) + "/" + out[i].Name
	}
	return out
}

// Suite runs the checks of one service against one implementation.
type Suite struct {
	service Service
	cfg     Config
	conn    *grpc.ClientConn
	run     string // this run's id, the value of LabelRun

	mu   sync.Mutex
	prov *grpc.ClientConn // Config.ProvisionerAddress, dialed on first use
	csi  *grpc.ClientConn // Config.CSIEndpoint, dialed on first use
	seq  int
}

// New prepares a suite: it validates cfg and dials the address (the
// connection is made on the first call).
func New(service Service, cfg Config) (*Suite, error) {
	if Checks(service) == nil {
		return nil, fmt.Errorf("no suite for %q: use one of provisioner, reclaimer, watcher, binder", service)
	}
	if cfg.Address == "" {
		return nil, errors.New("the address of the implementation is required (--address)")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.HistoryWrites <= 0 {
		cfg.HistoryWrites = DefaultHistoryWrites
	}
	conn, err := grpcutil.Dial(cfg.Address, cfg.TLS)
	if err != nil {
		return nil, err
	}
	return &Suite{service: service, cfg: cfg, conn: conn, run: randomID(6)}, nil
}

// Checks lists the suite's checks that Config.Run selects.
func (s *Suite) Checks() []Check {
	var out []Check
	for _, c := range Checks(s.service) {
		if s.cfg.Run == nil || s.cfg.Run.MatchString(c.Name) {
			out = append(out, c)
		}
	}
	return out
}

// Close closes the suite's connections.
func (s *Suite) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range []*grpc.ClientConn{s.prov, s.csi} {
		if c != nil {
			c.Close()
		}
	}
	return s.conn.Close()
}

// Run runs one check and cleans up what it created.
func (s *Suite) Run(ctx context.Context, c Check) Result {
	start := time.Now()
	for _, n := range c.Needs {
		if why := s.missing(n); why != "" {
			return Result{Check: c.Name, Outcome: Skipped, Message: why}
		}
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	t := &T{ctx: cctx, s: s, name: c.Name}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() {
			if r := recover(); r != nil {
				t.fail(fmt.Sprintf("panic: %v", r))
			}
		}()
		c.run(t)
	}()
	<-done
	t.cleanup(ctx)
	r := Result{Check: c.Name, Outcome: Passed, Duration: time.Since(start)}
	switch {
	case len(t.failures) > 0:
		r.Outcome, r.Message = Failed, strings.Join(t.failures, "\n")
	case t.skipped != "":
		r.Outcome, r.Message = Skipped, t.skipped
	}
	return r
}

func (s *Suite) missing(need string) string {
	switch need {
	case "kube":
		if s.cfg.Kube == nil {
			return "needs a Kubernetes client (--kubeconfig)"
		}
	case "provisioner-name":
		if s.cfg.ProvisionerName == "" {
			return "needs a provisioner to make volumes with (--provisioner-name)"
		}
	case "provisioner-address":
		if s.cfg.ProvisionerAddress == "" {
			return "needs the address of the provisioner the reclaimer deletes through (--provisioner-address)"
		}
	}
	return ""
}

// Run runs every selected check of service against cfg.Address, calling
// report (if not nil) after each, and returns the results.
func Run(ctx context.Context, service Service, cfg Config, report func(Result)) ([]Result, error) {
	s, err := New(service, cfg)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	var out []Result
	for _, c := range s.Checks() {
		if ctx.Err() != nil {
			return out, ctx.Err()
		}
		r := s.Run(ctx, c)
		out = append(out, r)
		if report != nil {
			report(r)
		}
	}
	return out, nil
}

// name returns a name unique to this run for an object of the suite.
func (s *Suite) name(what string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	return fmt.Sprintf("conformance-%s-%s-%d", s.run, what, s.seq)
}

func (s *Suite) logf(format string, args ...any) {
	if s.cfg.Logf != nil {
		s.cfg.Logf(format, args...)
	}
}

func randomID(n int) string {
	const letters = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, n)
	for i := range b {
		b[i] = letters[rand.IntN(len(letters))]
	}
	return string(b)
}

// T is a running check: it collects failures, as testing.T does.
type T struct {
	ctx      context.Context
	s        *Suite
	name     string
	mu       sync.Mutex
	failures []string
	skipped  string
	cleanups []func(ctx context.Context)
}

// Context is the check's context, cancelled at its timeout.
func (t *T) Context() context.Context { return t.ctx }

func (t *T) fail(msg string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.failures = append(t.failures, msg)
}

// Errorf records a failure; the check goes on.
func (t *T) Errorf(format string, args ...any) { t.fail(fmt.Sprintf(format, args...)) }

// Fatalf records a failure and ends the check.
func (t *T) Fatalf(format string, args ...any) {
	t.fail(fmt.Sprintf(format, args...))
	runtime.Goexit()
}

// Skipf ends the check as skipped (unless it failed already).
func (t *T) Skipf(format string, args ...any) {
	t.mu.Lock()
	t.skipped = fmt.Sprintf(format, args...)
	t.mu.Unlock()
	runtime.Goexit()
}

// Logf logs progress.
func (t *T) Logf(format string, args ...any) {
	t.s.logf("    %s: %s", t.name, fmt.Sprintf(format, args...))
}

// Cleanup registers f to run after the check, last registered first.
func (t *T) Cleanup(f func(ctx context.Context)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cleanups = append(t.cleanups, f)
}

func (t *T) cleanup(parent context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), time.Minute)
	defer cancel()
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.s.logf("    %s: cleanup panicked: %v", t.name, r)
				}
			}()
			t.cleanups[i](ctx)
		}()
	}
}

// Eventually polls cond until it returns "" or the check's time is up,
// then fails the check with the last reason.
func (t *T) Eventually(what string, cond func() string) {
	if why := t.poll(cond); why != "" {
		t.Fatalf("%s: %s", what, why)
	}
}

// poll polls cond until it returns "" (then "") or the check's context
// ends (then cond's last answer).
func (t *T) poll(cond func() string) string {
	delay := 50 * time.Millisecond
	for {
		why := cond()
		if why == "" {
			return ""
		}
		select {
		case <-t.ctx.Done():
			return why
		case <-time.After(delay):
		}
		delay = min(delay*2, time.Second)
	}
}
