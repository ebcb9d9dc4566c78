// Package devenv runs a real, local Kubernetes control plane for volplane's
// development environment, end-to-end tests and benchmark: an embedded etcd
// and a kube-apiserver child process on 127.0.0.1, with generated
// certificates, a static admin token and a kubeconfig. With
// Options.EtcdTLS, etcd serves its clients over TLS only and requires a
// client certificate (kube-apiserver's and volplane's are generated), as a
// production etcd does. The volplane services' own certificates come from
// test/harness/pki.
//
// The kube-apiserver binary is built once from the k8s.io/kubernetes module
// by `make kube-apiserver` (hack/build-kube.sh) and cached outside
// the tree; FindKubeAPIServer locates it.
//
// The StorageObjectInUseProtection admission plugin is disabled. In a real
// cluster it adds the kubernetes.io/pvc-protection and pv-protection
// finalizers, and kube-controller-manager's protection controllers remove
// them once no pod uses the claim; without those controllers every deleted
// claim and volume would stay Terminating forever. volplane does not
// replace the protection controllers (they are not part of the PV binder),
// so the dev environment runs without the finalizers, like a cluster whose
// protection controllers finish instantly. The binder never depends on
// their absence: it treats a claim with a deletionTimestamp as still
// existing, as kube-controller-manager does.
package devenv
