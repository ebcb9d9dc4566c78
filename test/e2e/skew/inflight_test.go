package skew

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/test/harness/devenv"
)

// unavailable are the dev CSI driver's faults while a row leaves
// operations in flight: every CreateVolume and DeleteVolume answers
// Unavailable, which means "the driver may still be working", so the
// provisioner and the reclaimer keep their journal records and try again.
var unavailable = []string{"--fault", "CreateVolume=unavailable:*", "--fault", "DeleteVolume=unavailable:*"}

// leaveInFlight journals a provisioning and a backing volume's deletion
// under this row's releases and leaves both undone for the next row's
// (finishInFlight): a provisioned claim is deleted and a new claim made
// while the CSI driver answers Unavailable, until etcd holds both
// operations' records.
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
		return ""
	})
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
