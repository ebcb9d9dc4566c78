// Package kubectlplugin is kubectl-volplane, the kubectl plugin for
// volplane's REST gateway, built as kubectl's commands are (cobra,
// k8s.io/cli-runtime):
//
//   - reads (volplane-viewer): claims, volumes, drivers, operations,
//     reclaims, orphans, explain pvc NAME, match -f FILE;
//   - writes (volplane-operator): sync pvc|pv NAME, reclaim retry|start
//     VOLUME, volumes delete-backing VOLUME, orphans delete --driver D
//     --volume-id ID; the two that delete ask (y/N) on a terminal unless
//     --yes, and refuse without one. The gateway has no route to cancel a
//     reclaim, so there is no such command.
//
// The kubeconfig is loaded by cli-runtime's ConfigFlags, as kubectl
// loads it, and the gateway is sent the credential the kubeconfig's user
// sends the API server (a bearer token, a token file, a credential
// plugin's token or a client certificate); the gateway authenticates it
// by TokenReview or its client CA and authorizes it by RBAC. --as and
// its kin are refused: the gateway has no impersonation, and would act
// as the credential's user. --certificate-authority is the gateway's CA.
// The gateway is --gateway URL, else the Service
// volplane-system/volplane-gateway read through the API server (see
// findGateway).
//
// Output: lists are paged through and printed as metav1.Tables by
// cli-runtime's table printer (-o wide, --no-headers); -o
// json|yaml|jsonpath=|go-template=... print the gateway's answer through
// cli-runtime's printers; -o name prints the Kubernetes object behind
// each item; explain and match are laid out as kubectl describe lays out
// an object (describe.go), the decision first and no unset field.
// Completion is cobra's; kubectl runs the binary as
// kubectl_complete-volplane (CompletionExecutable) to complete `kubectl
// volplane ...`. docs/kubectl-plugin.md is the user's guide.
package kubectlplugin
