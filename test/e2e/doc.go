// Package e2e holds volplane's end-to-end tests: a real kube-apiserver and
// etcd (test/harness/devenv) with the real services' Run functions started
// in-process, exercising every branch of the binding state machine.
package e2e
