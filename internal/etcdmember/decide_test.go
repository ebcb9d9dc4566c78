package etcdmember

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestDecide(t *testing.T) {
	const (
		self = "etcd-1"
		url  = "https://etcd-1.etcd:2380"
	)
	others := func(s0, s2 peerState) map[string]peerState {
		return map[string]peerState{"etcd-0": s0, "etcd-2": s2}
	}
	started := func(id uint64, name string) member {
		return member{ID: id, Name: name, PeerURLs: []string{"https://" + name + ".etcd:2380"}, ClientURLs: []string{"https://" + name + ".etcd:2379"}}
	}
	three := []member{started(10, "etcd-0"), started(11, "etcd-1"), started(12, "etcd-2")}
	for _, tc := range []struct {
		name   string
		v      view
		want   action
		remove []uint64
		add    bool
		reason string
	}{
		{
			name: "first start of all three: every member empty",
			v:    view{Peers: others(stateEmpty, stateEmpty)},
			want: bootstrap,
		},
		{
			name: "a single-member cluster starts at once",
			v:    view{Peers: map[string]peerState{}},
			want: bootstrap,
		},
		{
			name:   "a peer unreachable: it may hold data, so no new cluster",
			v:      view{Peers: others(stateEmpty, stateUnknown)},
			want:   wait,
			reason: "etcd-2 (unreachable)",
		},
		{
			name:   "a peer has data but has not started yet: wait for it",
			v:      view{Peers: others(stateData, stateEmpty)},
			want:   wait,
			reason: "etcd-0 (data)",
		},
		{
			name: "data here: start on it",
			v:    view{HasData: true, ID: 11, Peers: others(stateStarted, stateStarted), Members: three, Quorum: true},
			want: start,
		},
		{
			name: "data here while nothing else answers: start on it (a restart)",
			v:    view{HasData: true, ID: 11, Peers: others(stateUnknown, stateUnknown)},
			want: start,
		},
		{
			name: "data here without an ID file: start on it",
			v:    view{HasData: true, Peers: others(stateStarted, stateStarted), Members: []member{started(10, "etcd-0"), started(12, "etcd-2")}, Quorum: true},
			want: start,
		},
		{
			name:   "data of a member the cluster removed: wipe it",
			v:      view{HasData: true, ID: 99, Peers: others(stateStarted, stateStarted), Members: three, Quorum: true},
			want:   wipe,
			reason: "member 63",
		},
		{
			name: "data of a member not listed, but no quorum to trust the list: start",
			v:    view{HasData: true, ID: 99, Peers: others(stateStarted, stateStarted), Members: three},
			want: start,
		},
		{
			name:   "data lost, the cluster runs and lists this member started: replace it",
			v:      view{Peers: others(stateStarted, stateStarted), Members: three, Quorum: true},
			want:   join,
			remove: []uint64{11},
			add:    true,
			reason: "replacing this member's former self (b)",
		},
		{
			name: "data lost, no quorum to replace the former self: wait",
			v:    view{Peers: others(stateStarted, stateEmpty), Members: three},
			want: wait,
		},
		{
			name: "a member listed under its peer URL only (started with another name): replaced",
			v: view{Peers: others(stateStarted, stateStarted), Quorum: true, Members: []member{
				started(10, "etcd-0"), {ID: 21, Name: "old-name", PeerURLs: []string{url}, ClientURLs: []string{"https://x:2379"}}, started(12, "etcd-2")}},
			want:   join,
			remove: []uint64{21},
			add:    true,
		},
		{
			name: "the cluster does not list this member (removed by hand): add it",
			v:    view{Peers: others(stateStarted, stateStarted), Members: []member{started(10, "etcd-0"), started(12, "etcd-2")}, Quorum: true},
			want: join,
			add:  true,
		},
		{
			name: "added before (a crash after MemberAdd), never started: start as it, no quorum needed",
			v: view{Peers: others(stateStarted, stateStarted), Members: []member{
				started(10, "etcd-0"), {ID: 31, PeerURLs: []string{url}, Learner: true}, started(12, "etcd-2")}},
			want: join,
		},
		{
			name: "a peer bootstrapped a new cluster a moment ago: join its bootstrap (listed by name, never started)",
			v: view{Peers: others(stateStarted, stateEmpty), Members: []member{
				started(10, "etcd-0"), {ID: 11, Name: self, PeerURLs: []string{url}}, {ID: 12, Name: "etcd-2", PeerURLs: []string{"https://etcd-2.etcd:2380"}}}},
			want:   bootstrap,
			reason: "joining its bootstrap",
		},
		{
			name: "the new cluster has its quorum already, this member starts late: still its bootstrap",
			v: view{Peers: others(stateStarted, stateStarted), Quorum: true, Members: []member{
				started(10, "etcd-0"), {ID: 11, Name: self, PeerURLs: []string{url}}, started(12, "etcd-2")}},
			want: bootstrap,
		},
		{
			name: "a stale entry and an added one both: remove the stale, start as the added",
			v: view{Peers: others(stateStarted, stateStarted), Quorum: true, Members: []member{
				started(10, "etcd-0"), started(11, "etcd-1"), {ID: 41, PeerURLs: []string{url}, Learner: true}, started(12, "etcd-2")}},
			want:   join,
			remove: []uint64{11},
		},
		{
			name: "the cluster's sole survivor was forced into a cluster of one: add this member",
			v:    view{Peers: others(stateStarted, stateEmpty), Members: []member{started(10, "etcd-0")}, Quorum: true},
			want: join,
			add:  true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := decide(self, url, tc.v)
			if d.Action != tc.want || !slices.Equal(d.Remove, tc.remove) || d.Add != tc.add {
				t.Fatalf("decide = %v remove %v add %v (%s), want %v remove %v add %v", d.Action, d.Remove, d.Add, d.Reason, tc.want, tc.remove, tc.add)
			}
			if d.Reason == "" || !strings.Contains(d.Reason, tc.reason) {
				t.Errorf("reason %q, want one containing %q", d.Reason, tc.reason)
			}
		})
	}
}

func TestRecoverQuorum(t *testing.T) {
	lost := func(s peerState) other { return other{Started: true, State: s} }
	for _, tc := range []struct {
		name        string
		lost, after time.Duration
		others      map[string]other
		want        bool
	}{
		{"every other member started once and is empty now, for long enough", 3 * time.Minute, 2 * time.Minute, map[string]other{"a": lost(stateEmpty), "b": lost(stateEmpty)}, true},
		{"not for long enough", time.Minute, 2 * time.Minute, map[string]other{"a": lost(stateEmpty), "b": lost(stateEmpty)}, false},
		{"disabled", time.Hour, 0, map[string]other{"a": lost(stateEmpty), "b": lost(stateEmpty)}, false},
		{"one other member unreachable: it may hold data", time.Hour, time.Minute, map[string]other{"a": lost(stateEmpty), "b": lost(stateUnknown)}, false},
		{"one other member has data", time.Hour, time.Minute, map[string]other{"a": lost(stateEmpty), "b": lost(stateData)}, false},
		{"one other member runs", time.Hour, time.Minute, map[string]other{"a": lost(stateEmpty), "b": lost(stateStarted)}, false},
		{"a new cluster still bootstrapping: the others never started, they are empty because they have not begun", time.Hour, time.Minute,
			map[string]other{"a": {State: stateEmpty}, "b": {State: stateEmpty}}, false},
		{"one other member added and not started yet", time.Hour, time.Minute, map[string]other{"a": lost(stateEmpty), "b": {State: stateEmpty}}, false},
		{"a cluster of one never needs it", time.Hour, time.Minute, map[string]other{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := recoverQuorum(tc.lost, tc.after, tc.others); got != tc.want {
				t.Fatalf("recoverQuorum = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestShouldDefrag(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name    string
		st      dbStatus
		noSpace bool
		want    bool
	}{
		{"mostly free and large enough", dbStatus{Size: 400 * mib, InUse: 100 * mib}, false, true},
		{"mostly free but small: not worth it", dbStatus{Size: 4 * mib, InUse: 1 * mib}, false, false},
		{"large but mostly in use", dbStatus{Size: 400 * mib, InUse: 300 * mib}, false, false},
		{"nothing free", dbStatus{Size: 400 * mib, InUse: 400 * mib}, true, false},
		{"under the NOSPACE alarm any free space counts", dbStatus{Size: 4 * mib, InUse: 3 * mib}, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := shouldDefrag(tc.st, tc.noSpace, 64*mib, 0.5); got != tc.want {
				t.Fatalf("shouldDefrag(%+v, %v) = %v, want %v", tc.st, tc.noSpace, got, tc.want)
			}
		})
	}
}

// At any instant at most one member may begin to defragment, and every
// member has its turns.
func TestInTurnOneMemberAtATime(t *testing.T) {
	start := time.Unix(1700000000, 0)
	seen := map[int]bool{}
	for step := time.Duration(0); step < 10*time.Minute; step += 7 * time.Second {
		now := start.Add(step)
		var in []int
		for i := 0; i < 3; i++ {
			if inTurn(now, time.Minute, i, 3) {
				in = append(in, i)
			}
		}
		if len(in) > 1 {
			t.Fatalf("%s: members %v in their turn, want one at most", now, in)
		}
		if len(in) == 1 {
			seen[in[0]] = true
			if off := now.Sub(now.Truncate(time.Minute)); off >= 30*time.Second {
				t.Fatalf("%s: member %d begins %s into its turn of 1m, past the first half", now, in[0], off)
			}
		}
	}
	if len(seen) != 3 {
		t.Fatalf("turns seen %v, want every member's", seen)
	}
	if !inTurn(start.Add(59*time.Second), time.Minute, 0, 1) {
		t.Fatal("a single member is always in its turn")
	}
}

func TestCanDisarm(t *testing.T) {
	const quota = 100
	for _, tc := range []struct {
		name    string
		sizes   []int64
		members int
		want    bool
	}{
		{"every member well below", []int64{10, 20, 30}, 3, true},
		{"one member still near the quota", []int64{10, 95, 30}, 3, false},
		{"one member's size unknown", []int64{10, 20}, 3, false},
		{"nothing known", nil, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := canDisarm(tc.sizes, tc.members, quota); got != tc.want {
				t.Fatalf("canDisarm(%v, %d) = %v, want %v", tc.sizes, tc.members, got, tc.want)
			}
		})
	}
}
