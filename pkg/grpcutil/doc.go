// Package grpcutil is the gRPC plumbing every volplane service shares: a
// server with the standard health service and one logging interceptor, a
// Serve that drains gracefully when its context ends, and a client dialer.
package grpcutil
