// Package grpcutil is the gRPC plumbing every volplane service shares: a
// server with the standard health service, a Serve that drains gracefully
// when its context ends, and a client dialer.
//
// Services talk mutual TLS (TLSFiles): every server requires a client
// certificate signed by the services' CA, every client verifies the
// server's, and the files are reloaded when they change, so certificates
// rotate without a restart. A certificate of the CA is not enough: every
// server authorizes each call by the caller's identity, its
// certificate's Common Name, against the table of pkg/callers
// (ServerOptions.Callers), and refuses the others with PermissionDenied. Plaintext exists only as an explicit choice
// (TLSFiles.InsecurePlaintext, for local experiments and tests) and for
// CSI drivers, whose unix sockets are plaintext by convention (NewCSIServer,
// DialCSI).
//
// NewServer's interceptors log every call with its caller (the peer
// certificate's common name and the end user the gateway passes in the
// volplane-user, volplane-groups and volplane-uid metadata), writes at
// info level and secrets stripped (Sanitize); turn a panic in a handler
// into an Internal error, logged once with its stack; and the server sets
// explicit message size limits and a handshake timeout. Reflection is off
// unless asked for. A request that protobuf cannot decode (nested deeper
// than its recursion limit, or not protobuf) is the caller's mistake:
// InvalidArgument, logged as a rejected call, never reaching the handler
// (grpc-go alone would answer Internal and log nothing).
//
// Trace context crosses every call made through Dial and DialCSI as W3C
// traceparent metadata when the caller's context carries a span, and
// NewServer's handlers get it as their remote parent (trace.go), so that a
// claim's timeline spans (pkg/timeline) form one OpenTelemetry trace across
// services and into the CSI driver. Nothing here makes or exports a span.
package grpcutil
