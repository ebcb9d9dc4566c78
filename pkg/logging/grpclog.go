package logging

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"

	"google.golang.org/grpc/grpclog"
)

// RouteGRPC makes log gRPC's logger (logger=grpc). gRPC's own logger
// prints only errors by default; here its info and warnings go to Debug
// (they are per connection attempt: "addrConn.createTransport failed to
// connect ..." on every retry), its errors to Error. Its verbosity
// (V(n)) follows $GRPC_GO_LOG_VERBOSITY_LEVEL, as with gRPC's logger.
func RouteGRPC(log *slog.Logger) {
	v, _ := strconv.Atoi(os.Getenv("GRPC_GO_LOG_VERBOSITY_LEVEL"))
	grpclog.SetLoggerV2(&grpcLogger{log: log.With("logger", "grpc"), verbosity: v})
}

type grpcLogger struct {
	log       *slog.Logger
	verbosity int
}

var _ grpclog.LoggerV2 = (*grpcLogger)(nil)

func (g *grpcLogger) emit(level slog.Level, msg string) {
	ctx := context.Background()
	if !g.log.Enabled(ctx, level) {
		return
	}
	g.log.Log(ctx, level, strings.TrimSpace(msg))
}

func (g *grpcLogger) Info(args ...any)   { g.emit(slog.LevelDebug, fmt.Sprint(args...)) }
func (g *grpcLogger) Infoln(args ...any) { g.emit(slog.LevelDebug, fmt.Sprintln(args...)) }
func (g *grpcLogger) Infof(format string, args ...any) {
	g.emit(slog.LevelDebug, fmt.Sprintf(format, args...))
}
func (g *grpcLogger) Warning(args ...any)   { g.emit(slog.LevelDebug, fmt.Sprint(args...)) }
func (g *grpcLogger) Warningln(args ...any) { g.emit(slog.LevelDebug, fmt.Sprintln(args...)) }
func (g *grpcLogger) Warningf(format string, args ...any) {
	g.emit(slog.LevelDebug, fmt.Sprintf(format, args...))
}
func (g *grpcLogger) Error(args ...any)   { g.emit(slog.LevelError, fmt.Sprint(args...)) }
func (g *grpcLogger) Errorln(args ...any) { g.emit(slog.LevelError, fmt.Sprintln(args...)) }
func (g *grpcLogger) Errorf(format string, args ...any) {
	g.emit(slog.LevelError, fmt.Sprintf(format, args...))
}

// Fatal logs at Error and exits 1, as gRPC requires.
func (g *grpcLogger) Fatal(args ...any) { g.emit(slog.LevelError, fmt.Sprint(args...)); os.Exit(1) }
func (g *grpcLogger) Fatalln(args ...any) {
	g.emit(slog.LevelError, fmt.Sprintln(args...))
	os.Exit(1)
}
func (g *grpcLogger) Fatalf(format string, args ...any) {
	g.emit(slog.LevelError, fmt.Sprintf(format, args...))
	os.Exit(1)
}

// V reports whether gRPC's verbosity level l is on.
func (g *grpcLogger) V(l int) bool { return l <= g.verbosity }
