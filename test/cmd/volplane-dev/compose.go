package main

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/volplane/volplane/test/harness/pki"
)

// composeUID is the user the images run as (hack/build-images.sh): the
// files written for docker-compose.yaml must be readable by it.
const composeUID = 65532

// composeAdmin is the user of the client certificate written for the
// gateway (users/volplane-admin.crt).
const composeAdmin = "volplane-admin"

// writeComposeFiles writes what docker-compose.yaml mounts at
// /etc/volplane/compose:
//
//   - ca.crt and a certificate per container, named after it (its compose
//     host name): etcd, kube-apiserver (also valid for the in-cluster names
//     kubernetes.default.svc and 10.96.0.1), each service with its
//     identity (volplane-<service>, pkg/callers) as its Common Name (the
//     watcher's also for its second replica, watcher-2);
//   - users/ca.crt, the users' CA, apart from the services' (the gateway's
//     --client-ca-file), and users/volplane-admin.crt and .key, a client
//     certificate of the admin user (group system:masters) for the
//     gateway;
//   - sa.key and sa.pub, kube-apiserver's service-account signing keys;
//   - tokens.csv, kube-apiserver's --token-auth-file, with one admin user
//     (group system:masters), and token, that user's bearer token: the
//     services' kubeconfig uses it, and so does a caller of the gateway
//     (TokenReview resolves it to the admin user);
//   - kubeconfig, for the containers: https://kube-apiserver:6443 with the
//     token.
//
// The CAs' keys are removed once the certificates are issued. Files are
// private (0600); as root, they are given to the images' user.
func writeComposeFiles(dir string) error {
	ca, err := pki.NewCA(dir, "volplane-compose-ca")
	if err != nil {
		return err
	}
	for n, hosts := range map[string][]string{
		"etcd":           nil,
		"kube-apiserver": {"kubernetes", "kubernetes.default", "kubernetes.default.svc", "10.96.0.1"},
	} {
		if _, err := ca.Issue(n, hosts...); err != nil {
			return err
		}
	}
	for _, n := range pki.Services {
		var hosts []string
		if n == "watcher" {
			hosts = []string{"watcher-2"}
		}
		if _, err := ca.IssueService(n, hosts...); err != nil {
			return err
		}
	}
	users, err := pki.NewCA(filepath.Join(dir, "users"), "volplane-compose-users-ca")
	if err != nil {
		return err
	}
	if _, err := users.IssueUser(composeAdmin, "system:masters"); err != nil {
		return err
	}
	// Every container mounts the directory: the CAs' keys, needed only to
	// issue, do not stay in it.
	if err := errors.Join(os.Remove(filepath.Join(dir, "ca.key")), os.Remove(filepath.Join(users.Dir, "ca.key"))); err != nil {
		return err
	}
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	saPub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return err
	}
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return err
	}
	token := hex.EncodeToString(b)
	caPEM, err := os.ReadFile(ca.CertFile)
	if err != nil {
		return err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["volplane-compose"] = &clientcmdapi.Cluster{Server: "https://kube-apiserver:6443", CertificateAuthorityData: caPEM}
	cfg.AuthInfos["volplane-admin"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["volplane-compose"] = &clientcmdapi.Context{Cluster: "volplane-compose", AuthInfo: "volplane-admin", Namespace: "default"}
	cfg.CurrentContext = "volplane-compose"
	kubeconfig, err := clientcmd.Write(*cfg)
	if err != nil {
		return err
	}
	files := map[string][]byte{
		"sa.key":     pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(saKey)}),
		"sa.pub":     pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPub}),
		"tokens.csv": []byte(token + ",volplane-admin,volplane-admin,system:masters\n"),
		"token":      []byte(token + "\n"),
		"kubeconfig": kubeconfig,
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			return err
		}
	}
	if os.Geteuid() != 0 {
		fmt.Fprintf(os.Stderr, "volplane-dev: the images run as uid %d: make %s readable by it (as root, volplane-dev does that itself)\n", composeUID, dir)
		return nil
	}
	return filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Chown(p, composeUID, composeUID)
	})
}
