//go:build tools

// Package tools pins the commands hack/build-kube.sh builds so that
// `go mod tidy` keeps everything they need in go.sum.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
)
