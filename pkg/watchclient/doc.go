// Package watchclient subscribes to the watcher service and keeps the
// subscription going: it reconnects with backoff after a broken stream,
// fails over between watcher replicas, and resumes after the last event it
// delivered when it can, so that the handler sees every change in order.
// A Feed is the handler every volplane subscriber uses: it turns the
// stream into the events a cache applies, and says how current the cache
// is (see "Feed" below).
//
// The contract with the watcher:
//
//   - A stream without a cursor (or with one the watcher cannot resume:
//     another epoch, that is another watcher replica or a restarted one;
//     or events already dropped from its history) starts with RESET, then
//     ADDED for every current object, then SYNCED, then live changes.
//   - A stream with a cursor the watcher can resume delivers exactly the
//     events after it.
//   - A RESET may also arrive in the middle of a stream, when a slow
//     subscriber fell behind the watcher's history; a full list and
//     SYNCED follow.
//
// The client only resumes from a cursor taken after a SYNCED: a stream
// broken during the initial list starts over with a full list.
//
// # Several watchers
//
// RunFailover takes several watcher replicas. Each keeps its own log (its
// own epoch), so a cursor of one means nothing to another: the client
// sends its cursor to whichever replica it connects to, and a replica of
// another epoch answers with a full list (RESET … SYNCED), which a Feed
// applies as a replace (objects the list does not mention are gone). A cursor is therefore resumed only on the replica that issued it.
//
// # A shard of the claims
//
// Options.Shard asks for the claims of one shard only
// (WatchRequest.claim_shard). No stream opens before its first Set; a Set
// that changes it ends the stream, and the next opens without a cursor, so
// its full list replaces the view. Shard.Holds says whether the last full
// list delivered (after the handler's Synced) was of a shard that
// includes a claim; Shard.Streams whether the stream under way is, so that
// a claim a list leaves out can be told apart: left the shard, or deleted.
//
// # Staleness, per subscription
//
// The client asks for progress marks (WatchRequest.progress_marks): the
// watcher then tells it, with PROGRESS events the handler never sees, up
// to which sequence it has been sent (or spared, being of other kinds)
// everything, and the client resumes from there. The stream's position is
// the sequence of the last event or mark received: it reaches the
// watcher's newest sequence within a fraction of a second while the
// stream keeps up, whatever kinds the others change, so what the
// subscriber did not ask for never looks like a stall.
//
// While a stream is open the client probes its watcher every
// Options.ProbeInterval (gRPC health and GetStatus on the same
// connection). A stream is abandoned for another replica when it breaks,
// when its position stays behind the newest sequence the watcher reports
// for Options.StallTimeout with nothing arriving, when the watcher cannot
// be probed for that long, or when the watcher is NOT_SERVING for that
// long while another replica is SERVING.
//
// Status tells the consumer how current its view is: FreshAt is the latest
// time T (on this process's clock: a probe's start) at which the watcher
// was SERVING, i.e. its own watches on the API server were open, and the
// handler had been given every event of its kinds up to the newest
// sequence the watcher had at T. A watcher that predates progress marks
// sends none; then the position counts only the events received, and a
// subscriber of some kinds may look behind while other kinds change.
//
// # Feed: the stream as a subscriber sees it
//
// A Feed is the one interpreter of the stream; a service's cache is a
// Subscriber of it (Apply, Keys, and optionally Relisted) and re-implements
// none of it. A subscriber may assume:
//
//   - Calls never overlap. Objects arrive decoded from protobuf and slim
//     (kube.Slim: no managedFields): *corev1.PersistentVolume,
//     *corev1.PersistentVolumeClaim, *storagev1.StorageClass, and
//     *watcherv1.Pod, the watcher's slim view of a pod. Kinds the feed
//     was not made for never arrive.
//   - Events come in the watcher's order, one order for all kinds, none
//     lost: after a break the stream resumes exactly after the last event
//     delivered, or starts over with a full list.
//   - Added and Updated both mean "this is the object now"; a full list
//     re-adds every object, so an Added may name one the view holds.
//   - Deleted carries its tombstone: the deleted object's last state, whose
//     UID says which object is gone. A view holding another UID under the
//     key holds a newer object (recreated under the same name) and keeps
//     it.
//   - A full list is a replace. While it comes in (Relisting) nothing is
//     dropped, so the view is never empty; at its SYNCED every key the
//     view holds (Keys) that the list did not mention gets a Deleted with
//     Vanished set and no object: the object was deleted while the stream
//     was down, its UID unknown, so the view drops whatever it holds under
//     the key. Then Relisted, with what the list mentioned.
//   - After a failover the new replica's list may be behind what the old
//     one streamed: an Added may carry an older resourceVersion, or an
//     object whose deletion was delivered. A view that must never go back
//     compares UID and resourceVersion (the binder's store does).
//
// How far the view may be trusted:
//
//   - Stale(maxAge): no full list has been applied yet, or the stream was
//     not caught up with a SERVING watcher within maxAge (Status.FreshAt).
//     A view that is not stale holds every change the watcher had at
//     FreshAt, a moment less than maxAge ago; StaleReason says why not.
//   - Complete: a full list is applied and no relist is under way. During
//     a relist the objects in the view are still as new as FreshAt, but
//     some of them may be gone; a view that must hold exactly the current
//     objects (the provisioner's delete guard lists every claim that
//     names a volume) asks for Complete and not Stale; the binder, whose
//     destructive steps read the API server first, asks only not Stale.
//
// DefaultStaleAfter is the maxAge both services use by default (their
// --watcher-stale-after), and the stream's stall timeout.
package watchclient
