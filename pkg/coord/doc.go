// Package coord is volplane's coordination state in etcd: which replicas of
// each service are alive (membership), which replica owns which object
// (a rendezvous-hash ring over the members), and short-lived exclusive
// reservations such as "this PV is being bound to that claim", and the
// journal of operations with side effects outside the Kubernetes API.
//
// Everything a replica writes hangs on one etcd lease (its session). When
// the replica dies or is partitioned for longer than the lease TTL, its
// membership and reservations disappear together, and Done is closed so
// that the replica stops doing exclusive work it no longer holds. Writes
// are fenced on the lease: a reservation cannot be taken with a lease that
// has already expired.
//
// Keys (Prefix defaults to /volplane):
//
//	<prefix>/members/<service>/<id>      = address
//	<prefix>/reservations/<resource>     = holder
//	<prefix>/journal/<kind>/<name>       = record (no lease)
//
// Journal records are the exception to "everything hangs on the lease": an
// operation such as a CSI CreateVolume is recorded before it starts, and the
// record stays when its replica dies, so that another replica finishes or
// undoes it. Who may write a record is decided by the operation's lock, the
// reservation op/<kind>/<name>, which does hang on the lease: every record
// write is a transaction fenced on the writer holding that lock on its live
// lease (Put, Finish), so a replica that lost its session cannot overwrite
// the record of the replica that took the operation over.
//
// A Keeper keeps a replica in etcd through outages instead of stopping it:
// it opens a session (retrying while etcd is unreachable), registers the
// member, and opens and registers a new session whenever one is lost. It
// offers the journal and reservation methods on the current session; while
// there is none they fail with ErrSessionLost, and locks of a lost session
// are never carried on (writes fenced on the new lease are refused until
// the lock is acquired again).
//
// A Keeper also watches etcd's alarms (in a member's Status every
// AlarmPeriod, and at once when a write fails with "database space
// exceeded"; with etcd authentication, Status needs an admin user, and
// without it an alarm is known from the writes' errors alone). Under the
// NOSPACE alarm etcd refuses every write and every new lease: the
// Keeper's writes then fail with an error wrapping ErrNoSpaceAlarm, the
// alarm is logged at error level, and Health returns "etcd: NOSPACE
// alarm", which the services' readiness reports (they turn NOT_SERVING).
// The session is kept (Ready stays true), so nothing it holds is lost;
// once etcd is compacted, defragmented and disarmed (volplane-etcd-member
// does it, docs/etcd.md), Health is nil again.
//
// Metrics (the process's pkg/metrics registry): every etcd request's
// latency by method and code (volplane_etcd_request_duration_seconds), a
// Keeper's session state and losses (volplane_etcd_session,
// volplane_etcd_sessions_lost_total), and the journal's oldest record as
// the services that read it report it (ReportJournalAge).
package coord
