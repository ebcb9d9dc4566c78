package etcdmember

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
)

// peerState is what a member's status endpoint says about it.
type peerState string

const (
	// stateUnknown: the member did not answer (down, not scheduled yet, or
	// not reachable).
	stateUnknown peerState = ""
	// stateEmpty: the member has no data and has not started etcd: its
	// data, if it ever had any, is gone.
	stateEmpty peerState = "empty"
	// stateData: the member has data and has not started etcd yet.
	stateData peerState = "data"
	// stateStarted: the member runs etcd.
	stateStarted peerState = "started"
)

// member is an etcd cluster member as MemberList shows it.
type member struct {
	ID   uint64 `json:"id"`
	Name string `json:"name,omitempty"`
	// PeerURLs are where the other members reach it.
	PeerURLs []string `json:"peerURLs"`
	// ClientURLs are empty until the member has started once (a member
	// added, or listed in a new cluster's initial cluster, has none yet).
	ClientURLs []string `json:"clientURLs,omitempty"`
	Learner    bool     `json:"learner,omitempty"`
}

// started reports whether m has ever started.
func (m member) started() bool { return len(m.ClientURLs) > 0 }

// view is what a member knows before it starts etcd.
type view struct {
	// HasData: the data directory holds a member's data (a WAL).
	HasData bool
	// ID is the member ID this data directory started as (its ID file), 0
	// when unknown.
	ID uint64
	// Peers is every other member of the initial cluster, by name, with
	// what its status endpoint said.
	Peers map[string]peerState
	// Members is the cluster's member list as a started peer gave it; nil
	// when no started peer answered.
	Members []member
	// Quorum: the cluster answered a linearizable request (it has a
	// leader, so membership can change).
	Quorum bool
}

// action is what a member does before (or instead of) starting etcd.
type action int

const (
	// wait and look again.
	wait action = iota
	// start etcd on the data it has.
	start
	// bootstrap a new cluster (--initial-cluster-state=new) with the
	// whole initial cluster.
	bootstrap
	// join the running cluster (--initial-cluster-state=existing): first
	// remove decision.Remove, then add this member as a learner when
	// decision.Add, then start.
	join
	// wipe the data directory (its member was removed from the cluster),
	// then decide again.
	wipe
)

func (a action) String() string {
	return [...]string{"wait", "start", "bootstrap", "join", "wipe"}[a]
}

// decision is decide's answer.
type decision struct {
	Action action
	// Remove are stale members to remove first: this member's former
	// self, whose data is lost.
	Remove []uint64
	// Add: add this member (as a learner) before starting.
	Add bool
	// Reason says why, for the log and /readyz.
	Reason string
}

// decide chooses how a member named name, with peer URL peerURL, starts,
// from what it sees (v). It never starts a new cluster while any other
// member might hold data (only when every one says it is empty), never
// changes membership without a quorum, and replaces its own former self
// (a member of its name or peer URL that has started before: its data is
// lost) by removing it and adding itself as a learner.
func decide(name, peerURL string, v view) decision {
	if v.HasData {
		if v.ID != 0 && v.Quorum && len(v.Members) > 0 && !slices.ContainsFunc(v.Members, func(m member) bool { return m.ID == v.ID }) {
			return decision{Action: wipe, Reason: fmt.Sprintf("this data directory is member %x's, which the cluster removed", v.ID)}
		}
		return decision{Action: start, Reason: "the data directory holds this member's data"}
	}
	if v.Members == nil {
		var notEmpty []string
		for _, p := range sortedNames(v.Peers) {
			if st := v.Peers[p]; st != stateEmpty {
				notEmpty = append(notEmpty, p+" "+st.describe())
			}
		}
		if len(notEmpty) == 0 {
			return decision{Action: bootstrap, Reason: "no member has data: a new cluster"}
		}
		return decision{Action: wait, Reason: "no data here, and no running cluster answered; a new cluster starts only when every member is empty: " + strings.Join(notEmpty, ", ")}
	}
	var (
		remove        []uint64
		mine, initial bool
	)
	for _, m := range v.Members {
		if m.Name != name && !slices.Contains(m.PeerURLs, peerURL) {
			continue
		}
		switch {
		case m.started():
			remove = append(remove, m.ID) // this member's former self
		case m.Name == name:
			// Listed by name, never started: a new cluster's initial
			// member, which joins its bootstrap as "new" (a cluster
			// without a leader yet refuses an "existing" member).
			mine, initial = true, true
		default:
			mine = true // added, never started: start as it
		}
	}
	d := decision{Action: join, Remove: remove, Add: !mine}
	switch {
	case initial && len(remove) == 0:
		return decision{Action: bootstrap, Reason: "the new cluster a peer bootstrapped lists this member: joining its bootstrap"}
	case mine && len(remove) == 0:
		d.Reason = "the cluster lists this member, added and not started yet"
		return d
	case !v.Quorum:
		return decision{Action: wait, Reason: "no data here, and the running cluster has no quorum to change its membership"}
	case len(remove) > 0:
		d.Reason = fmt.Sprintf("no data here: replacing this member's former self (%s)", hexIDs(remove))
	default:
		d.Reason = "no data here, and the cluster does not list this member: adding it"
	}
	return d
}

func (s peerState) describe() string {
	if s == stateUnknown {
		return "(unreachable)"
	}
	return "(" + string(s) + ")"
}

// other is another member of a running member's cluster, as
// recoverQuorum sees it.
type other struct {
	// Started: the member has started once (it has client URLs in this
	// member's view of the membership).
	Started bool
	// State is what its status endpoint says now.
	State peerState
}

// recoverQuorum reports whether a started member that has seen no leader
// for lost should start again as a cluster of its own
// (--force-new-cluster): only after after (>0), and only when every other
// member of its cluster has started once and says now that it is empty:
// their data is lost, and no copy but this member's exists. A member that
// never started (a new cluster still bootstrapping, a member being added)
// is empty because it has not begun, not because it lost anything.
func recoverQuorum(lost, after time.Duration, others map[string]other) bool {
	if after <= 0 || lost < after || len(others) == 0 {
		return false
	}
	for _, o := range others {
		if !o.Started || o.State != stateEmpty {
			return false
		}
	}
	return true
}

// dbStatus is a member's database size and the part of it in use.
type dbStatus struct{ Size, InUse int64 }

// shouldDefrag reports whether a member's database is worth
// defragmenting: at least minFree bytes and the fraction ratio of it
// free, or any free space at all under the NOSPACE alarm.
func shouldDefrag(st dbStatus, noSpace bool, minFree int64, ratio float64) bool {
	free := st.Size - st.InUse
	if free <= 0 {
		return false
	}
	if noSpace {
		return true
	}
	return free >= minFree && float64(free) >= ratio*float64(st.Size)
}

// inTurn reports whether member index of n may begin to defragment now:
// turns of length slot follow each other in order of the members' names,
// and a defragmentation begins only in the first half of its member's
// turn, so that one that takes a while, or a clock a little off, does not
// meet the next member's.
func inTurn(now time.Time, slot time.Duration, index, n int) bool {
	if n <= 1 {
		return true
	}
	t := now.UnixNano()
	return int((t/int64(slot))%int64(n)) == index && t%int64(slot) < int64(slot)/2
}

// canDisarm reports whether the NOSPACE alarm can be disarmed: every
// member's database (all of them known) is below nine tenths of quota, so
// that writes will not raise it again at once.
func canDisarm(sizes []int64, members int, quota int64) bool {
	if len(sizes) != members || members == 0 {
		return false
	}
	for _, s := range sizes {
		if s >= quota-quota/10 {
			return false
		}
	}
	return true
}

func sortedNames(m map[string]peerState) []string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func hexIDs(ids []uint64) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = fmt.Sprintf("%x", id)
	}
	return strings.Join(s, ", ")
}
