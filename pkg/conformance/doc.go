// Package conformance checks that an implementation of one of volplane's
// service APIs (volplane.provisioner.v1, volplane.reclaimer.v1,
// volplane.watcher.v1, volplane.binder.v1) keeps the contract the protos
// and the service READMEs state, so that any one service can be replaced
// by another implementation: what csi-sanity is for CSI drivers.
//
// A Suite dials the implementation (mutual TLS as every volplane service
// serves it, grpcutil.TLSFiles) and runs its Checks one at a time. Each
// check asserts one part of the contract: the gRPC health service, the
// codes for bad input (InvalidArgument, NotFound, FailedPrecondition as
// documented, never Internal or Unknown for the caller's mistake),
// idempotency (the same Provision twice gives one volume and the same
// answer; DeleteVolume of a deleted volume finishes again), outcomes, the
// watch stream's ordering, resume and relist rules, and the binder's reads
// and bindings. Checks that need Kubernetes objects take a client
// (Config.Kube) and work in namespaces and objects they create and delete
// (all labelled LabelRun); without a client they are skipped.
//
// The command volplane-conformance runs a suite from the command line;
// Go tests call RunTest. docs/conformance.md describes every check.
package conformance
