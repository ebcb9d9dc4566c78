package binder

import (
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	"github.com/volplane/volplane/pkg/kube"
	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
)

// listAPI is a synced binder API over a cache holding what fill puts in.
func listAPI(t *testing.T, fill func(s *store)) *api {
	t.Helper()
	c := newController(slog.New(slog.NewTextHandler(io.Discard, nil)), fake.NewClientset(), record.NewFakeRecorder(100))
	fill(c.store)
	c.synced.Store(true)
	return &api{c: c, memberID: "m", members: func() []string { return []string{"m"} }, workers: 1}
}

// allClaims pages through ListClaims with req's filters and page size,
// and returns the claims' keys and the size of each page.
func allClaims(t *testing.T, a *api, req *binderv1.ListClaimsRequest) (keys []string, sizes []int) {
	t.Helper()
	req.PageToken = ""
	for range 1000 {
		resp, err := a.ListClaims(t.Context(), req)
		if err != nil {
			t.Fatalf("ListClaims(%v): %v", req, err)
		}
		sizes = append(sizes, len(resp.Claims))
		for _, c := range resp.Claims {
			keys = append(keys, c.Namespace+"/"+c.Name)
		}
		if req.PageToken = resp.NextPageToken; req.PageToken == "" {
			return keys, sizes
		}
	}
	t.Fatal("ListClaims never ended")
	return nil, nil
}

func allVolumes(t *testing.T, a *api, req *binderv1.ListVolumesRequest) (names []string, sizes []int) {
	t.Helper()
	req.PageToken = ""
	for range 1000 {
		resp, err := a.ListVolumes(t.Context(), req)
		if err != nil {
			t.Fatalf("ListVolumes(%v): %v", req, err)
		}
		sizes = append(sizes, len(resp.Volumes))
		for _, v := range resp.Volumes {
			names = append(names, v.Name)
		}
		if req.PageToken = resp.NextPageToken; req.PageToken == "" {
			return names, sizes
		}
	}
	t.Fatal("ListVolumes never ended")
	return nil, nil
}

// claimsFixture: 12 claims in namespaces a and b, of classes fast (driver
// csi.fast) and slow (no class cached), Pending or Bound; one claim of
// class slow carries the storage-provisioner annotation of csi.other.
func claimsFixture(s *store) {
	s.putClass(&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast", UID: "f"}, Provisioner: "csi.fast"})
	for i := range 12 {
		c := testClaim(fmt.Sprintf("c%02d", i))
		c.Namespace = []string{"a", "b"}[i%2]
		c.UID = types.UID(fmt.Sprintf("uid-%d", i))
		cls := []string{"fast", "slow", "fast"}[i%3]
		c.Spec.StorageClassName = &cls
		if i%4 == 0 {
			c.Status.Phase = corev1.ClaimBound
		}
		if i == 7 {
			c.Annotations = map[string]string{kube.AnnStorageProvisioner: "csi.other"}
		}
		s.putClaim(c)
	}
}

func TestListClaimsPagesAndFilters(t *testing.T) {
	a := listAPI(t, claimsFixture)
	for name, tc := range map[string]struct {
		req   *binderv1.ListClaimsRequest
		keys  string
		sizes []int
	}{
		"all, one page":           {&binderv1.ListClaimsRequest{}, "a/c00 a/c02 a/c04 a/c06 a/c08 a/c10 b/c01 b/c03 b/c05 b/c07 b/c09 b/c11", []int{12}},
		"exact multiple":          {&binderv1.ListClaimsRequest{PageSize: 4}, "a/c00 a/c02 a/c04 a/c06 a/c08 a/c10 b/c01 b/c03 b/c05 b/c07 b/c09 b/c11", []int{4, 4, 4}},
		"remainder":               {&binderv1.ListClaimsRequest{PageSize: 5}, "a/c00 a/c02 a/c04 a/c06 a/c08 a/c10 b/c01 b/c03 b/c05 b/c07 b/c09 b/c11", []int{5, 5, 2}},
		"namespace":               {&binderv1.ListClaimsRequest{Namespace: "b", PageSize: 2}, "b/c01 b/c03 b/c05 b/c07 b/c09 b/c11", []int{2, 2, 2}},
		"phase":                   {&binderv1.ListClaimsRequest{Phase: "Bound", PageSize: 2}, "a/c00 a/c04 a/c08", []int{2, 1}},
		"class":                   {&binderv1.ListClaimsRequest{StorageClassName: "slow"}, "a/c04 a/c10 b/c01 b/c07", []int{4}},
		"driver of the class":     {&binderv1.ListClaimsRequest{Driver: "csi.fast", PageSize: 3}, "a/c00 a/c02 a/c06 a/c08 b/c03 b/c05 b/c09 b/c11", []int{3, 3, 2}},
		"driver of an annotation": {&binderv1.ListClaimsRequest{Driver: "csi.other"}, "b/c07", []int{1}},
		"filters combine":         {&binderv1.ListClaimsRequest{Namespace: "a", Phase: "Pending", StorageClassName: "fast", Driver: "csi.fast"}, "a/c02 a/c06", []int{2}},
		"nothing matches":         {&binderv1.ListClaimsRequest{Namespace: "c"}, "", []int{0}},
	} {
		t.Run(name, func(t *testing.T) {
			keys, sizes := allClaims(t, a, tc.req)
			if got := strings.Join(keys, " "); got != tc.keys {
				t.Errorf("claims %q\nwant   %q", got, tc.keys)
			}
			if !slices.Equal(sizes, tc.sizes) {
				t.Errorf("page sizes %v, want %v", sizes, tc.sizes)
			}
		})
	}
}

func TestListClaimsOfAnEmptyCache(t *testing.T) {
	a := listAPI(t, func(*store) {})
	resp, err := a.ListClaims(t.Context(), &binderv1.ListClaimsRequest{PageSize: 1})
	if err != nil || len(resp.Claims) != 0 || resp.NextPageToken != "" {
		t.Fatalf("ListClaims of nothing: %v, %v", resp, err)
	}
	vresp, err := a.ListVolumes(t.Context(), &binderv1.ListVolumesRequest{})
	if err != nil || len(vresp.Volumes) != 0 || vresp.NextPageToken != "" {
		t.Fatalf("ListVolumes of nothing: %v, %v", vresp, err)
	}
}

func TestListVolumesPagesAndFilters(t *testing.T) {
	a := listAPI(t, func(s *store) {
		for i := range 9 {
			v := testVolume(fmt.Sprintf("pv-%d", i))
			v.UID = types.UID(fmt.Sprintf("pv-uid-%d", i))
			switch i % 3 {
			case 0:
				v.Spec.CSI = &corev1.CSIPersistentVolumeSource{Driver: "csi.fast", VolumeHandle: v.Name}
				v.Spec.StorageClassName = "fast"
				v.Spec.ClaimRef = &corev1.ObjectReference{Namespace: "a", Name: "x" + v.Name}
				v.Status.Phase = corev1.VolumeBound
			case 1:
				v.Annotations = map[string]string{kube.AnnDynamicallyProvisioned: "example.com/nfs"}
				v.Spec.ClaimRef = &corev1.ObjectReference{Namespace: "b", Name: "x" + v.Name}
				v.Status.Phase = corev1.VolumeReleased
			}
			s.putVolume(v)
		}
	})
	for name, tc := range map[string]struct {
		req   *binderv1.ListVolumesRequest
		names string
		sizes []int
	}{
		"all":                      {&binderv1.ListVolumesRequest{PageSize: 3}, "pv-0 pv-1 pv-2 pv-3 pv-4 pv-5 pv-6 pv-7 pv-8", []int{3, 3, 3}},
		"phase":                    {&binderv1.ListVolumesRequest{Phase: "Available", PageSize: 2}, "pv-2 pv-5 pv-8", []int{2, 1}},
		"class":                    {&binderv1.ListVolumesRequest{StorageClassName: "fast"}, "pv-0 pv-3 pv-6", []int{3}},
		"CSI driver":               {&binderv1.ListVolumesRequest{Driver: "csi.fast"}, "pv-0 pv-3 pv-6", []int{3}},
		"provisioned-by":           {&binderv1.ListVolumesRequest{Driver: "example.com/nfs"}, "pv-1 pv-4 pv-7", []int{3}},
		"claim namespace":          {&binderv1.ListVolumesRequest{ClaimNamespace: "b", PageSize: 1}, "pv-1 pv-4 pv-7", []int{1, 1, 1}},
		"filters combine, to none": {&binderv1.ListVolumesRequest{ClaimNamespace: "b", Driver: "csi.fast"}, "", []int{0}},
	} {
		t.Run(name, func(t *testing.T) {
			names, sizes := allVolumes(t, a, tc.req)
			if got := strings.Join(names, " "); got != tc.names {
				t.Errorf("volumes %q\nwant    %q", got, tc.names)
			}
			if !slices.Equal(sizes, tc.sizes) {
				t.Errorf("page sizes %v, want %v", sizes, tc.sizes)
			}
		})
	}
}

// Tokens: each list's own, with its own filters; anything else is
// InvalidArgument saying to restart the list.
func TestListTokensAreCheckedAndOpaque(t *testing.T) {
	a := listAPI(t, func(s *store) {
		claimsFixture(s)
		for i := range 4 {
			s.putVolume(testVolume(fmt.Sprintf("pv-%d", i)))
		}
	})
	ctx := t.Context()
	claims, err := a.ListClaims(ctx, &binderv1.ListClaimsRequest{PageSize: 2, Namespace: "a"})
	if err != nil {
		t.Fatal(err)
	}
	volumes, err := a.ListVolumes(ctx, &binderv1.ListVolumesRequest{PageSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	if claims.NextPageToken == "" || strings.Contains(claims.NextPageToken, "a/c02") {
		t.Fatalf("claims token %q: want an opaque token", claims.NextPageToken)
	}
	for name, tc := range map[string]struct {
		call func() error
		msg  string
	}{
		"a volumes token to ListClaims": {func() error {
			_, err := a.ListClaims(ctx, &binderv1.ListClaimsRequest{PageToken: volumes.NextPageToken})
			return err
		}, "another list"},
		"a claims token to ListVolumes": {func() error {
			_, err := a.ListVolumes(ctx, &binderv1.ListVolumesRequest{PageToken: claims.NextPageToken})
			return err
		}, "another list"},
		"other filters": {func() error {
			_, err := a.ListClaims(ctx, &binderv1.ListClaimsRequest{Namespace: "b", PageToken: claims.NextPageToken})
			return err
		}, "other filters"},
		"a raw key": {func() error {
			_, err := a.ListClaims(ctx, &binderv1.ListClaimsRequest{PageToken: "a/c02"})
			return err
		}, "not a token"},
		"page size over the maximum": {func() error {
			_, err := a.ListVolumes(ctx, &binderv1.ListVolumesRequest{PageSize: 5001})
			return err
		}, "page_size 5001 is out of range"},
		"an invalid namespace filter": {func() error {
			_, err := a.ListVolumes(ctx, &binderv1.ListVolumesRequest{ClaimNamespace: "Not_A_Namespace"})
			return err
		}, "claim_namespace"},
		"a class filter that is not UTF-8": {func() error {
			_, err := a.ListClaims(ctx, &binderv1.ListClaimsRequest{StorageClassName: "\xff"})
			return err
		}, "storage_class_name is not valid UTF-8"},
	} {
		t.Run(name, func(t *testing.T) {
			err := tc.call()
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("%v: want InvalidArgument saying %q", err, tc.msg)
			}
		})
	}
	// The right token continues where the page ended.
	next, err := a.ListClaims(ctx, &binderv1.ListClaimsRequest{PageSize: 2, Namespace: "a", PageToken: claims.NextPageToken})
	if err != nil || next.Claims[0].Name != "c04" {
		t.Fatalf("second page: %v, %v", next, err)
	}
}
