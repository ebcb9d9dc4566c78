package logging

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/grpclog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
)

// lines decodes the JSON lines of buf.
func lines(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("not one JSON line: %q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

func jsonLogger(buf *bytes.Buffer, level slog.Level) *slog.Logger {
	return slog.New(slog.NewJSONHandler(buf, &slog.HandlerOptions{Level: level})).With("component", "test")
}

func TestNew(t *testing.T) {
	for _, tc := range []struct {
		level, format string
		ok            bool
	}{
		{"info", "text", true}, {"DEBUG", "json", true}, {"warn", "", true},
		{"loud", "text", false}, {"info", "yaml", false},
	} {
		t.Run(tc.level+"/"+tc.format, func(t *testing.T) {
			_, err := New(&bytes.Buffer{}, "x", tc.level, tc.format)
			if (err == nil) != tc.ok {
				t.Fatalf("New(%q, %q): %v", tc.level, tc.format, err)
			}
		})
	}
}

func TestEtcdClientLogsThroughSlog(t *testing.T) {
	var buf bytes.Buffer
	z := EtcdClient(jsonLogger(&buf, slog.LevelInfo))
	z.Warn("retrying of unary invoker failed", zap.String("target", "etcd-endpoints://0x1/127.0.0.1:2379"), zap.Error(errors.New("connection refused")))
	z.Warn("lease keepalive response queue is full; dropping response send", zap.Int("queue_size", 16))
	z.Debug("retrying of unary invoker", zap.Uint("attempt", 1))
	z.With(zap.String("endpoint", "a")).Error("streamer failed to create ClientStream", zap.Error(errors.New("boom")))
	got := lines(t, &buf)
	if len(got) != 2 {
		t.Fatalf("got %d lines, want 2 (the retry's warning and the debug line at Debug): %s", len(got), buf.String())
	}
	if got[0]["level"] != "WARN" || got[0]["logger"] != "etcd-client" || got[0]["component"] != "test" || got[0]["queue_size"] != float64(16) {
		t.Errorf("warning: %v", got[0])
	}
	if got[1]["level"] != "ERROR" || got[1]["error"] != "boom" || got[1]["endpoint"] != "a" {
		t.Errorf("error: %v", got[1])
	}

	buf.Reset()
	z = EtcdClient(jsonLogger(&buf, slog.LevelDebug))
	z.Warn("retrying of unary invoker failed", zap.Error(errors.New("connection refused")))
	if got := lines(t, &buf); len(got) != 1 || got[0]["level"] != "DEBUG" || got[0]["error"] != "connection refused" {
		t.Errorf("a retry at level debug: %v", got)
	}
}

func TestGRPCLogsThroughSlog(t *testing.T) {
	var buf bytes.Buffer
	RouteGRPC(jsonLogger(&buf, slog.LevelInfo))
	grpclog.Infof("[core] channel %d created", 1)
	grpclog.Warning("[core] addrConn.createTransport failed to connect")
	grpclog.Errorf("[transport] %s", "bad thing")
	got := lines(t, &buf)
	if len(got) != 1 || got[0]["level"] != "ERROR" || got[0]["msg"] != "[transport] bad thing" || got[0]["logger"] != "grpc" {
		t.Fatalf("got %v, want only the error", got)
	}
}

func TestKlogGoesThroughTheServiceLogger(t *testing.T) {
	var buf bytes.Buffer
	RouteKlog(jsonLogger(&buf, slog.LevelInfo))
	klog.InfoS("watch of *v1.PersistentVolume ended", "reason", "too old")
	klog.V(4).InfoS("chatty") // below Info: not logged at level info
	klog.Flush()
	got := lines(t, &buf)
	if len(got) != 1 || got[0]["msg"] != "watch of *v1.PersistentVolume ended" || got[0]["reason"] != "too old" || got[0]["component"] != "test" || got[0]["logger"] != "client-go" {
		t.Fatalf("got %v", got)
	}
}

func TestOutageLogsItsStartAndEndOnce(t *testing.T) {
	var buf bytes.Buffer
	o := NewOutage(jsonLogger(&buf, slog.LevelInfo), "etcd", "endpoints", "http://127.0.0.1:2379")
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	o.now = func() time.Time { return now }
	if o.Recovered() {
		t.Fatal("Recovered without an outage reported one")
	}
	if !o.Failed(errors.New("connection refused"), "attempt", 1) {
		t.Fatal("the first failure did not start the outage")
	}
	for i := range 5 {
		now = now.Add(time.Second)
		if o.Failed(errors.New("connection refused"), "attempt", i+2) {
			t.Fatal("a retry started another outage")
		}
	}
	if down, since := o.Down(); !down || !since.Equal(now.Add(-5*time.Second)) {
		t.Fatalf("Down() = %v, %v", down, since)
	}
	now = now.Add(25 * time.Second)
	if !o.Recovered() || o.Recovered() {
		t.Fatal("Recovered should end the outage once")
	}
	got := lines(t, &buf)
	if len(got) != 2 {
		t.Fatalf("got %d lines at level info, want 2: %s", len(got), buf.String())
	}
	if got[0]["level"] != "WARN" || got[0]["msg"] != "etcd unreachable" || got[0]["error"] != "connection refused" || got[0]["endpoints"] != "http://127.0.0.1:2379" {
		t.Errorf("start: %v", got[0])
	}
	if got[1]["level"] != "INFO" || got[1]["msg"] != "etcd reachable again" || got[1]["after"] != float64(30*time.Second) || got[1]["failures"] != float64(6) {
		t.Errorf("end: %v", got[1])
	}
	// The next outage is reported again.
	buf.Reset()
	o.Failed(errors.New("timeout"))
	if got := lines(t, &buf); len(got) != 1 || got[0]["msg"] != "etcd unreachable" {
		t.Fatalf("second outage: %v", got)
	}
}

// A probe sent during an outage that times out after another attempt
// ended the outage is not a new outage (the flap TestEtcdOutage caught:
// "reachable again", "unreachable", "reachable again" 50 ms apart).
func TestOutageIgnoresAStaleFailure(t *testing.T) {
	var buf bytes.Buffer
	o := NewOutage(jsonLogger(&buf, slog.LevelInfo), "etcd")
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	o.now = func() time.Time { return now }
	o.Failed(errors.New("connection refused"))
	probe := now.Add(time.Second) // sent during the outage
	now = now.Add(18 * time.Second)
	o.Recovered()
	now = now.Add(50 * time.Millisecond)
	if o.FailedAt(probe, errors.New("context deadline exceeded")) {
		t.Fatal("a probe from before the recovery started an outage")
	}
	if down, _ := o.Down(); down {
		t.Fatal("down after a stale failure")
	}
	// A failure of an attempt that began after the recovery is a new
	// outage, as is one that gives no start.
	if !o.FailedAt(now, errors.New("connection refused")) {
		t.Fatal("a fresh failure did not start an outage")
	}
	o.Recovered()
	if !o.Failed(errors.New("connection refused")) {
		t.Fatal("Failed without a start did not start an outage")
	}
	got := lines(t, &buf)
	var msgs []string
	for _, l := range got {
		msgs = append(msgs, l["msg"].(string))
	}
	want := []string{"etcd unreachable", "etcd reachable again", "etcd unreachable", "etcd reachable again", "etcd unreachable"}
	if !slices.Equal(msgs, want) {
		t.Fatalf("lines %v, want %v", msgs, want)
	}
}

func TestClaim(t *testing.T) {
	var buf bytes.Buffer
	log := jsonLogger(&buf, slog.LevelInfo)
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "data", UID: "1234"}}
	log.Info("bound", Claim(pvc), "volume", "pv-1")
	log.Info("journal", ClaimRef("ns", "data", ""))
	log.Info("none", Claim(nil))
	got := lines(t, &buf)
	if got[0]["claim"] != "ns/data" || got[0]["claimUID"] != "1234" || got[0]["volume"] != "pv-1" {
		t.Errorf("Claim: %v", got[0])
	}
	if _, ok := got[1]["claimUID"]; got[1]["claim"] != "ns/data" || ok {
		t.Errorf("ClaimRef without UID: %v", got[1])
	}
	if _, ok := got[2]["claim"]; ok {
		t.Errorf("Claim(nil): %v", got[2])
	}
}
