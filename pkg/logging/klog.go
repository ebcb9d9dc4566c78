package logging

import (
	"log/slog"

	"k8s.io/klog/v2"
)

// RouteKlog sends client-go's klog output through log (logger=client-go):
// klog's errors, warnings and info at slog's Error, Warn and Info, its
// verbose V(n) lines at slog.Level(-n), below Info (shown from
// --log-level=debug). What an operator must see of client-go's retries
// against an unreachable API server, which client-go logs at V(2), the
// services report themselves, as an Outage of the API server.
func RouteKlog(log *slog.Logger) {
	klog.SetSlogLogger(log.With("logger", "client-go"))
}
