// Package binder is volplane's binding service: the state machine of
// Kubernetes' PersistentVolume controller (the persistentvolume-binder of
// kube-controller-manager), fed by the watcher's event stream instead of its
// own informers and run by many workers.
//
// Objects arrive from the watcher into a cache that indexes free volumes by
// class and claims waiting for a volume; every change queues the object's
// key (and the keys it affects) on a rate-limited work queue. Workers pull
// keys; client-go's queue never hands one key to two workers at once. A sync
// re-reads the cache, decides as Kubernetes decides (for a claim, decide: a
// decision from the claim and the cache alone, which explain reports too)
// and writes to the API with the cached resourceVersion; a conflict
// requeues the key with per-item backoff. Before a worker takes a free volume it reserves it, in memory for
// the workers of this replica and in etcd for the other replicas, so no two
// claims race for one volume. Claims and volumes are sharded over the live
// binder replicas (members registered in etcd) by rendezvous hashing.
package binder
