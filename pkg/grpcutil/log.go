package grpcutil

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// NewLogger returns the structured logger every volplane binary uses: text
// or JSON on w, at the given level ("debug", "info", "warn", "error"), with
// the component name on every line.
func NewLogger(w io.Writer, component, level, format string) (*slog.Logger, error) {
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
