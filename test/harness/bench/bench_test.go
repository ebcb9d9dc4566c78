package bench

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/test/harness/devenv"
)

func TestPercentile(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = i + 1
	}
	for _, tc := range []struct {
		name   string
		sorted []time.Duration
		want   Latency
	}{
		{"one", ms(7), Latency{P50: 7 * time.Millisecond, P90: 7 * time.Millisecond, P99: 7 * time.Millisecond, Max: 7 * time.Millisecond}},
		{"hundred", ms(hundred...), Latency{P50: 50 * time.Millisecond, P90: 90 * time.Millisecond, P99: 99 * time.Millisecond, Max: 100 * time.Millisecond}},
		{"ten", ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), Latency{P50: 5 * time.Millisecond, P90: 9 * time.Millisecond, P99: 10 * time.Millisecond, Max: 10 * time.Millisecond}},
		{"none", nil, Latency{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := summarize(tc.sorted); got != tc.want {
				t.Fatalf("summarize = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestRatesFlag(t *testing.T) {
	for _, tc := range []struct {
		in      []string
		want    Rates
		wantErr bool
	}{
		{in: []string{"25,50,100"}, want: Rates{25, 50, 100}},
		{in: []string{"10", " 2.5 ,"}, want: Rates{10, 2.5}},
		{in: []string{"0"}, wantErr: true},
		{in: []string{"-5"}, wantErr: true},
		{in: []string{"fast"}, wantErr: true},
		{in: []string{"NaN"}, wantErr: true},
	} {
		t.Run(strings.Join(tc.in, "|"), func(t *testing.T) {
			var r Rates
			var err error
			for _, s := range tc.in {
				if err = r.Set(s); err != nil {
					break
				}
			}
			if (err != nil) != tc.wantErr {
				t.Fatalf("Set(%q) error %v, want error %v", tc.in, err, tc.wantErr)
			}
			if !tc.wantErr && !slices.Equal(r, tc.want) {
				t.Fatalf("rates %v, want %v", r, tc.want)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    Options
		want string // substring of the error; "" for none
	}{
		{"default", Options{N: 10}, ""},
		{"no claims", Options{}, "n must be positive"},
		{"ceiling and kcm", Options{N: 1, Ceiling: true, KCM: "kcm"}, "does not go with --kube-controller-manager"},
		{"ceiling and vs-ceiling", Options{N: 1, Ceiling: true, VsCeiling: 2}, "choose one"},
		{"vs-ceiling with rates", Options{N: 1, VsCeiling: 2, Rates: Rates{10}, Duration: time.Second}, "does not go with --rate"},
		{"rate without duration", Options{N: 1, Rates: Rates{10}}, "positive --duration"},
		{"dynamic kcm alone", Options{N: 1, Dynamic: true, KCM: "kcm"}, "--external-provisioner"},
		{"external provisioner static", Options{N: 1, KCM: "kcm", ExternalProvisioner: "p"}, "goes with --dynamic"},
		{"negative existing", Options{N: 1, Existing: -1}, "existing must not be negative"},
		{"negative binders", Options{N: 1, Binders: -1}, "binders must not be negative"},
		{"binders and kcm", Options{N: 1, Binders: 2, KCM: "kcm"}, "does not go with --kube-controller-manager or --ceiling"},
		{"binders and ceiling", Options{N: 1, Binders: 2, Ceiling: true}, "does not go with --kube-controller-manager or --ceiling"},
		{"two binders vs ceiling", Options{N: 1, Binders: 2, VsCeiling: 1}, ""},
		{"rate with existing", Options{N: 1, Rates: Rates{10}, Duration: time.Second, Existing: 5}, ""},
		{"compare", Options{N: 1, Compare: 1, Sizes: Sizes{1000, 10000}, KCM: "kcm", ExternalProvisioner: "p"}, ""},
		{"compare without kcm", Options{N: 1, Compare: 1}, "needs --kube-controller-manager and --external-provisioner"},
		{"compare without external provisioner", Options{N: 1, Compare: 1, KCM: "kcm"}, "needs --kube-controller-manager and --external-provisioner"},
		{"compare with vs-ceiling", Options{N: 1, Compare: 1, VsCeiling: 1, KCM: "kcm", ExternalProvisioner: "p"}, "does not go with --ceiling, --vs-ceiling"},
		{"compare with binders", Options{N: 1, Compare: 1, Binders: 2, KCM: "kcm", ExternalProvisioner: "p"}, "does not go with"},
		{"service flag", Options{N: 1, ServiceFlags: []string{"--timeline=false"}}, ""},
		{"service flag without dashes", Options{N: 1, ServiceFlags: []string{"timeline=false"}}, "want --name or --name=value"},
		{"negative compare", Options{N: 1, Compare: -1}, "compare must not be negative"},
		{"sizes without compare", Options{N: 1, Sizes: Sizes{10}}, "--sizes goes with --compare"},
		{"bad size", Options{N: 1, Compare: 1, Sizes: Sizes{0}, KCM: "kcm", ExternalProvisioner: "p"}, "sizes must be positive"},
		{"delete", Options{N: 1, Dynamic: true, Delete: true}, ""},
		{"delete with kcm", Options{N: 1, Dynamic: true, Delete: true, KCM: "kcm", ExternalProvisioner: "p"}, ""},
		{"delete with kcm alone", Options{N: 1, Dynamic: true, Delete: true, KCM: "kcm"}, "--external-provisioner"},
		{"delete static", Options{N: 1, Delete: true}, "goes with --dynamic"},
		{"delete ceiling", Options{N: 1, Dynamic: true, Delete: true, Ceiling: true}, "does not go with --ceiling or --vs-ceiling"},
		{"delete vs-ceiling", Options{N: 1, Dynamic: true, Delete: true, VsCeiling: 2}, "does not go with --ceiling or --vs-ceiling"},
		{"delete with rates", Options{N: 1, Dynamic: true, Delete: true, Rates: Rates{10}, Duration: time.Second}, "burst of deletions"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.o.validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("validate: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("validate: %v, want an error with %q", err, tc.want)
			}
		})
	}
}

func TestSchedule(t *testing.T) {
	t.Run("every arrival, open loop", func(t *testing.T) {
		// Each create blocks until the last one has started: a closed loop
		// would never get there.
		const n = 20
		var mu sync.Mutex
		started := map[int]bool{}
		release := make(chan struct{})
		_, err := schedule(t.Context(), 1000, n, func(i int) error {
			mu.Lock()
			started[i] = true
			if len(started) == n {
				close(release)
			}
			mu.Unlock()
			<-release
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(started) != n {
			t.Fatalf("%d creates, want %d", len(started), n)
		}
	})
	t.Run("an error stops the arrivals", func(t *testing.T) {
		boom := errors.New("boom")
		var mu sync.Mutex
		calls := 0
		_, err := schedule(t.Context(), 200, 1000, func(i int) error {
			mu.Lock()
			calls++
			mu.Unlock()
			return boom
		})
		if !errors.Is(err, boom) {
			t.Fatalf("err %v, want boom", err)
		}
		if calls >= 1000 {
			t.Fatalf("all %d arrivals were sent after the first error", calls)
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if _, err := schedule(ctx, 1, 10, func(int) error { return nil }); !errors.Is(err, context.Canceled) {
			t.Fatalf("err %v, want context.Canceled", err)
		}
	})
}

func TestArrivals(t *testing.T) {
	for _, tc := range []struct {
		rate float64
		d    time.Duration
		want int
	}{
		{25, 30 * time.Second, 750},
		{10, 5 * time.Second, 50},
		{2.5, time.Second, 3},
		{1, 100 * time.Millisecond, 1},
	} {
		if got := arrivals(tc.rate, tc.d); got != tc.want {
			t.Errorf("arrivals(%g, %s) = %d, want %d", tc.rate, tc.d, got, tc.want)
		}
	}
}

func TestParseProc(t *testing.T) {
	status := "Name:\tbinder\nVmPeak:\t 2000 kB\nVmHWM:\t   65432 kB\nVmRSS:\t 60000 kB\n"
	// pid (comm with a space and parens) state ppid ... utime=14th stime=15th field.
	stat := "1234 (my (odd) name) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 8 0 100 1000 100"
	s, err := parseProc(status, stat)
	if err != nil {
		t.Fatal(err)
	}
	if s.peakRSS != 65432<<10 {
		t.Errorf("peak RSS %d, want %d", s.peakRSS, 65432<<10)
	}
	if s.cpu != 3250*time.Millisecond {
		t.Errorf("cpu %s, want 3.25s", s.cpu)
	}
	if _, err := parseProc(status, "garbage"); err == nil {
		t.Error("parseProc accepted a malformed stat")
	}
}

const apiMetrics = `# HELP apiserver_request_total Counter of apiserver requests.
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="persistentvolumeclaims",scope="resource",subresource="",verb="POST",version="v1"} 10
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="persistentvolumeclaims",scope="resource",subresource="status",verb="PUT",version="v1"} 7
apiserver_request_total{code="409",component="apiserver",dry_run="",group="",resource="persistentvolumeclaims",scope="resource",subresource="status",verb="PUT",version="v1"} 1
apiserver_request_total{code="200",component="",dry_run="",group="",resource="",scope="",subresource="/metrics",verb="GET",version=""} 3
# HELP etcd_requests_total Etcd request counts for each operation and object type.
# TYPE etcd_requests_total counter
etcd_requests_total{group="",operation="update",resource="persistentvolumeclaims"} 8
# HELP apiserver_longrunning_requests Gauge of all active long-running apiserver requests.
# TYPE apiserver_longrunning_requests gauge
apiserver_longrunning_requests{component="apiserver",group="",resource="persistentvolumes",scope="cluster",subresource="",verb="WATCH",version="v1"} 2
apiserver_longrunning_requests{component="apiserver",group="",resource="pods",scope="namespace",subresource="log",verb="CONNECT",version="v1"} 1
`

const etcdMetrics = `# TYPE grpc_server_msg_received_total counter
grpc_server_msg_received_total{grpc_method="Txn",grpc_service="etcdserverpb.KV",grpc_type="unary"} 42
grpc_server_msg_received_total{grpc_method="Check",grpc_service="grpc.health.v1.Health",grpc_type="unary"} 5
`

func TestMetricFamilies(t *testing.T) {
	api, err := parseMetrics(strings.NewReader(apiMetrics))
	if err != nil {
		t.Fatal(err)
	}
	etcd, err := parseMetrics(strings.NewReader(etcdMetrics))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		got  counts
		want counts
	}{
		{"requests by verb and resource, codes summed, non-resource left out", familyAPI.sum(api),
			counts{"POST persistentvolumeclaims": 10, "PUT persistentvolumeclaims/status": 8}},
		{"apiserver to etcd", familyAPIEtcd.sum(api), counts{"update persistentvolumeclaims": 8}},
		{"open watches only", familyWatches.sum(api), counts{"persistentvolumes": 2}},
		{"etcd without health checks", familyEtcd.sum(etcd), counts{"Txn": 42}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if len(tc.got) != len(tc.want) {
				t.Fatalf("got %v, want %v", tc.got, tc.want)
			}
			for k, v := range tc.want {
				if tc.got[k] != v {
					t.Fatalf("got %v, want %v", tc.got, tc.want)
				}
			}
		})
	}
	t.Run("deltas and totals", func(t *testing.T) {
		after := counts{"POST persistentvolumeclaims": 10, "PUT persistentvolumeclaims/status": 8, "GET pods": 1}
		before := counts{"POST persistentvolumeclaims": 4, "PUT persistentvolumeclaims/status": 8}
		d := after.minus(before)
		if len(d) != 2 || d["POST persistentvolumeclaims"] != 6 || d["GET pods"] != 1 {
			t.Fatalf("minus = %v", d)
		}
		if got := d.total("POST ", "PUT "); got != 6 {
			t.Fatalf("writes = %g, want 6", got)
		}
		if got := d.total(); got != 7 {
			t.Fatalf("total = %g, want 7", got)
		}
	})
}

func TestExistingPopulation(t *testing.T) {
	const n = 4000
	bound, provisioned := 0, 0
	classes := map[string]int{}
	modes := map[corev1.PersistentVolumeAccessMode]int{}
	for i := range n {
		pv, claim := existingPair(i)
		pv2, claim2 := existingPair(i)
		if pv.Name != pv2.Name || pv.Spec.CSI.VolumeHandle != pv2.Spec.CSI.VolumeHandle || (claim == nil) != (claim2 == nil) {
			t.Fatalf("existingPair(%d) differs between calls", i)
		}
		if pv.Spec.StorageClassName == benchClass {
			t.Fatalf("existing volume %s is of the bench's class", pv.Name)
		}
		classes[pv.Spec.StorageClassName]++
		modes[pv.Spec.AccessModes[0]]++
		if pv.Annotations[kube.AnnDynamicallyProvisioned] != "" {
			provisioned++
			if pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete || len(pv.Finalizers) != 1 {
				t.Fatalf("provisioned volume %s: policy %s, finalizers %v", pv.Name, pv.Spec.PersistentVolumeReclaimPolicy, pv.Finalizers)
			}
		}
		if claim == nil {
			continue
		}
		bound++
		size, want := claim.Spec.Resources.Requests[corev1.ResourceStorage], pv.Spec.Capacity[corev1.ResourceStorage]
		if claim.Spec.VolumeName != pv.Name || *claim.Spec.StorageClassName != pv.Spec.StorageClassName ||
			!slices.Equal(claim.Spec.AccessModes, pv.Spec.AccessModes) || size.Cmp(want) != 0 {
			t.Fatalf("claim %s/%s does not match its volume %s", claim.Namespace, claim.Name, pv.Name)
		}
	}
	share := func(k int) float64 { return 100 * float64(k) / n }
	for _, tc := range []struct {
		name     string
		got, set float64
	}{
		{"bound", share(bound), existingBound},
		{"provisioned", share(provisioned), existingProvisioned},
		{"class standard", share(classes["standard"]), 50},
		{"mode RWO", share(modes[corev1.ReadWriteOnce]), 70},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.got < tc.set-4 || tc.got > tc.set+4 {
				t.Fatalf("%.1f %%, want about %g %%", tc.got, tc.set)
			}
		})
	}
}

func TestPlace(t *testing.T) {
	two, four := devenv.CPUSet{0, 1}, devenv.CPUSet{0, 1, 2, 3}
	for _, tc := range []struct {
		name      string
		o         Options
		available devenv.CPUSet
		cp, rest  string
		want      string // substring of the error; "" for none
	}{
		{name: "shared by default", available: two, cp: "any", rest: "any"},
		{name: "split halves", o: Options{Placement: PlacementSplit}, available: four, cp: "0-1", rest: "2-3"},
		{name: "split two", o: Options{Placement: PlacementSplit}, available: two, cp: "0", rest: "1"},
		{name: "split chosen", o: Options{Placement: PlacementSplit, ControlPlaneCPUs: devenv.CPUSet{3}}, available: four, cp: "3", rest: "0-2"},
		{name: "split one cpu", o: Options{Placement: PlacementSplit}, available: devenv.CPUSet{0}, want: "needs at least 2 CPUs"},
		{name: "split all to the control plane", o: Options{Placement: PlacementSplit, ControlPlaneCPUs: two}, available: two, want: "leaves no CPU"},
		{name: "cpu not available", o: Options{Placement: PlacementSplit, ControlPlaneCPUs: devenv.CPUSet{7}}, available: two, want: "not one this process may use"},
		{name: "cpus without split", o: Options{ControlPlaneCPUs: devenv.CPUSet{0}}, available: two, want: "goes with --placement split"},
		{name: "unknown", o: Options{Placement: "spread"}, available: two, want: "want shared or split"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.o.place(tc.available)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("place: %v, want an error with %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cp, rest := tc.o.controlPlane.String(), tc.o.others.String(); cp != tc.cp || rest != tc.rest {
				t.Fatalf("place: control plane %s, others %s; want %s, %s", cp, rest, tc.cp, tc.rest)
			}
		})
	}
}

func TestSizesFlag(t *testing.T) {
	var s Sizes
	if err := s.Set("1000, 10000,"); err != nil {
		t.Fatal(err)
	}
	if s.String() != "1000,10000" {
		t.Fatalf("sizes %s, want 1000,10000", s.String())
	}
	for _, bad := range []string{"0", "-3", "many"} {
		if err := new(Sizes).Set(bad); err == nil {
			t.Errorf("Set(%q) took it", bad)
		}
	}
}

// The comparison's table shows both systems' means and their ratio.
func TestPrintCompare(t *testing.T) {
	run := func(perSecond float64, cpu time.Duration, api float64) *Result {
		return &Result{Claims: 100, PerSecond: perSecond, Latency: Latency{P50: time.Second, P99: 2 * time.Second},
			Procs:    []ProcUsage{{Name: "b", Binds: true, Measured: 100 * cpu, PeakRSS: 1 << 20}, {Name: "kube-apiserver", Measured: 100 * time.Millisecond}},
			Requests: &Requests{API: counts{"PUT persistentvolumes": api * 100}}}
	}
	v := &cell{system: "volplane", claims: 100, runs: []*Result{run(200, time.Millisecond, 5), run(100, 3*time.Millisecond, 5)}}
	k := &cell{system: "kube-controller-manager", claims: 100, runs: []*Result{run(50, 6*time.Millisecond, 6)}}
	var b strings.Builder
	printCompare(&b, &Options{Compare: 2, Placement: PlacementShared}, [][2]*cell{{v, k}})
	out := b.String()
	for _, want := range []string{
		"| 100 | static | volplane | 150.0 | 1.00 s | 2.00 s | 2.00 ms | 1.0 MiB | 5.00 (5.00) | 1.00 ms |",
		"| 100 | static | kube-controller-manager | 50.0 |",
		"| 100 | static | volplane ÷ kcm | 3.00× | 1.00× | 1.00× | 0.33× | 1.00× | 0.83× | 1.00× |",
		"| 100 | static | PUT persistentvolumes | 5.00 | 6.00 | -1.00 |",
		"| 100 | static | reads (GET, LIST, WATCH) | 0.00 | 0.00 | +0.00 |",
		"| 100 | static | total | 5.00 | 6.00 | -1.00 |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}
