package reclaimer

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/volplane/volplane/pkg/reclaimjournal"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
)

// ListReclaims pages through the journal's reclaims and this replica's
// recent ones together, by volume name, and filters them.
func TestListReclaimsPagesAndFilters(t *testing.T) {
	kc, j := newFakeCluster(), newFakeJournal()
	r := newReplica(t, "a", kc, j, nil, config{})
	s := &server{c: r.controller}
	// pv-0..pv-5 journaled (held by another replica), pv-6..pv-8 this
	// replica's recent records.
	for i := range 9 {
		rec := &reclaimerv1.Reclaim{VolumeName: fmt.Sprintf("pv-%d", i), ClaimNamespace: []string{"a", "b"}[i%2],
			Driver: []string{"fast.csi", "slow.csi", ""}[i%3], State: reclaimerv1.State_STATE_RUNNING}
		if i >= 6 {
			rec.State = reclaimerv1.State_STATE_SUCCEEDED
			r.controller.mu.Lock()
			r.controller.entries[rec.VolumeName] = &entry{rec: rec, expires: time.Now().Add(time.Hour)}
			r.controller.mu.Unlock()
			continue
		}
		b, err := reclaimjournal.Encode(rec)
		if err != nil {
			t.Fatal(err)
		}
		if err := j.Acquire(t.Context(), reclaimjournal.Kind, rec.VolumeName, "b"); err != nil {
			t.Fatal(err)
		}
		if err := j.Put(t.Context(), reclaimjournal.Kind, rec.VolumeName, "b", b); err != nil {
			t.Fatal(err)
		}
	}
	for name, tc := range map[string]struct {
		req   *reclaimerv1.ListReclaimsRequest
		want  string
		sizes []int
	}{
		"all":             {&reclaimerv1.ListReclaimsRequest{PageSize: 3}, "pv-0 pv-1 pv-2 pv-3 pv-4 pv-5 pv-6 pv-7 pv-8", []int{3, 3, 3}},
		"state":           {&reclaimerv1.ListReclaimsRequest{State: reclaimerv1.State_STATE_SUCCEEDED, PageSize: 2}, "pv-6 pv-7 pv-8", []int{2, 1}},
		"driver":          {&reclaimerv1.ListReclaimsRequest{Driver: "fast.csi"}, "pv-0 pv-3 pv-6", []int{3}},
		"claim namespace": {&reclaimerv1.ListReclaimsRequest{ClaimNamespace: "b", PageSize: 4}, "pv-1 pv-3 pv-5 pv-7", []int{4}},
		"filters combine": {&reclaimerv1.ListReclaimsRequest{ClaimNamespace: "a", Driver: "fast.csi", State: reclaimerv1.State_STATE_RUNNING}, "pv-0", []int{1}},
		"none":            {&reclaimerv1.ListReclaimsRequest{State: reclaimerv1.State_STATE_FAILED}, "", []int{0}},
	} {
		t.Run(name, func(t *testing.T) {
			var got []string
			var sizes []int
			for {
				resp, err := s.ListReclaims(t.Context(), tc.req)
				if err != nil {
					t.Fatal(err)
				}
				sizes = append(sizes, len(resp.Reclaims))
				for _, r := range resp.Reclaims {
					got = append(got, r.VolumeName)
				}
				if tc.req.PageToken = resp.NextPageToken; tc.req.PageToken == "" {
					break
				}
			}
			if strings.Join(got, " ") != tc.want || !slices.Equal(sizes, tc.sizes) {
				t.Fatalf("reclaims %q in pages of %v, want %q in pages of %v", strings.Join(got, " "), sizes, tc.want, tc.sizes)
			}
		})
	}
	first, err := s.ListReclaims(t.Context(), &reclaimerv1.ListReclaimsRequest{PageSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	for name, req := range map[string]*reclaimerv1.ListReclaimsRequest{
		"other filters":     {PageToken: first.NextPageToken, Driver: "fast.csi"},
		"a garbled token":   {PageToken: first.NextPageToken[1:]},
		"invalid namespace": {ClaimNamespace: "-x-"},
		"page too large":    {PageSize: 5001},
	} {
		if _, err := s.ListReclaims(t.Context(), req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
}
