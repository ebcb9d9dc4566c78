package plugin

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/test/harness/e2e"
)

// get calls the gateway as the cluster admin (system:masters) and returns
// the status and the JSON answer.
func get(t *testing.T, path string, q url.Values) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, cluster.gatewayURL+path+"?"+q.Encode(), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+cluster.env.RESTConfig.BearerToken)
	resp, err := cluster.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("GET %s?%s: %d, not JSON: %s", path, q.Encode(), resp.StatusCode, b)
	}
	return resp.StatusCode, m
}

// browse pages through a list route with the query's filters and page
// size, and returns the items' names (field key of each item of field)
// and the size of each page.
func browse(t *testing.T, path, field, key string, q url.Values) (names []string, sizes []int) {
	t.Helper()
	q = url.Values(maps(q))
	for range 1000 {
		code, m := get(t, path, q)
		if code != http.StatusOK {
			t.Fatalf("GET %s?%s: %d %v", path, q.Encode(), code, m)
		}
		items, _ := m[field].([]any)
		sizes = append(sizes, len(items))
		for _, it := range items {
			names = append(names, it.(map[string]any)[key].(string))
		}
		next, _ := m["nextPageToken"].(string)
		if next == "" {
			return names, sizes
		}
		q.Set("pageToken", next)
	}
	t.Fatalf("%s never ended", path)
	return nil, nil
}

func maps(q url.Values) map[string][]string {
	out := map[string][]string{}
	for k, v := range q {
		out[k] = slices.Clone(v)
	}
	return out
}

// pageSizes is n items in pages of size: full pages, then the rest; no
// empty page at the end.
func pageSizes(n, size int) []int {
	var out []int
	for ; n > size; n -= size {
		out = append(out, size)
	}
	return append(out, n)
}

// A few hundred volumes and claims browsed through the gateway in small
// pages, with filters: each is listed exactly once, in name order, and
// every misuse of a token is a 400 that says to restart the list.
func TestGatewayPagesThroughHundredsOfObjects(t *testing.T) {
	const volumes, claimsPerNamespace = 300, 40
	ctx := t.Context()
	var wantA, wantCSI []string
	var wg sync.WaitGroup
	errs := make(chan error, volumes)
	work := make(chan int)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				pv := &corev1.PersistentVolume{
					ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("browse-%03d", i), Labels: map[string]string{"e2e": "browse"}},
					Spec: corev1.PersistentVolumeSpec{
						Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
						AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
						PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
						StorageClassName:              []string{"browse-a", "browse-b"}[i%2],
						PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: fmt.Sprintf("/tmp/browse-%d", i)}},
					},
				}
				if i%3 == 0 {
					pv.Spec.PersistentVolumeSource = corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: "browse.csi.example.com", VolumeHandle: pv.Name}}
				}
				if _, err := cluster.client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
					errs <- err
				}
			}
		}()
	}
	for i := range volumes {
		work <- i
		if i%2 == 0 {
			wantA = append(wantA, fmt.Sprintf("browse-%03d", i))
		}
		if i%3 == 0 {
			wantCSI = append(wantCSI, fmt.Sprintf("browse-%03d", i))
		}
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.client.CoreV1().PersistentVolumes().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "e2e=browse"})
	})
	ns := e2e.Namespace(t, cluster.client)
	var wantClaims []string
	for i := range claimsPerNamespace {
		name := fmt.Sprintf("claim-%02d", i)
		wantClaims = append(wantClaims, name)
		// No class and no PV of none: Pending for good.
		if _, err := cluster.client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, e2e.Claim(ns, name, "1Gi", ""), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	e2e.Eventually(t, time.Minute, func() string {
		_, m := get(t, "/v1/volumes", url.Values{"storageClassName": {"browse-a"}, "pageSize": {"5000"}})
		vs, _ := m["volumes"].([]any)
		_, c := get(t, "/v1/namespaces/"+ns+"/claims", url.Values{"phase": {"Pending"}})
		cs, _ := c["claims"].([]any)
		if len(vs) != len(wantA) || len(cs) != claimsPerNamespace {
			return fmt.Sprintf("the binder lists %d of %d volumes and %d of %d claims", len(vs), len(wantA), len(cs), claimsPerNamespace)
		}
		return ""
	})

	for name, tc := range map[string]struct {
		path, field, key string
		q                url.Values
		want             []string
		size             int
	}{
		"volumes of a class, pages of 7":    {"/v1/volumes", "volumes", "name", url.Values{"storageClassName": {"browse-a"}, "pageSize": {"7"}}, wantA, 7},
		"volumes of a driver, pages of 25":  {"/v1/volumes", "volumes", "name", url.Values{"driver": {"browse.csi.example.com"}, "pageSize": {"25"}}, wantCSI, 25},
		"volumes of a class, one page":      {"/v1/volumes", "volumes", "name", url.Values{"storageClassName": {"browse-a"}}, wantA, 500},
		"claims of a namespace, pages of 8": {"/v1/namespaces/" + ns + "/claims", "claims", "name", url.Values{"pageSize": {"8"}}, wantClaims, 8},
		"pending claims of it, pages of 3":  {"/v1/namespaces/" + ns + "/claims", "claims", "name", url.Values{"phase": {"Pending"}, "pageSize": {"3"}}, wantClaims, 3},
		"its claims, all namespaces' route": {"/v1/claims", "claims", "name", url.Values{"namespace": {ns}, "pageSize": {"11"}}, wantClaims, 11},
	} {
		t.Run(name, func(t *testing.T) {
			got, sizes := browse(t, tc.path, tc.field, tc.key, tc.q)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("listed %d items, want each of %d once in name order:\ngot  %v\nwant %v", len(got), len(tc.want), got, tc.want)
			}
			if want := pageSizes(len(tc.want), tc.size); !slices.Equal(sizes, want) {
				t.Fatalf("page sizes %v, want %v", sizes, want)
			}
		})
	}

	// Tokens: from another list, with other filters, garbled, and sizes
	// out of range are the caller's mistake.
	_, vpage := get(t, "/v1/volumes", url.Values{"storageClassName": {"browse-a"}, "pageSize": {"2"}})
	vtok, _ := vpage["nextPageToken"].(string)
	if vtok == "" || strings.Contains(vtok, "browse-") {
		t.Fatalf("token %q: want an opaque token", vtok)
	}
	for name, tc := range map[string]struct {
		path string
		q    url.Values
		msg  string
	}{
		"a volumes token to claims": {"/v1/namespaces/" + ns + "/claims", url.Values{"pageToken": {vtok}}, "another list"},
		"other filters":             {"/v1/volumes", url.Values{"storageClassName": {"browse-b"}, "pageToken": {vtok}}, "other filters"},
		"a garbled token":           {"/v1/volumes", url.Values{"pageToken": {"x" + vtok}}, "not a token this API issued"},
		"a raw name":                {"/v1/volumes", url.Values{"pageToken": {"browse-100"}}, "not a token this API issued"},
		"a page too large":          {"/v1/volumes", url.Values{"pageSize": {"5001"}}, "page_size 5001 is out of range"},
		"a reclaims filter":         {"/v1/reclaims", url.Values{"claimNamespace": {"No_Such"}}, "claim_namespace"},
		"an operations kind":        {"/v1/provisioner/operations", url.Values{"kind": {"resize"}}, "not a kind of operation"},
		"a drivers token elsewhere": {"/v1/drivers", url.Values{"pageToken": {vtok}}, "another list"},
	} {
		t.Run(name, func(t *testing.T) {
			code, m := get(t, tc.path, tc.q)
			msg, _ := m["message"].(string)
			if code != http.StatusBadRequest || !strings.Contains(msg, tc.msg) {
				t.Fatalf("%d %q, want 400 saying %q", code, msg, tc.msg)
			}
			if strings.Contains(tc.msg, "token") || strings.Contains(tc.msg, "list") || strings.Contains(tc.msg, "filters") {
				if !strings.Contains(msg, "restart the list") {
					t.Fatalf("%q does not say to restart the list", msg)
				}
			}
		})
	}
}
