package binder

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	"github.com/volplane/volplane/pkg/kube"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// hangingProvisioner serves every class and answers a call only when the
// test releases it, with a new volume for the claim.
type hangingProvisioner struct {
	release chan struct{}
	calls   atomic.Int32
}

var _ provisioner = (*hangingProvisioner)(nil)

func (h *hangingProvisioner) Serves(context.Context, string) bool { return true }

func (h *hangingProvisioner) Provision(ctx context.Context, c *corev1.PersistentVolumeClaim, _ *storagev1.StorageClass) (provisionResult, error) {
	h.calls.Add(1)
	select {
	case <-h.release:
	case <-ctx.Done():
		return provisionResult{}, ctx.Err()
	}
	v := testVolume("pvc-" + string(c.UID))
	v.Spec.ClaimRef = &corev1.ObjectReference{Namespace: c.Namespace, Name: c.Name, UID: c.UID}
	return provisionResult{outcome: provisionerv1.Outcome_OUTCOME_FINISHED, volume: v}, nil
}

func TestProvisioningRunsOffTheWorkers(t *testing.T) {
	ctx := t.Context()
	mode := storagev1.VolumeBindingImmediate
	class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "c"}, Provisioner: "p", VolumeBindingMode: &mode}
	claim := testClaim("data")
	pvName := "pvc-" + string(claim.UID)
	client := fake.NewClientset(claim, class)
	recorder := record.NewFakeRecorder(100)
	c := newController(slog.New(slog.NewTextHandler(io.Discard, nil)), client, recorder)
	hp := &hangingProvisioner{release: make(chan struct{})}
	c.provisioner = hp
	c.store.putClass(class)
	c.store.putClaim(claim.DeepCopy())

	sync := func() {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- c.syncClaim(ctx, c.store.claim(claimKey(claim))) }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the claim's sync waits for the provisioner")
		}
	}
	sync()
	for deadline := time.Now().Add(10 * time.Second); hp.calls.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the provisioner was not called")
		}
	}
	sync() // while the call hangs: no second call, no second event
	if n := hp.calls.Load(); n != 1 {
		t.Fatalf("%d provisioner calls, want 1", n)
	}
	if n := countEvents(recorder, kube.EventExternalProvisioning); n != 1 {
		t.Fatalf("%d ExternalProvisioning events, want 1", n)
	}

	// The volume the provisioner makes appears in the API as it would.
	pv := testVolume(pvName)
	pv.Spec.ClaimRef = &corev1.ObjectReference{Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID}
	if _, err := client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	close(hp.release)
	key, _ := c.claimQueue.Get() // the finished call queues the claim
	if key != claimKey(claim) {
		t.Fatalf("queued %q", key)
	}
	c.claimQueue.Done(key)
	sync()
	got, err := client.CoreV1().PersistentVolumeClaims(claim.Namespace).Get(ctx, claim.Name, metav1.GetOptions{})
	if err != nil || got.Spec.VolumeName != pvName || got.Status.Phase != corev1.ClaimBound {
		t.Fatalf("claim after the call: %v %v", got, err)
	}
}

func TestAProvisioningResultIsForItsClaimUIDOnly(t *testing.T) {
	p := newProvisions(1, DefaultRetryIntervalStart, DefaultRetryIntervalMax)
	done := make(chan string, 1)
	p.start(t.Context(), "ns/data", types.UID("old"), func(context.Context) (provisionResult, error) {
		return provisionResult{outcome: provisionerv1.Outcome_OUTCOME_FINISHED}, nil
	}, func(k string) { done <- k })
	<-done
	if _, ok := p.take("ns/data", types.UID("new")); ok {
		t.Fatal("a claim recreated under the same name got the old claim's result")
	}
	if _, ok := p.take("ns/data", types.UID("old")); ok {
		t.Fatal("a result was taken twice")
	}
}

func countEvents(r *record.FakeRecorder, reason string) int {
	n := 0
	for {
		select {
		case e := <-r.Events:
			if strings.Contains(e, reason) {
				n++
			}
		default:
			return n
		}
	}
}

// listDrivers is a provisioner client whose ListDrivers answers from a
// channel, so a test controls when it answers.
type listDrivers struct {
	provisionerv1.ProvisionerServiceClient
	answers chan []string
	calls   atomic.Int32
}

func (l *listDrivers) ListDrivers(ctx context.Context, _ *provisionerv1.ListDriversRequest, _ ...grpc.CallOption) (*provisionerv1.ListDriversResponse, error) {
	l.calls.Add(1)
	select {
	case names := <-l.answers:
		out := &provisionerv1.ListDriversResponse{}
		for _, n := range names {
			out.Drivers = append(out.Drivers, &provisionerv1.Driver{ProvisionerName: n})
		}
		return out, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func TestServesWaitsOnlyForTheFirstAnswer(t *testing.T) {
	l := &listDrivers{answers: make(chan []string, 1)}
	p := newProvisionerClient(l, slog.New(slog.NewTextHandler(io.Discard, nil)))
	l.answers <- []string{"a"}
	if !p.Serves(t.Context(), "a") || p.Serves(t.Context(), "b") {
		t.Fatal("first answer not used")
	}
	if n := l.calls.Load(); n != 1 {
		t.Fatalf("%d ListDrivers calls within the TTL, want 1", n)
	}
	// The refresh of a stale answer in the background, without blocking
	// the caller, is pkg/served's (TestStaleAnswersAtOnceAndRefreshesBehind).
}

// The waits between provisioning attempts of a claim are
// external-provisioner's: --retry-interval-start, doubled per failure, at
// most --retry-interval-max; per claim; a finished call starts over.
func TestProvisioningRetriesBackOffAsExternalProvisioner(t *testing.T) {
	for _, tc := range []struct {
		name       string
		start, max time.Duration
		want       []time.Duration
	}{
		{"defaults", DefaultRetryIntervalStart, DefaultRetryIntervalMax, []time.Duration{
			time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second,
			64 * time.Second, 128 * time.Second, 256 * time.Second, 5 * time.Minute, 5 * time.Minute}},
		{"flags", 250 * time.Millisecond, 2 * time.Second, []time.Duration{
			250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 2 * time.Second}},
		{"start equals max", 3 * time.Second, 3 * time.Second, []time.Duration{3 * time.Second, 3 * time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newProvisions(1, tc.start, tc.max)
			for i, want := range tc.want {
				if got := p.retry("ns/a"); got != want {
					t.Fatalf("wait %d: %s, want %s", i+1, got, want)
				}
			}
			if got := p.retry("ns/b"); got != tc.start {
				t.Errorf("another claim's first wait: %s, want %s", got, tc.start)
			}
			p.finished("ns/a")
			if got := p.retry("ns/a"); got != tc.start {
				t.Errorf("first wait after a finished call: %s, want %s", got, tc.start)
			}
		})
	}
}

// Over 15 s of a claim that always fails, the defaults allow 5 attempts
// (at 0, 1, 3, 7 and 15 s), as external-provisioner sends 5
// ProvisioningFailed events; the old 100 ms start allowed 9.
func TestProvisioningAttemptsIn15sWithTheDefaults(t *testing.T) {
	attempts := func(start time.Duration) int {
		p := newProvisions(1, start, DefaultRetryIntervalMax)
		n, at := 1, time.Duration(0)
		for {
			at += p.retry("ns/a")
			if at > 15*time.Second {
				return n
			}
			n++
		}
	}
	if got := attempts(DefaultRetryIntervalStart); got != 5 {
		t.Errorf("attempts in 15s with the defaults: %d, want 5", got)
	}
	if got := attempts(100 * time.Millisecond); got != 8 {
		t.Errorf("attempts in 15s from 100ms: %d, want 8", got)
	}
}
