// Package skew proves the version skew policy of docs/compatibility.md:
// one service at a time at another release. The previous release
// (hack/prev-release, built from this clone's git history by
// hack/build-prev.sh) and HEAD run as processes (test/harness/chaos)
// against a real kube-apiserver, etcd and the dev CSI driver; each row of
// the matrix puts one service at the previous release with every other at
// HEAD, or one at HEAD with every other at the previous release, and
// checks a static bind, a dynamic provisioning, a reclaim (Delete) of a
// volume provisioned in that row and of one provisioned in the row
// before, the REST gateway's answers from every service, and the chaos
// run's invariants. `make test-skew` prints the matrix.
package skew
