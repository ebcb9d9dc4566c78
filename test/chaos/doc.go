// Package chaos holds the short seeded chaos run (test/harness/chaos) that
// `make test` runs: the whole of volplane as separate processes, a small
// storm, replicas killed every few seconds, etcd, the apiserver and the
// CSI driver restarted once, and every invariant of docs/chaos.md
// checked. `make chaos` is the long run.
package chaos
