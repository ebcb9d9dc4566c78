// Package callers says which volplane service may call which RPC, and
// enforces it on every volplane gRPC server.
//
// Mutual TLS proves that a caller holds a certificate of the services' CA;
// it does not say which service the caller is, and the CA may sign more
// than the services. A caller's identity is the Common Name of its
// verified client certificate (Identity): volplane-watcher,
// volplane-binder, volplane-provisioner, volplane-reclaimer and
// volplane-gateway, as deploy/kubernetes/certificates.yaml issues them and
// test/harness/pki (make up, docker-compose, the tests, the chaos cluster)
// does too. Default is the one table that lists, for every RPC of every
// service (its full method name), the identities allowed to call it:
//
//   - the gateway, for every RPC it has a REST route for (it forwards
//     users after checking their RBAC rights);
//   - the service that calls it in the course of its work (the binder
//     provisions and hands off reclaims, the reclaimer deletes through the
//     provisioner, the binder and the provisioner stream from the
//     watcher);
//   - peers of the same service, for the calls one replica forwards to the
//     replica that owns the object;
//   - Conformance (volplane-conformance), the test harness: the
//     conformance suite and the project's own end-to-end tests and chaos
//     checks drive every RPC of a service directly, so it may call every
//     volplane RPC. deploy/ issues no such certificate; a cluster
//     administrator who issues one hands out a full credential, as issuing
//     a volplane-gateway certificate would.
//
// The gRPC health service and reflection (when --grpc-reflection turns it
// on) are open to any certificate of the CA (Any): readiness is no secret,
// and tools wait on it.
//
// A test (callers_test.go) derives every caller's calls from the code (a
// go/types scan of the packages each binary is built from) and fails when
// a call has no table entry, or an entry no code uses.
//
// A caller whose identity is not listed gets PermissionDenied naming its
// identity and the RPC. Over --insecure-plaintext there is no identity,
// and no check: plaintext lets anyone who reaches the port call anything.
package callers
