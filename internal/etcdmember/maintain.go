package etcdmember

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
)

// maintain is one round of the member's upkeep:
//
//   - under the NOSPACE alarm, compact at the current revision (once
//     compacted, bbolt can reuse the space but the file stays as large);
//   - defragment this member when its database is worth it
//     (shouldDefrag), in its own turn (inTurn), only while every other
//     member is a healthy voter and none says it is defragmenting, handing
//     leadership over first if it leads, so that never two members, nor a
//     member of a degraded cluster, are defragmented at once;
//   - under the NOSPACE alarm, disarm it once every member's database is
//     below nine tenths of the quota (canDisarm), else say why not.
//
// Periodic compaction itself is etcd's (--auto-compaction-*).
func (r *runner) maintain(ctx context.Context, e *embed.Etcd, local, cluster *clientv3.Client) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	self := uint64(e.Server.MemberID())
	selfURL := r.o.AdvertiseClientURL
	st, err := cluster.Status(ctx, selfURL)
	if err != nil {
		r.every("status", time.Minute, func() { r.log.Warn("cannot read this member's status", "error", err) })
		return
	}
	// Status lists the cluster's alarms (a local read); the alarms
	// themselves, whose members a disarm names, are listed only then
	// (listing is a raft proposal).
	var noSpace []*pb.AlarmMember
	if slices.ContainsFunc(st.Errors, func(e string) bool { return strings.Contains(e, "alarm:"+pb.AlarmType_NOSPACE.String()) }) {
		alarms, err := cluster.AlarmList(ctx)
		if err != nil {
			r.every("alarms", time.Minute, func() { r.log.Warn("cannot list etcd's alarms", "error", err) })
			return
		}
		for _, a := range alarms.Alarms {
			if a.Alarm == pb.AlarmType_NOSPACE {
				noSpace = append(noSpace, a)
			}
		}
	}
	if len(noSpace) > 0 {
		noSpaceAlarm.Set(1)
		if !r.alarmSeen {
			noSpaceAlarms.Inc()
			r.log.Error("etcd's NOSPACE alarm is raised: every write is refused; compacting, defragmenting member by member, then disarming",
				"db_size", st.DbSize, "db_in_use", st.DbSizeInUse, "quota", r.o.QuotaBackendBytes)
		}
		r.alarmSeen = true
		if _, err := cluster.Compact(ctx, st.Header.Revision, clientv3.WithCompactPhysical()); err != nil && !errors.Is(err, rpctypes.ErrCompacted) {
			r.log.Warn("cannot compact under the NOSPACE alarm", "revision", st.Header.Revision, "error", err)
		} else if st, err = cluster.Status(ctx, selfURL); err != nil {
			return
		}
	} else {
		noSpaceAlarm.Set(0)
		r.alarmSeen = false
	}
	if shouldDefrag(dbStatus{Size: st.DbSize, InUse: st.DbSizeInUse}, len(noSpace) > 0, r.o.DefragMinFreeBytes, r.o.DefragFreeRatio) &&
		inTurn(time.Now(), r.o.DefragSlot, r.p.index, len(r.p.peers)) {
		r.defragment(ctx, local, cluster, self)
	}
	if len(noSpace) > 0 {
		r.disarm(ctx, cluster, noSpace)
	}
}

// defragment defragments this member if every other member is a healthy
// voter and none is defragmenting, after handing leadership over if this
// member leads. It says it is defragmenting on its status endpoint from
// before the handover to the end, so that no other member begins
// meanwhile, even past the end of this member's turn.
func (r *runner) defragment(ctx context.Context, local, cluster *clientv3.Client, self uint64) {
	ms, err := cluster.MemberList(ctx)
	if err != nil {
		r.every("defrag-members", time.Minute, func() { r.log.Warn("not defragmenting: no member list", "error", err) })
		return
	}
	// Leadership goes to the member whose turn came last, so that it is
	// not the next one to defragment.
	prev := r.p.peers[(r.p.index+len(r.p.peers)-1)%len(r.p.peers)].Name
	var to uint64
	for _, m := range ms.Members {
		if m.ID == self {
			continue
		}
		healthy := !m.IsLearner && len(m.ClientURLs) > 0
		if healthy {
			sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			_, err = cluster.Status(sctx, m.ClientURLs[0])
			cancel()
			healthy = err == nil
		}
		if !healthy {
			r.every("defrag-health", time.Minute, func() {
				r.log.Warn("not defragmenting while another member is not a healthy voter", "other", m.Name, "error", err)
			})
			return
		}
		if to == 0 || m.Name == prev {
			to = m.ID
		}
	}
	for n, s := range r.peerStates(ctx) {
		if s.State != stateStarted || s.Defragmenting {
			r.every("defrag-peers", time.Minute, func() {
				r.log.Warn("not defragmenting while another member defragments or does not answer", "other", n, "state", s.State, "defragmenting", s.Defragmenting)
			})
			return
		}
	}
	// The checks took a while: still the first half of this member's turn?
	if !inTurn(time.Now(), r.o.DefragSlot, r.p.index, len(r.p.peers)) {
		return
	}
	r.board.setDefragmenting(true)
	defer r.board.setDefragmenting(false)
	st, err := cluster.Status(ctx, r.o.AdvertiseClientURL)
	if err != nil {
		return
	}
	if st.Leader == self && to != 0 {
		if _, err := local.MoveLeader(ctx, to); err != nil {
			r.every("defrag-leader", time.Minute, func() {
				r.log.Warn("not defragmenting: cannot hand leadership over first", "to", fmt.Sprintf("%x", to), "error", err)
			})
			return
		}
	}
	began := time.Now()
	if _, err := cluster.Defragment(ctx, r.o.AdvertiseClientURL); err != nil {
		r.log.Warn("defragmentation failed", "error", err)
		return
	}
	defragmentations.Inc()
	after := int64(-1)
	if a, err := cluster.Status(ctx, r.o.AdvertiseClientURL); err == nil {
		after = a.DbSize
	}
	r.log.Info("defragmented this member's database", "before", st.DbSize, "in_use", st.DbSizeInUse, "after", after,
		"began", began.Format(time.RFC3339Nano), "took", time.Since(began).String())
}

// disarm disarms the NOSPACE alarms once every member's database is below
// nine tenths of the quota.
func (r *runner) disarm(ctx context.Context, cluster *clientv3.Client, alarms []*pb.AlarmMember) {
	ms, err := cluster.MemberList(ctx)
	if err != nil {
		return
	}
	var sizes, inUse []int64
	for _, m := range ms.Members {
		if len(m.ClientURLs) == 0 {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		st, err := cluster.Status(sctx, m.ClientURLs[0])
		cancel()
		if err == nil {
			sizes, inUse = append(sizes, st.DbSize), append(inUse, st.DbSizeInUse)
		}
	}
	if !canDisarm(sizes, len(ms.Members), r.o.QuotaBackendBytes) {
		full := false
		for _, u := range inUse {
			full = full || u >= r.o.QuotaBackendBytes-r.o.QuotaBackendBytes/10
		}
		r.every("nospace", time.Minute, func() {
			msg := "NOSPACE alarm stays until every member's database is defragmented below nine tenths of the quota"
			if full {
				msg = "NOSPACE alarm stays: the live data itself nearly fills the quota; raise --quota-backend-bytes (docs/etcd.md)"
			}
			r.log.Error(msg, "db_sizes", sizes, "db_in_use", inUse, "members", len(ms.Members), "quota", r.o.QuotaBackendBytes)
		})
		return
	}
	for _, a := range alarms {
		if _, err := cluster.AlarmDisarm(ctx, &clientv3.AlarmMember{MemberID: a.MemberID, Alarm: a.Alarm}); err != nil {
			r.log.Warn("cannot disarm the NOSPACE alarm", "alarm_member", fmt.Sprintf("%x", a.MemberID), "error", err)
			return
		}
	}
	alarmDisarms.Inc()
	r.log.Info("NOSPACE alarm disarmed: every member's database is below nine tenths of the quota again", "db_sizes", sizes, "quota", r.o.QuotaBackendBytes)
}
