// Package certs makes the Secrets volplane's manifests mount, for a
// cluster without cert-manager (volplane-certs; docs/certificates.md):
//
//   - a services CA that signs every service's certificate, kept in a state
//     directory (its key never enters the cluster) so that a later run
//     reissues the certificates under the same CA, and the services, which
//     reload their files when the Secret changes, rotate without a restart;
//   - a separate users' CA, whose certificate is the gateway's client CA
//     (Secret volplane-gateway-client-ca) and which signs the client
//     certificates of REST users (User); or a CA the cluster already has
//     (its API server's client CA), whose certificate only is used;
//   - one Secret per component (Components), as cert-manager makes them
//     (type kubernetes.io/tls with ca.crt, tls.crt and tls.key): common name
//     volplane-<component>, server and client authentication, and the DNS
//     names the manifests dial: the Service's names and, for a StatefulSet,
//     its pods' names under the headless Service
//     (*.volplane-binder-peers.volplane-system.svc); for etcd its members'
//     names under its own Service (*.volplane-etcd.volplane-system.svc).
//
// deploy/production_test.go checks that these Secrets are every Secret the
// rendered manifests mount, and that each certificate verifies for every
// name a manifest dials it by.
package certs
