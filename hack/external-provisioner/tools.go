//go:build tools

// Package tools pins the command hack/build-external-provisioner.sh builds
// so that `go mod tidy` keeps everything it needs in go.sum.
package tools

import _ "github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner"
