package dynamic

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/test/harness/e2e"
)

// A claim deleted while the driver creates its volume gets no PV: the
// provisioner reads the claim from the API right before the PV, deletes
// the new volume and ends the journal record; and the driver is never
// asked to create the volume again once the claim is gone. (The re-read
// right before CreateVolume, for a claim gone between the journal write
// and the call, is services/provisioner's TestProvisionRechecksTheClaim.)
func TestClaimDeletedDuringCreateVolumeGetsNoVolume(t *testing.T) {
	ns := e2e.Namespace(t, cluster.client)
	sc := class(t)
	before := driverVolumes(t)
	// Slow, but within the provisioner's CSI timeout: the volume is made.
	faults(t).Delay("CreateVolume", csiTimeout*3/4)
	c := createClaim(t, ns, "data", "1Gi", sc.Name)
	name := pvName(c)
	e2e.Eventually(t, 30*time.Second, func() string {
		if len(cluster.requests.createsFor(name)) == 0 {
			return "no CreateVolume for " + name + " yet"
		}
		return ""
	})
	if err := cluster.client.CoreV1().PersistentVolumeClaims(ns).Delete(context.Background(), c.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e2e.Eventually(t, 30*time.Second, func() string {
		if cluster.requests.idOf(name) == "" {
			return "CreateVolume of " + name + " has not answered"
		}
		return ""
	})
	noJournal(t, name)
	e2e.Eventually(t, 30*time.Second, func() string { return noneAdded(t, before) })
	if _, err := cluster.client.CoreV1().PersistentVolumes().Get(context.Background(), name, metav1.GetOptions{}); err == nil {
		t.Errorf("PV %s was created for a claim that was gone", name)
	}
	if d := cluster.requests.deletesOf(cluster.requests.idOf(name)); len(d) == 0 {
		t.Errorf("the volume of the gone claim was never deleted")
	}
	// Several recovery periods and binder retries later: no second call.
	e2e.Consistently(t, 10*recoveryPeriod, func() string {
		if n := len(cluster.requests.createsFor(name)); n != 1 {
			return fmt.Sprintf("CreateVolume of %s called %d times; once, before the claim went", name, n)
		}
		if _, err := cluster.client.CoreV1().PersistentVolumes().Get(context.Background(), name, metav1.GetOptions{}); err == nil {
			return "PV " + name + " exists"
		}
		return ""
	})
	if !logsContain(t, "provisioning undone before the PV") {
		t.Error("the provisioner did not log the undo")
	}
}
