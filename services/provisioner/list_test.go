package provisioner

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/reclaimjournal"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
)

func TestListDriversPages(t *testing.T) {
	reg := newRegistry(discard)
	for _, name := range []string{"c.example.com", "a.example.com", "b.example.com"} {
		reg.add(newDriver("unix:///nonexistent/"+name, name, nil))
	}
	s := &server{p: &provisioner{drivers: reg}}
	var got []string
	var sizes []int
	req := &provisionerv1.ListDriversRequest{PageSize: 2}
	for {
		resp, err := s.ListDrivers(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, len(resp.Drivers))
		for _, d := range resp.Drivers {
			got = append(got, d.ProvisionerName)
		}
		if req.PageToken = resp.NextPageToken; req.PageToken == "" {
			break
		}
	}
	if fmt.Sprint(got, sizes) != "[a.example.com b.example.com c.example.com] [2 1]" {
		t.Fatalf("drivers %v in pages of %v", got, sizes)
	}
	if _, err := s.ListDrivers(t.Context(), &provisionerv1.ListDriversRequest{PageSize: -1}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("negative page size: %v", err)
	}
}

// operationsServer journals provisionings in namespaces a and b for two
// drivers, and reclaims with deletions of backing volumes in flight.
func operationsServer(t *testing.T) *server {
	t.Helper()
	j := newMemJournal()
	put := func(kind, name string, op any) {
		b, _ := json.Marshal(op)
		if err := j.Acquire(t.Context(), kind, name, "r1"); err != nil {
			t.Fatal(err)
		}
		if err := j.Put(t.Context(), kind, name, "r1", b); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 7 {
		put(kindProvision, fmt.Sprintf("pvc-%d", i), provisionOp{ClaimNamespace: []string{"a", "b"}[i%2], ClaimName: fmt.Sprintf("c%d", i),
			Provisioner: []string{"fast.csi", "slow.csi"}[i%3/2]})
	}
	for i := range 4 {
		name := fmt.Sprintf("pvc-old-%d", i)
		r := deletingRecord(t, name, "fast.csi", fmt.Sprint(i))
		if i == 3 {
			r.DataRemoved = true // done with the backing volume: not in flight
		}
		b, err := reclaimjournal.Encode(r)
		if err != nil {
			t.Fatal(err)
		}
		if err := j.Put(t.Context(), reclaimjournal.Kind, name, "", b); err != nil {
			t.Fatal(err)
		}
	}
	return &server{p: &provisioner{journal: j}}
}

func TestListOperationsPagesAndFilters(t *testing.T) {
	s := operationsServer(t)
	for name, tc := range map[string]struct {
		req   *provisionerv1.ListOperationsRequest
		want  string
		sizes []int
	}{
		"all, by kind then volume": {&provisionerv1.ListOperationsRequest{PageSize: 5},
			"delete/pvc-old-0 delete/pvc-old-1 delete/pvc-old-2 provision/pvc-0 provision/pvc-1 provision/pvc-2 provision/pvc-3 provision/pvc-4 provision/pvc-5 provision/pvc-6", []int{5, 5}},
		"kind":            {&provisionerv1.ListOperationsRequest{Kind: "delete", PageSize: 2}, "delete/pvc-old-0 delete/pvc-old-1 delete/pvc-old-2", []int{2, 1}},
		"driver":          {&provisionerv1.ListOperationsRequest{Driver: "slow.csi"}, "provision/pvc-2 provision/pvc-5", []int{2}},
		"claim namespace": {&provisionerv1.ListOperationsRequest{ClaimNamespace: "b", PageSize: 1}, "provision/pvc-1 provision/pvc-3 provision/pvc-5", []int{1, 1, 1}},
		"filters combine": {&provisionerv1.ListOperationsRequest{ClaimNamespace: "a", Driver: "fast.csi", Kind: "provision"}, "provision/pvc-0 provision/pvc-4 provision/pvc-6", []int{3}},
		"none":            {&provisionerv1.ListOperationsRequest{ClaimNamespace: "c"}, "", []int{0}},
	} {
		t.Run(name, func(t *testing.T) {
			var got []string
			var sizes []int
			for {
				resp, err := s.ListOperations(t.Context(), tc.req)
				if err != nil {
					t.Fatal(err)
				}
				sizes = append(sizes, len(resp.Operations))
				for _, op := range resp.Operations {
					got = append(got, op.Kind+"/"+op.VolumeName)
				}
				if tc.req.PageToken = resp.NextPageToken; tc.req.PageToken == "" {
					break
				}
			}
			if strings.Join(got, " ") != tc.want || !slices.Equal(sizes, tc.sizes) {
				t.Fatalf("operations %q in pages of %v\nwant       %q in pages of %v", strings.Join(got, " "), sizes, tc.want, tc.sizes)
			}
		})
	}
	drivers, err := (&server{p: &provisioner{drivers: func() *registry {
		r := newRegistry(discard)
		r.add(newDriver("unix:///a", "a", nil))
		r.add(newDriver("unix:///b", "b", nil))
		return r
	}()}}).ListDrivers(t.Context(), &provisionerv1.ListDriversRequest{PageSize: 1})
	if err != nil || drivers.NextPageToken == "" {
		t.Fatalf("ListDrivers: %v, %v", drivers, err)
	}
	for name, req := range map[string]*provisionerv1.ListOperationsRequest{
		"unknown kind":           {Kind: "resize"},
		"invalid namespace":      {ClaimNamespace: "A_B"},
		"a token of ListDrivers": {PageToken: drivers.NextPageToken},
		"a garbled token":        {PageToken: "garbage!"},
	} {
		if _, err := s.ListOperations(t.Context(), req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
	first, err := s.ListOperations(t.Context(), &provisionerv1.ListOperationsRequest{PageSize: 1, Kind: "delete"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.ListOperations(t.Context(), &provisionerv1.ListOperationsRequest{PageToken: first.NextPageToken, Kind: "provision"})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "restart the list") {
		t.Errorf("a token with other filters: %v, want InvalidArgument saying to restart the list", err)
	}
}

// The orphan report pages by driver, kind and volume ID, and filters by
// kind.
func TestListOrphansPages(t *testing.T) {
	g := newGuarded(t)
	var leaks []string
	for i := range 5 {
		leaks = append(leaks, g.volume(t, fmt.Sprintf("leak-%d", i)))
	}
	slices.Sort(leaks)
	for _, name := range []string{"pvc-ghost-1", "pvc-ghost-2"} {
		if _, err := g.api.CoreV1().PersistentVolumes().Create(t.Context(), provisionedPV(name, "vol-"+name, corev1.VolumeBound, corev1.PersistentVolumeReclaimRetain, nil), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	browse := func(req *provisionerv1.ListOrphansRequest) (ids []string, sizes []int) {
		t.Helper()
		for {
			resp, err := g.s.ListOrphans(t.Context(), req)
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.Drivers) != 1 || !resp.Drivers[0].Checked {
				t.Fatalf("drivers %v: want the report of the one driver on every page", resp.Drivers)
			}
			sizes = append(sizes, len(resp.Orphans))
			for _, o := range resp.Orphans {
				ids = append(ids, o.VolumeId)
			}
			if req.PageToken = resp.NextPageToken; req.PageToken == "" {
				return ids, sizes
			}
		}
	}
	ghosts := []string{"vol-pvc-ghost-1", "vol-pvc-ghost-2"}
	ids, sizes := browse(&provisionerv1.ListOrphansRequest{PageSize: 3})
	if !slices.Equal(ids, append(slices.Clone(leaks), ghosts...)) || !slices.Equal(sizes, []int{3, 3, 1}) {
		t.Fatalf("orphans %v in pages of %v", ids, sizes)
	}
	ids, sizes = browse(&provisionerv1.ListOrphansRequest{PageSize: 1, Kind: provisionerv1.OrphanKind_ORPHAN_KIND_PERSISTENT_VOLUME})
	if !slices.Equal(ids, ghosts) || !slices.Equal(sizes, []int{1, 1}) {
		t.Fatalf("PV orphans %v in pages of %v", ids, sizes)
	}
	if _, err := g.s.ListOrphans(t.Context(), &provisionerv1.ListOrphansRequest{Kind: 42}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("unknown kind: %v, want InvalidArgument", err)
	}
	first, err := g.s.ListOrphans(t.Context(), &provisionerv1.ListOrphansRequest{PageSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.s.ListOrphans(t.Context(), &provisionerv1.ListOrphansRequest{PageToken: first.NextPageToken, Kind: provisionerv1.OrphanKind_ORPHAN_KIND_VOLUME}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("a token with another kind filter: %v, want InvalidArgument", err)
	}
}

// deletingRecord is the reclaim record of volume name while the deletion of
// its backing volume (driver, handle) is in flight.
func deletingRecord(t *testing.T, name, driver, handle string) *reclaimerv1.Reclaim {
	t.Helper()
	v := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name)},
		Spec: corev1.PersistentVolumeSpec{PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: handle}}}}
	b, err := kube.EncodeProto(v)
	if err != nil {
		t.Fatal(err)
	}
	return &reclaimerv1.Reclaim{VolumeName: name, VolumeUid: string(v.UID), Policy: "Delete", State: reclaimerv1.State_STATE_RUNNING,
		Method: reclaimerv1.Method_METHOD_PROVISIONER, Driver: driver, Message: reclaimjournal.DeletingMessage, Attempts: 1, DeletingVolume: b}
}
