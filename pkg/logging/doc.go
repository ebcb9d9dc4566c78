// Package logging gives every volplane process one logger: log/slog, in
// the format --log-format asks (text or JSON), which also receives what
// the libraries underneath print: client-go's klog, gRPC's grpclog and the
// etcd client's zap logger (Route, Zap, EtcdClient).
//
// It holds the conventions an operator relies on when reading the logs:
//
//   - Errors are logged under one key, ErrorKey ("error"); a test of this
//     package fails when any slog call in the tree uses another.
//   - An outage of something a service depends on (the API server, etcd, a
//     watcher stream, a CSI driver) is logged once at warning when it starts
//     and once at info when it ends, with its duration, not once per retry
//     (Outage).
//   - A line about a claim carries its key (namespace/name) and UID (Claim,
//     ClaimRef).
package logging
