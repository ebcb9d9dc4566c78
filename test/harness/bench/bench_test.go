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
