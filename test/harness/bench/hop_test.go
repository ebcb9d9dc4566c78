package bench

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/volplane/volplane/internal/csisidecar"
	"github.com/volplane/volplane/test/harness/devenv"
)

// --hop makes the run dynamic and refuses every mode that would measure
// something else than volplane against itself.
func TestValidateHop(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    Options
		want string // substring of the error; "" for none
	}{
		{"hop", Options{N: 10, Hop: 2}, ""},
		{"hop with existing and binders", Options{N: 10, Hop: 1, Existing: 5, Binders: 2}, ""},
		{"hop split", Options{N: 10, Hop: 1, Placement: PlacementSplit}, ""},
		{"negative hop", Options{N: 10, Hop: -1}, "hop must not be negative"},
		{"hop with kcm", Options{N: 10, Hop: 1, KCM: "kcm", ExternalProvisioner: "p"}, "--hop compares volplane with itself"},
		{"hop with external provisioner", Options{N: 10, Hop: 1, ExternalProvisioner: "p"}, "--hop compares volplane with itself"},
		{"hop with ceiling", Options{N: 10, Hop: 1, Ceiling: true}, "--hop compares volplane with itself"},
		{"hop with vs-ceiling", Options{N: 10, Hop: 1, VsCeiling: 1}, "--hop compares volplane with itself"},
		{"hop with compare", Options{N: 10, Hop: 1, Compare: 1, KCM: "kcm", ExternalProvisioner: "p"}, "--hop compares volplane with itself"},
		{"hop with rates", Options{N: 10, Hop: 1, Rates: Rates{10}, Duration: time.Second}, "--hop compares volplane with itself"},
		{"hop with delete", Options{N: 10, Hop: 1, Delete: true}, "--hop compares volplane with itself"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.o.Placement == PlacementSplit {
				if cpus, err := devenv.AvailableCPUs(); err != nil || len(cpus) < 2 {
					t.Skip("--placement split needs 2 CPUs")
				}
			}
			err := tc.o.validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("validate: %v", err)
				}
				if !tc.o.Dynamic {
					t.Fatal("--hop did not make the run dynamic")
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("validate: %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// The two ways are named apart in the reports, and only with --hop does
// the socket way say so.
func TestHopNames(t *testing.T) {
	o := &Options{N: 1, Hop: 1}
	a, b := o.name(sysVolplane), o.name(sysSidecar)
	if a == b || !strings.Contains(a, "unix socket") || !strings.Contains(b, "volplane-csi-sidecar") {
		t.Errorf("names %q and %q", a, b)
	}
	if n := (&Options{N: 1}).name(sysVolplane); n != "volplane" {
		t.Errorf("without --hop volplane is named %q", n)
	}
}

// A gives the provisioner the driver's socket; B gives it no address of
// the driver at all, only discovery, so every call of B crosses the
// sidecar.
func TestProvisionerDriverArgs(t *testing.T) {
	a := provisionerDriverArgs(sysVolplane, "/run/csi.sock")
	if !slices.Equal(a, []string{"--csi-endpoint", "unix:///run/csi.sock"}) {
		t.Errorf("A: %q", a)
	}
	b := provisionerDriverArgs(sysSidecar, "/run/csi.sock")
	if !slices.Equal(b, []string{"--discover-sidecars", "--namespace", volplaneNamespace}) {
		t.Errorf("B: %q", b)
	}
	for _, arg := range b {
		if strings.Contains(arg, "csi.sock") || strings.HasPrefix(arg, "--csi-endpoint") {
			t.Errorf("B reaches the driver directly: %q", b)
		}
	}
}

// The sidecar's command line is one the sidecar itself accepts, with no
// refusal and nothing it would log as not needed: the driver's socket,
// the kubeconfig, no leader election, the loopback port.
func TestSidecarArgs(t *testing.T) {
	o, err := csisidecar.Parse(sidecarArgs("/tmp/x/csi.sock", "/tmp/x/kubeconfig", "127.0.0.1:7710"))
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Validate(); err != nil {
		t.Fatalf("the sidecar refuses the bench's command line: %v", err)
	}
	if n := o.NotNeeded(); len(n) > 0 {
		t.Errorf("flags the sidecar does not need: %q", n)
	}
	p := o.Provisioner
	if p.CSIAddress != "/tmp/x/csi.sock" || p.Kubeconfig != "/tmp/x/kubeconfig" || p.LeaderElection || o.Listen != "127.0.0.1:7710" {
		t.Errorf("parsed %+v, listen %q", p, o.Listen)
	}
}

// The hop's table: both ways' means, the sidecar's and the driver's CPU
// apart, and B over A.
func TestPrintHop(t *testing.T) {
	run := func(perSecond float64, p50 time.Duration, volplane, side time.Duration) *Result {
		procs := []ProcUsage{{Name: "provisioner", Binds: true, Measured: 100 * volplane}, {Name: "volplane-csi", Measured: 100 * time.Millisecond},
			{Name: "kube-apiserver", Measured: time.Second}}
		if side > 0 {
			procs = append(procs, ProcUsage{Name: sidecarProc, Binds: true, Measured: 100 * side})
		}
		return &Result{Claims: 100, PerSecond: perSecond, Latency: Latency{P50: p50, P99: 2 * p50}, Procs: procs}
	}
	a := &cell{system: "A way", claims: 100, runs: []*Result{run(100, time.Second, 4*time.Millisecond, 0), run(200, time.Second, 2*time.Millisecond, 0)}}
	b := &cell{system: "B way", claims: 100, runs: []*Result{run(75, 2*time.Second, 4*time.Millisecond, 2*time.Millisecond), run(150, 2*time.Second, 2*time.Millisecond, 2*time.Millisecond)}}
	var w strings.Builder
	printHop(&w, &Options{Placement: PlacementShared}, [2]*cell{a, b})
	out := w.String()
	for _, want := range []string{
		"100 claims, 2 round(s) of A/B",
		"| A: A way | 150.0 | 1.00 s | 2.00 s | 3.00 ms | 0.00 ms | 1.00 ms |",
		"| B: B way | 112.5 | 2.00 s | 4.00 s | 5.00 ms | 2.00 ms | 1.00 ms |",
		"| B ÷ A | 0.75× | 2.00× | 2.00× | 1.67× | – | 1.00× |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}
