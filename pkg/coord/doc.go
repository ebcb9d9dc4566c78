// Package coord is volplane's coordination state in etcd: which replicas of
// each service are alive (membership), which replica owns which object
// (a rendezvous-hash ring over the members), and short-lived exclusive
// reservations such as "this PV is being bound to that claim".
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
package coord
