// Package health is what a volplane service tells its kubelet on the debug
// port: /readyz, whether it can do its job now, and /livez, whether the
// process still makes progress.
//
// Readiness is a list of named checks (AddReadiness), each an error that
// says why the check fails ("etcd-session: not established (etcd at
// https://volplane-etcd:2379)"). The service's readiness loop (Loop)
// evaluates them at a fixed interval and sets its gRPC health from the
// verdict; /readyz serves that same last verdict, check by check, so the
// kubelet, the Service endpoints and gRPC clients never disagree. A verdict
// older than a few intervals (the loop stopped) is not served as current.
//
// Liveness is a list of heartbeats (Heartbeat): loops that tick whatever
// their dependencies do. /livez fails only when one of them has not ticked
// for its timeout, a wedged process that a restart cures; a replica that
// merely waits for etcd or the API server stays live (and not ready). Loop
// beats the heartbeat "readiness-loop".
//
// Both answer 200 or 503 with a body listing every check:
//
//	[+]etcd-session ok
//	[-]api-server failed: no answer for 12s: connection refused
//	readyz check failed
package health
