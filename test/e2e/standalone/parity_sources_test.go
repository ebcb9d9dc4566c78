package standalone

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/dynamic"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/test/harness/e2e"
)

// paritySources runs, side by side with external-provisioner v6.3.0 on
// the same driver, the two data sources issue 36 points 4 and 5 are
// about: a claim whose dataSourceRef names a populator's kind (left to the
// populator, one Event) and a restore that would change the snapshot's
// volume mode (refused, --prevent-volume-mode-conversion's default). Each
// must give the same Events and no volume.
func (x *env) paritySources() {
	bin := findCSIProvisioner()
	if bin == "" {
		x.t.Skip("no csi-provisioner v6.3.0 (VOLPLANE_CSI_PROVISIONER)")
	}
	content := x.blockSnapshot()
	results := map[string]map[string][]string{}
	x.sideBySide(bin, func(tag string) {
		component := "^(" + regexp.QuoteMeta(devcsi.DefaultName) + "_|external-provisioner$)"
		apiGroup := "snapshot.storage.k8s.io"
		results[tag] = map[string][]string{
			"a populator's data source": x.populatorEvents(x.claimWith("pop-"+tag, classDelete, func(c *corev1.PersistentVolumeClaim) {
				group := "populator.example.com"
				c.Spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: &group, Kind: "Widget", Name: "w"}
			}), component),
			"a restore changing the volume mode": x.refused(x.claimWith("mode-"+tag, classDelete, func(c *corev1.PersistentVolumeClaim) {
				c.Spec.DataSource = &corev1.TypedLocalObjectReference{APIGroup: &apiGroup, Kind: "VolumeSnapshot", Name: "block-snap"}
			}), component).events,
		}
	})
	for what, theirs := range results["ep"] {
		ours := results["vp"][what]
		if !slices.Equal(theirs, ours) || len(ours) == 0 {
			x.t.Errorf("%s: Events differ: external-provisioner %q, volplane %q", what, theirs, ours)
			continue
		}
		x.t.Logf("%s: no volume from either, the same Events %q (content %s)", what, ours, content)
	}
}

// blockSnapshot makes a ready VolumeSnapshot "block-snap" of a real
// volume of the driver, whose content says it was taken of a Block
// volume: a Filesystem claim restored from it changes the volume mode.
func (x *env) blockSnapshot() string {
	x.t.Helper()
	dyn := dynamic.NewForConfigOrDie(kube.Tune(x.c.API.RESTConfig, kube.ClientOptions{UserAgent: "volplane-e2e"}))
	e2e.InstallSnapshotCRDs(x.t, dyn)
	src := x.bound(x.claim("block-source", classDelete, nil), corev1.PersistentVolumeReclaimDelete)
	addr := x.c.CSI.Addr
	if !strings.HasPrefix(addr, "unix://") {
		addr = "unix://" + addr
	}
	conn, err := grpcutil.DialCSI(addr)
	if err != nil {
		x.t.Fatal(err)
	}
	defer conn.Close()
	snap, err := csi.NewControllerClient(conn).CreateSnapshot(x.t.Context(), &csi.CreateSnapshotRequest{
		SourceVolumeId: src.Spec.CSI.VolumeHandle, Name: "snapshot-" + string(src.UID)})
	if err != nil {
		x.t.Fatalf("CreateSnapshot: %v", err)
	}
	handle := snap.GetSnapshot().GetSnapshotId()
	content := "snapcontent-block-" + namespace
	e2e.ReadySnapshot(x.t, dyn, namespace, "block-snap", "block-source", content, devcsi.DefaultName, handle,
		map[string]any{"deletionPolicy": "Retain", "sourceVolumeMode": "Block"})
	return content
}

// populatorEvents waits until the provisioner has left the claim cl to
// its populator ("Assuming an external populator will provision the
// volume"), checks that no volume was made, deletes the claim and returns
// the provisioner's Events on it (from sources matching component), each
// message once.
func (x *env) populatorEvents(cl *corev1.PersistentVolumeClaim, component string) []string {
	x.t.Helper()
	var events []string
	e2e.Eventually(x.t, time.Minute, func() string {
		evs, err := e2e.Events(x.c.Client, namespace, "PersistentVolumeClaim", cl.Name)
		if err != nil {
			return err.Error()
		}
		events = nil
		for _, e := range evs {
			if regexp.MustCompile(component).MatchString(e.Source.Component) {
				// The source too: the library's or external-provisioner's own.
				source, _, _ := strings.Cut(e.Source.Component, "_")
				events = append(events, source+" "+e.Reason+": "+strings.NewReplacer(cl.Name, "NAME", string(cl.UID), "UID").Replace(e.Message))
			}
		}
		slices.Sort(events)
		events = slices.Compact(events)
		if !slices.ContainsFunc(events, func(e string) bool {
			return strings.HasSuffix(e, "Provisioning: Assuming an external populator will provision the volume")
		}) {
			return fmt.Sprintf("the claim %s is not left to its populator yet: %q", cl.Name, events)
		}
		return ""
	})
	if x.hasCSIVolume("pvc-" + string(cl.UID)) {
		x.t.Errorf("the driver made a volume for %s, which is its populator's", cl.Name)
	}
	x.deleteClaim(cl)
	return events
}
