// Package replica is the lifecycle every volplane service shares: the
// watcher, the binder, the provisioner and the reclaimer each write only
// the wiring of their own parts, and this package owns the rest.
//
// # Flags
//
// Options are the flags the replicas of an etcd-coordinated service share
// (--kubeconfig, --kube-api-qps, --listen, --advertise-address,
// --member-id, --etcd-endpoints and its security, the TLS files,
// --debug-address, ...): AddFlags registers them, Validate checks them
// (each error names its flag) and fills their defaults, and Config turns
// them into what Start takes. The watcher, which has no etcd, builds its
// Config from its own Options.
//
// # Start
//
// Start builds, from a Config: the Kubernetes client (tuned: protobuf,
// rate limits, user agent volplane-<service>), the etcd session (a
// coord.Keeper, kept through outages; none when the Config names no etcd
// endpoint), the Event broadcaster and recorder (none for a ReadOnly
// service), the gRPC server and its listener, and the API server probe.
// Nothing runs until Run.
//
// # Readiness
//
// Readiness is composed from named checks (Replica.Health, a
// health.Checks): Start adds "etcd-session" (with etcd) and "api-server"
// (unless the service judges the API server itself, OwnAPICheck), and the
// service adds its own ("watcher-stream", "membership", "claims-informer",
// "csi-drivers", "informers", ...), each a function that returns why it
// fails. One loop, run by Run every Readiness.Every, evaluates them all:
// one failing check makes the replica NOT_SERVING, for the gRPC server
// and for each of Readiness.Services, and its name and reason are logged
// ("binder not ready" why="watcher-stream: no watcher stream yet") and
// served on /readyz; when every check passes again it is SERVING. A
// change is logged once, not at every evaluation. Services are
// NOT_SERVING, not unknown, from Start until the first verdict.
// health.Checks.Recheck asks for an evaluation at once.
//
// # Tasks and shutdown
//
// Run serves everything in one errgroup: the gRPC server, the debug server
// (/metrics, /readyz, /livez, pprof), the etcd session, the API server
// probe, the readiness loop and the service's Tasks (Until makes a Task of
// a loop that never fails). When ctx ends, or when any of them fails,
// the others' context ends: the gRPC server sets NOT_SERVING and drains
// calls in flight for DrainGrace, the etcd session is revoked (its member
// key and locks go at once), and Run returns the first error once every
// task has returned, after logging "<service> stopped". The service's
// deferred clean-ups (Close, its dialed connections) run after that.
package replica
