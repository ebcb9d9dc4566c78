// Package etcdmember runs one member of volplane's own etcd cluster
// (cmd/volplane-etcd-member, the etcd image's entrypoint): etcd embedded,
// plus what a StatefulSet of members on emptyDir needs to run without
// anyone's help, and without volplane's (DESIGN, deployment invariant 7).
// docs/etcd.md explains the choices and the failure cases.
//
// Before starting etcd, Run asks every other member's status endpoint
// (StatusPort, over the peer TLS) for its state (empty, data, started) and
// the membership it knows, asks a started cluster for its members
// (linearizably: a quorum), and decide chooses:
//
//	this member             the others                        action
//	data, listed or unknown any                               start on its data
//	data, not listed        a quorum lists members            wipe, decide again
//	no data                 every one empty                   bootstrap (state new)
//	no data                 one unreachable, or has data       wait
//	no data, listed by name a new cluster, never started      bootstrap (join it)
//	no data, added          never started                     join (state existing)
//	no data, listed started a quorum                          remove it, add as learner, join
//	no data, not listed     a quorum                          add as learner, join
//	no data                 no quorum to change membership    wait
//
// While etcd runs, a learner is promoted once in sync, maintain compacts,
// defragments (one member at a time: inTurn, healthy peers, none
// defragmenting, leadership handed over) and disarms the NOSPACE alarm,
// and a member without a leader for RecoverQuorumAfter while every other
// member, having started once, is empty now starts again as a cluster of
// one (recoverQuorum). The
// plaintext metrics URLs serve etcd's /metrics, /livez, /readyz and
// /health once etcd runs; before, /livez is ok and /readyz says why the
// member waits.
package etcdmember
