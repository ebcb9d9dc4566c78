package logging

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// ErrorKey is the key every log line puts its error under.
const ErrorKey = "error"

// Formats are the values of --log-format.
var Formats = []string{"text", "json"}

// New returns the structured logger of a volplane process: text or JSON
// on w, at level ("debug", "info", "warn" or "error"), with the component's
// name on every line.
func New(w io.Writer, component, level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(strings.ToUpper(level))); err != nil {
		return nil, fmt.Errorf("log level %q: want debug, info, warn or error", level)
	}
	hopts := &slog.HandlerOptions{Level: lv}
	var h slog.Handler
	switch format {
	case "", "text":
		h = slog.NewTextHandler(w, hopts)
	case "json":
		h = slog.NewJSONHandler(w, hopts)
	default:
		return nil, fmt.Errorf("log format %q: want text or json", format)
	}
	return slog.New(h).With("component", component), nil
}

// Route makes log the logger of everything in the process that logs
// without being handed one: slog's default (TLS reloads), client-go's klog
// (reflector, leader election; logger=client-go) and gRPC's grpclog
// (logger=grpc). Call it once, before the first gRPC or client-go call.
func Route(log *slog.Logger) {
	slog.SetDefault(log)
	RouteKlog(log)
	RouteGRPC(log)
}
