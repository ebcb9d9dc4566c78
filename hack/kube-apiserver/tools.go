//go:build tools

// Package tools pins the kube-apiserver command so that `go mod tidy` keeps
// everything it needs in go.sum.
package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
