// Package watcher is volplane's watcher service: one client-go
// SharedInformerFactory on PersistentVolumes, PersistentVolumeClaims (all
// namespaces) and StorageClasses, and a pod informer that keeps a slim
// view of each pod, served as one ordered, resumable gRPC event stream
// (volplane.watcher.v1.WatcherService) to any number of subscribers. It
// makes no decisions and writes nothing.
//
// # The log
//
// The informers' handlers feed one in-memory log, the hub. Under one lock,
// every change gets the next sequence number (starting at 1), goes into a
// ring of the last Options.HistorySize events, and updates the current
// state (key -> latest object, per kind) that full lists are made of.
// Keys are "namespace/name" for claims and pods and "name" for volumes and
// classes. DELETED events carry the last known object (a
// cache.DeletedFinalStateUnknown is unwrapped). Updates that do not change
// the resourceVersion (informer resyncs) are not logged. The epoch is a
// random string chosen at start; sequences of different epochs do not
// compare. Each event also holds when the handler got it (one time.Now,
// the watcher's clock), sent as observed_unix_nano with the event and
// with the object's entry in a full list, so subscribers can tell the API
// server's and informer's lag from the stream's; RESET, SYNCED and
// PROGRESS carry 0.
//
// # Pods
//
// KIND_POD events carry a watcherv1.Pod, not a Kubernetes object: the pod
// informer's transform (slimPod) replaces each pod by a view of what says
// which claims it uses (persistentVolumeClaim volumes, and the claims of
// generic ephemeral volumes, "<pod>-<volume>"), whether it is scheduled
// (nodeName) and whether it is terminated (as Kubernetes' volume
// controllers count it), so that 100,000 pods cost tens of megabytes, not
// gigabytes. Pods that use no claim are not logged at all (a pod's volumes
// never change), nor are updates that leave the view as it was; the
// resourceVersion of a pod's event is the one at which its view last
// changed, the same on every replica. Pods are sent only to subscribers
// that list KIND_POD: no kinds means the three storage kinds. The rest of
// the contract (ordering, resume, relist, replace) is the same for them;
// a full list sends them last, after the claims.
//
// # The resume contract
//
// Every event carries the cursor {epoch, sequence}. A Watch:
//
//   - with resume_after in the current epoch, no newer than the newest
//     event, and with every later event still in the ring, replays the
//     events after it (of the requested kinds) and goes on with live
//     events: no RESET, no SYNCED;
//   - with resume_after newer than the newest event of the current epoch,
//     fails with InvalidArgument (the cursor was not issued by this
//     watcher);
//   - otherwise (no cursor, another epoch, events already dropped from the
//     ring) gets RESET, every current object as ADDED, SYNCED, then the live
//     events. The list and its cursor are taken atomically, so RESET, the
//     ADDED events and SYNCED all carry the cursor of the newest event the
//     list includes, and the live events are exactly the ones after it.
//
// A subscriber resumes with the cursor of the last event it processed after
// a SYNCED (pkg/watchclient does this). A stream opened before the
// informers have synced waits for them.
//
// # Several watchers
//
// Any number of watcher replicas may run side by side; they share nothing
// and need no coordination: each has its own informers, its own log and
// its own epoch, which is the replica's identity and is carried by every
// event's cursor, RESET and SYNCED included, and by GetStatus. A cursor is
// therefore resumed only by the replica (and process) that issued it: any
// other answers with RESET, a full list and SYNCED. A subscriber that moves
// to another replica must apply that list as a replace, as an informer's
// Replace does: objects it does not mention are deleted (deletions missed
// during the move leave no zombie), objects it mentions are updated only
// when their resourceVersion is newer than the subscriber's (a replica
// that lags never moves an object back in time). pkg/watchclient's
// RunFailover picks the replica and moves on when a stream breaks or
// stalls.
//
// # Readiness: what "current" means
//
// The watcher's view is current when every informer has synced and, for
// each informer:
//
//   - it holds an open watch on the API server, or has been without one
//     for at most 10s (a reflector opens the next watch at once when one
//     ends, every 5 to 10 minutes or after a "too old" resourceVersion,
//     and against a slow API server that takes as long as a request; while
//     the API server is down, or refuses or fails the watch, the gap
//     grows); and
//   - its open watch has delivered something (an event, or a bookmark,
//     which the API server sends about every minute on every watch) within
//     the last 90s, or the API server answers the probe below.
//
// A watch is open from the moment the API server accepted it until its
// stream ends; every call and stream of an informer's ListerWatcher is
// observed (readiness.go). A watch on a connection that died without a
// reset is ended by the client's HTTP/2 health check (a ping after 30s
// without a frame, 15s to answer), after which the first rule applies; the
// second catches such a watch faster, and without HTTP/2, when the API
// server does not answer at all.
//
// The probe asks /readyz every second, one request at a time, each allowed
// 15s (kube.APIProbe); it counts as failing after 3s of failed requests.
// It decides nothing while the watches deliver: a slow or failing probe is
// logged and exported (volplane_watcher_api_probe_failing), and the
// watcher stays SERVING. So an API server that is slow, under a burst or
// starved of CPU, makes the view late by as much as the API server is
// late, never NOT_SERVING; one that is down, or refuses the watches, makes
// it NOT_SERVING within about 10s.
//
// gRPC health is SERVING exactly while the view is current (and
// NOT_SERVING before the first sync and at shutdown). Streams go on either
// way; subscribers read the health to know how far to trust them.
//
// A subscriber is current at time T when, at T, the watcher was SERVING
// and the subscriber had been given every event of its kinds up to the
// watcher's newest sequence at T. pkg/watchclient measures this with the
// watcher's GetStatus (newest sequence at T, on the subscriber's clock)
// and the subscriber's position in the stream, which progress marks move
// past the events of kinds it did not ask for: Status.FreshAt is the
// latest such T. Churn of other kinds therefore never makes a subscriber
// look behind.
//
// # Subscribers
//
// Subscribers pull from the shared ring: each stream remembers the last
// sequence it sent, copies the next batch of events out under the lock and
// sends them without it, and waits for a notification channel that is
// closed on every append. Nothing is queued per subscriber, so a slow
// subscriber costs no memory; if it falls so far behind that the ring has
// dropped events it has not sent, it gets RESET, a fresh full list and
// SYNCED inline, in the same stream, and goes on from there. An object is
// encoded at most once per event and encoding, whatever the number of
// subscribers.
//
// # Progress marks
//
// A subscriber that sets progress_marks also gets PROGRESS events: no
// kind, key or object, just the cursor of the watcher's newest event at
// the moment the stream had sent (or skipped, being of kinds not asked
// for) everything up to it. One is sent, outside lists and only once the
// stream has caught up, 200ms after the previous mark when events were
// skipped since the last message, and 1s after the last message
// otherwise. A subscriber's position is so always the watcher's head a
// fraction of a second ago while it keeps up, whatever other kinds do; it
// hears from the stream at least every second; and it may resume from a
// mark's cursor, so that churn of other kinds neither forces a relist
// (its cursor never ages out of the history) nor replays the skipped
// events. Subscribers that do not ask get no mark.
package watcher
