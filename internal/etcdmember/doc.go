// Package etcdmember runs one member of volplane's own etcd cluster
// (cmd/volplane-etcd-member, the etcd image's entrypoint): etcd embedded,
// plus what a StatefulSet of members on emptyDir needs to run without
// anyone's help. docs/etcd.md explains the choices.
package etcdmember
