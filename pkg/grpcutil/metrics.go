package grpcutil

import (
	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"

	"github.com/volplane/volplane/pkg/metrics"
)

// The gRPC metrics of every server NewServer makes and every connection
// Dial makes (grpc_server_* and grpc_client_*: started, handled by code,
// messages, handling seconds), go-grpc-middleware's Prometheus provider,
// on the process's metrics.Registry (/metrics of --debug-address).
var (
	serverMetrics = grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram())
	clientMetrics = grpcprom.NewClientMetrics(grpcprom.WithClientHandlingTimeHistogram())
)

func init() {
	metrics.Registry.MustRegister(serverMetrics, clientMetrics)
}
