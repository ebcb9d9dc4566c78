package cmdutil

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"k8s.io/klog/v2"
)

func TestKlogGoesThroughTheServiceLogger(t *testing.T) {
	var buf bytes.Buffer
	RouteKlog(slog.New(slog.NewJSONHandler(&buf, nil)).With("component", "test"))
	klog.InfoS("watch of *v1.PersistentVolume ended", "reason", "too old")
	klog.V(4).InfoS("chatty") // below Info: not logged at level info
	klog.Flush()
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("got %d lines, want 1: %q", len(lines), buf.String())
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &m); err != nil {
		t.Fatalf("klog's line is not the logger's JSON: %q: %v", lines[0], err)
	}
	if m["msg"] != "watch of *v1.PersistentVolume ended" || m["reason"] != "too old" || m["component"] != "test" || m["logger"] != "client-go" {
		t.Fatalf("line %v", m)
	}
}
