// Package kubectlplugin is kubectl-volplane, the kubectl plugin for
// volplane's REST gateway: `kubectl volplane claims|volumes|drivers|
// operations|reclaims|orphans|explain|match`.
//
// It loads the kubeconfig as kubectl does (--kubeconfig, the KUBECONFIG
// list, --context, --cluster, --user, -n defaulting to the context's
// namespace) and sends the gateway the same credential the kubeconfig's
// user sends the API server (a bearer token, a token file, a credential
// plugin's token or a client certificate); the gateway authenticates it by
// TokenReview or its client CA and authorizes it by RBAC. The gateway is
// --gateway URL, else the Service volplane-system/volplane-gateway read
// through the API server (see findGateway). Lists are paged through;
// output is a table, or -o json|yaml.
package kubectlplugin
