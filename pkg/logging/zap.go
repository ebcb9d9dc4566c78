package logging

import (
	"context"
	"log/slog"
	"slices"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Zap returns a zap logger that writes into log: each zap entry becomes
// one slog record at the matching level (DPanic and above at Error), its
// fields slog attributes, its logger name the "logger" attribute. The
// messages named in debug are logged at Debug whatever their level: a
// library's per-retry complaints, whose outage the caller reports itself.
func Zap(log *slog.Logger, debug ...string) *zap.Logger {
	return zap.New(&zapCore{h: log.Handler(), min: zapcore.DebugLevel, debug: debug})
}

// ZapAt is Zap that also drops the entries below min, for a library whose
// own log level is set apart from the process's (etcd's --etcd-log-level):
// an entry is logged when both levels let it through.
func ZapAt(log *slog.Logger, min zapcore.Level) *zap.Logger {
	return zap.New(&zapCore{h: log.Handler(), min: min})
}

// etcdClientRetries are the etcd client's warnings on each failed retry of
// a call or of the lease keep-alive stream; an etcd outage is reported
// once by the Keeper instead (coord).
var etcdClientRetries = []string{
	"retrying of unary invoker failed",
	"retrying RecvMsg",
	"error occurred during lease keep alive loop",
	"error occurred during lease keep alive request sending",
}

// EtcdClient is the logger for an etcd client (clientv3.Config.Logger):
// Zap with logger=etcd-client, the client's per-retry warnings at Debug.
func EtcdClient(log *slog.Logger) *zap.Logger {
	return Zap(log, etcdClientRetries...).Named("etcd-client")
}

type zapCore struct {
	h     slog.Handler
	min   zapcore.Level
	debug []string
}

var _ zapcore.Core = (*zapCore)(nil)

func slogLevel(l zapcore.Level) slog.Level {
	switch {
	case l <= zapcore.DebugLevel:
		return slog.LevelDebug
	case l == zapcore.InfoLevel:
		return slog.LevelInfo
	case l == zapcore.WarnLevel:
		return slog.LevelWarn
	default:
		return slog.LevelError
	}
}

func (c *zapCore) Enabled(l zapcore.Level) bool {
	if l < c.min {
		return false
	}
	// A demoted message is checked again in Write.
	return c.h.Enabled(context.Background(), slogLevel(l)) || (len(c.debug) > 0 && c.h.Enabled(context.Background(), slog.LevelDebug))
}

func (c *zapCore) With(fields []zapcore.Field) zapcore.Core {
	return &zapCore{h: c.h.WithAttrs(attrs(fields)), min: c.min, debug: c.debug}
}

func (c *zapCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *zapCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	level := slogLevel(e.Level)
	if slices.Contains(c.debug, e.Message) {
		level = slog.LevelDebug
	}
	ctx := context.Background()
	if !c.h.Enabled(ctx, level) {
		return nil
	}
	r := slog.NewRecord(e.Time, level, e.Message, 0)
	if e.LoggerName != "" {
		r.AddAttrs(slog.String("logger", e.LoggerName))
	}
	r.AddAttrs(attrs(fields)...)
	return c.h.Handle(ctx, r)
}

func (c *zapCore) Sync() error { return nil }

// attrs converts zap fields, in order, to slog attributes with the values
// zap's JSON encoder would write (an error as its message, under its key,
// which is "error" for zap.Error).
func attrs(fields []zapcore.Field) []slog.Attr {
	out := make([]slog.Attr, 0, len(fields))
	for _, f := range fields {
		enc := zapcore.NewMapObjectEncoder()
		f.AddTo(enc)
		keys := make([]string, 0, len(enc.Fields))
		for k := range enc.Fields {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			out = append(out, slog.Any(k, enc.Fields[k]))
		}
	}
	return out
}
