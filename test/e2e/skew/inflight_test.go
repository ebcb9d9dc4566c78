package skew

import (
	"context"
	"time"

	"google.golang.org/protobuf/proto"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"

	"github.com/volplane/volplane/test/harness/devenv"
)

// reclaimJournal is where the reclaimers journal a reclaim (protobuf
// volplane.reclaimer.v1.Reclaim, by volume name; docs/operations.md).
const reclaimJournal = "/volplane/journal/reclaim/"

// unavailable are the dev CSI driver's faults while a row leaves
// operations in flight: every CreateVolume and DeleteVolume answers
// Unavailable, which means "the driver may still be working", so the
// provisioner and the reclaimer keep their journal records and try again.
var unavailable = []string{"--fault", "CreateVolume=unavailable:*", "--fault", "DeleteVolume=unavailable:*"}

// leaveInFlight journals a provisioning and a backing volume's deletion
// under this row's releases and leaves both undone for the next row's
// (finishInFlight): a provisioned claim is deleted and a new claim made
// while the CSI driver answers Unavailable, until etcd holds both
// operations' records (and, from a reclaimer at HEAD, the reclaim's
// trace_parent: a field the previous release does not know).
func (m *matrix) leaveInFlight(ctx context.Context, st *rowState) error {
	if st.last {
		return errNotApplicable
	}
	doomed, err := m.claim(ctx, st.ns, "inflight-delete", dynamicClass)
	if err != nil {
		return err
	}
	if err := m.bound(ctx, doomed, "pvc-"+string(doomed.UID)); err != nil {
		return err
	}
	if err := m.restartCSI(ctx, unavailable...); err != nil {
		return err
	}
	if err := m.c.Client.CoreV1().PersistentVolumeClaims(st.ns).Delete(ctx, doomed.Name, metav1.DeleteOptions{}); err != nil {
		return err
	}
	m.book.Deleted(doomed.UID, st.ns+"/"+doomed.Name)
	pending, err := m.claim(ctx, st.ns, "inflight-create", dynamicClass)
	if err != nil {
		return err
	}
	st.left = &inFlight{provision: pending, reclaim: doomed}
	headReclaimer := !st.prev["reclaimer"]
	return poll(ctx, checkTimeout, func() string {
		names, err := m.c.JournalNames(ctx)
		if err != nil {
			return err.Error()
		}
		for _, c := range []string{"pvc-" + string(pending.UID), "pvc-" + string(doomed.UID)} {
			if !names[c] {
				return "no journal record of " + c + " yet"
			}
		}
		if headReclaimer {
			return m.tracedReclaim(ctx, "pvc-"+string(doomed.UID))
		}
		return ""
	})
}

// tracedReclaim says why the reclaim record of volume does not carry a
// trace_parent yet ("" when it does): the reclaimer at HEAD journals it.
func (m *matrix) tracedReclaim(ctx context.Context, volume string) string {
	cli, err := m.c.EtcdClient()
	if err != nil {
		return err.Error()
	}
	defer cli.Close()
	resp, err := cli.Get(ctx, reclaimJournal+volume)
	if err != nil {
		return err.Error()
	}
	if len(resp.Kvs) == 0 {
		return "no reclaim record of " + volume
	}
	var r reclaimerv1.Reclaim
	if err := proto.Unmarshal(resp.Kvs[0].Value, &r); err != nil {
		return err.Error()
	}
	if r.GetTraceParent() == "" {
		return "the reclaim record of " + volume + " has no trace_parent yet"
	}
	return ""
}

// finishInFlight waits until this row's releases (switched to with the
// records in etcd, the CSI driver well again) have finished the previous
// row's operations: the pending claim Bound to its new volume, the
// deleted claim's volume and backing volume gone.
func (m *matrix) finishInFlight(ctx context.Context, st *rowState) error {
	if st.inFlight == nil {
		return errNotApplicable
	}
	if err := m.bound(ctx, st.inFlight.provision, "pvc-"+string(st.inFlight.provision.UID)); err != nil {
		return err
	}
	return m.reclaimed(ctx, st.inFlight.reclaim)
}

// restartCSI starts the dev CSI driver again with faults (none: a well
// driver), unless it already runs well and none are asked for.
func (m *matrix) restartCSI(ctx context.Context, faults ...string) error {
	if !m.faulted && len(faults) == 0 {
		return nil
	}
	m.c.CSI.Stop()
	if err := m.c.CSI.StartWithArgs(faults...); err != nil {
		return err
	}
	m.faulted = len(faults) > 0
	return devenv.WaitCSIServing(ctx, m.c.CSI.Addr, time.Minute)
}
