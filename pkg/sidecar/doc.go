// Package sidecar is the contract between volplane's driver sidecar
// (volplane-csi-sidecar, which takes csi-provisioner's place in a CSI
// driver's own pod) and volplane's provisioner, which finds the sidecars
// and calls their drivers.
//
// A sidecar announces its driver with a registration: a
// coordination.k8s.io/v1 Lease in its pod's namespace, labelled
// LabelRegistration, named RegistrationName(pod), renewed every
// RenewInterval and held for LeaseDuration. It names the CSI driver, the
// pod, the TLS port the sidecar serves the driver's Identity and
// Controller services on, and the SHA-256 of that port's certificate.
// With --leader-election only the sidecar holding csi-provisioner's own
// leader lock registers, so one driver controller acts at a time, as with
// csi-provisioner; without it every ready pod of the driver registers.
// A sidecar started with --node-deployment (in a node-local driver's
// DaemonSet) also names its node, the node's topology segment and
// whether Immediate claims may go there (AnnotationNode and the two after
// it); the provisioner then sends it only that node's calls, and trusts
// the registration only while its pod runs on that node.
//
// A registration proves nothing by itself: anyone who may write Leases in
// a namespace can write one. The provisioner trusts it only when
//   - it is fresh (renewTime + leaseDurationSeconds is in the future);
//   - the pod it names exists, is Ready and not being deleted, and has an
//     IP;
//   - the pod's ServiceAccount may serve the driver: a SubjectAccessReview
//     of verb VerbServe on resource ResourceDrivers (group Group) named
//     after the driver, which the ClusterRole volplane-csi-sidecar grants
//     once a platform team binds it to the driver's ServiceAccount;
//   - and the TLS handshake with the pod's IP at the port shows the
//     certificate whose SHA-256 the registration pins.
//
// The sidecar, for its part, accepts only TLS connections whose client
// certificate chains to volplane's CA (the ConfigMap CAConfigMap in
// volplane's namespace, which the provisioner publishes) and names
// volplane's provisioner (pkg/callers): the driver's socket is never
// reachable over the network any other way.
package sidecar
