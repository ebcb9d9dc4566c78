package claimvalidation_test

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/volplane/volplane/pkg/claimvalidation"
)

const validClaim = `{"apiVersion":"v1","kind":"PersistentVolumeClaim","metadata":{"name":"data","namespace":"team","labels":{"app":"db"},"annotations":{"example.com/owner":"me"}},
"spec":{"accessModes":["ReadWriteOnce"],"resources":{"requests":{"storage":"1Gi"},"limits":{"storage":"2Gi"}},"storageClassName":"fast","volumeMode":"Filesystem",
"selector":{"matchLabels":{"tier":"gold"},"matchExpressions":[{"key":"zone","operator":"In","values":["a","b"]}]},
"dataSource":{"kind":"PersistentVolumeClaim","name":"src"},"dataSourceRef":{"kind":"PersistentVolumeClaim","name":"src"}}}`

// claim is validClaim with JSON edits: each old→new replacement applied.
func claim(t *testing.T, edits ...string) string {
	t.Helper()
	s := validClaim
	for i := 0; i+1 < len(edits); i += 2 {
		if !strings.Contains(s, edits[i]) {
			t.Fatalf("no %q in the claim", edits[i])
		}
		s = strings.Replace(s, edits[i], edits[i+1], 1)
	}
	return s
}

// Each case is what the API server answers for the creation of the claim:
// accepted, or refused naming the field (and a word of the reason).
func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name       string
		body       string
		badRequest bool     // not JSON a claim decodes from
		fields     []string // the invalid fields, in the error's causes
		inMessage  string
	}{
		{name: "valid", body: validClaim},
		{name: "generateName only", body: claim(t, `"name":"data"`, `"generateName":"data-"`)},
		{name: "no name", body: claim(t, `"name":"data",`, ``), fields: []string{"metadata.name"}},
		{name: "bad name", body: claim(t, `"name":"data"`, `"name":"Data_1"`), fields: []string{"metadata.name"}},
		{name: "bad generateName", body: claim(t, `"name":"data"`, `"generateName":"Data_"`), fields: []string{"metadata.generateName", "metadata.name"}},
		{name: "bad namespace", body: claim(t, `"namespace":"team"`, `"namespace":"a.b"`), fields: []string{"metadata.namespace"}},
		{name: "no namespace", body: claim(t, `"namespace":"team",`, ``), fields: []string{"metadata.namespace"}},
		{name: "bad label key", body: claim(t, `"app":"db"`, `"a/b/c":"db"`), fields: []string{"metadata.labels"}},
		{name: "bad label value", body: claim(t, `"app":"db"`, `"app":"`+strings.Repeat("x", 64)+`"`), fields: []string{"metadata.labels"}},
		{name: "bad annotation key", body: claim(t, `"example.com/owner"`, `"-owner"`), fields: []string{"metadata.annotations"}},
		{name: "annotations too large", body: claim(t, `"example.com/owner":"me"`, `"example.com/owner":"`+strings.Repeat("x", 256*1024)+`"`), fields: []string{"metadata.annotations"}},
		{name: "bad finalizer", body: claim(t, `"labels"`, `"finalizers":["a/b/c"],"labels"`), fields: []string{"metadata.finalizers"}},
		{name: "no access modes", body: claim(t, `"accessModes":["ReadWriteOnce"],`, ``), fields: []string{"spec.accessModes"}, inMessage: "at least 1 access mode is required"},
		{name: "unknown access mode", body: claim(t, `"ReadWriteOnce"`, `"ReadWriteSometimes"`), fields: []string{"spec.accessModes"}},
		{name: "ReadWriteOncePod with another", body: claim(t, `"ReadWriteOnce"`, `"ReadWriteOncePod","ReadOnlyMany"`), fields: []string{"spec.accessModes"}},
		{name: "ReadWriteOncePod alone", body: claim(t, `"ReadWriteOnce"`, `"ReadWriteOncePod"`)},
		{name: "no storage request", body: claim(t, `"requests":{"storage":"1Gi"},`, ``), fields: []string{"spec.resources.requests[storage]"}},
		{name: "zero storage", body: claim(t, `"storage":"1Gi"`, `"storage":"0"`), fields: []string{"spec.resources.requests[storage]"}, inMessage: "greater than zero"},
		{name: "negative storage", body: claim(t, `"storage":"1Gi"`, `"storage":"-1Gi"`), fields: []string{"spec.resources.requests[storage]"}},
		{name: "storage as a number", body: claim(t, `"storage":"1Gi"`, `"storage":1073741824`)},
		{name: "huge exponent", body: claim(t, `"storage":"1Gi"`, `"storage":"1E+999999999"`), fields: []string{"spec.resources.requests[storage]"}, inMessage: "out of range"},
		{name: "huge exponent as a number", body: claim(t, `"storage":"1Gi"`, `"storage":1E+999999999`), fields: []string{"spec.resources.requests[storage]"}, inMessage: "out of range"},
		{name: "tiny exponent", body: claim(t, `"storage":"1Gi"`, `"storage":"1E-999999999"`), fields: []string{"spec.resources.requests[storage]"}},
		{name: "huge limit", body: claim(t, `"storage":"2Gi"`, `"storage":"9e999999"`), fields: []string{"spec.resources.limits[storage]"}},
		{name: "beyond int64", body: claim(t, `"storage":"1Gi"`, `"storage":"100E"`), fields: []string{"spec.resources.requests[storage]"}, inMessage: "8Ei"},
		{name: "long quantity", body: claim(t, `"storage":"1Gi"`, `"storage":"`+strings.Repeat("1", 100)+`"`), fields: []string{"spec.resources.requests[storage]"}, inMessage: "64 characters"},
		{name: "not a quantity", body: claim(t, `"storage":"1Gi"`, `"storage":"lots"`), fields: []string{"spec.resources.requests[storage]"}, inMessage: "quantities must match"},
		{name: "huge exponent in the status", body: claim(t, `"spec":{`, `"status":{"capacity":{"storage":"1e999999999"}},"spec":{`), fields: []string{"status.capacity[storage]"}},
		{name: "huge exponent, duplicated key", body: claim(t, `"storage":"1Gi"`, `"storage":"1e-999999999","storage":"1Gi"`), fields: []string{"spec.resources.requests[storage]"}},
		{name: "other resources bounded too", body: claim(t, `"storage":"2Gi"`, `"storage":"2Gi","example.com/iops":"1e70"`), fields: []string{"spec.resources.limits[example.com/iops]"}},
		{name: "bad class", body: claim(t, `"storageClassName":"fast"`, `"storageClassName":"Fast Disks"`), fields: []string{"spec.storageClassName"}},
		{name: "empty class", body: claim(t, `"storageClassName":"fast"`, `"storageClassName":""`)},
		{name: "bad attributes class", body: claim(t, `"storageClassName"`, `"volumeAttributesClassName":"x_y","storageClassName"`), fields: []string{"spec.volumeAttributesClassName"}},
		{name: "bad volume mode", body: claim(t, `"Filesystem"`, `"Tape"`), fields: []string{"spec.volumeMode"}},
		{name: "block", body: claim(t, `"Filesystem"`, `"Block"`)},
		{name: "bad selector operator", body: claim(t, `"operator":"In"`, `"operator":"Near"`), fields: []string{"spec.selector.matchExpressions[0].operator"}},
		{name: "selector In without values", body: claim(t, `"values":["a","b"]`, `"values":[]`), fields: []string{"spec.selector.matchExpressions[0].values"}},
		{name: "bad selector label", body: claim(t, `"tier":"gold"`, `"tier":"gold!"`), fields: []string{"spec.selector.matchLabels"}},
		{name: "data source without name", body: claim(t, `"dataSource":{"kind":"PersistentVolumeClaim","name":"src"}`, `"dataSource":{"kind":"PersistentVolumeClaim"}`), fields: []string{"spec.dataSource.name", "spec.dataSource"}},
		{name: "data source of a core kind", body: claim(t, `"dataSource":{"kind":"PersistentVolumeClaim","name":"src"},"dataSourceRef":{"kind":"PersistentVolumeClaim","name":"src"}`, `"dataSource":{"kind":"Pod","name":"src"}`), fields: []string{"spec.dataSource"}, inMessage: "must be 'PersistentVolumeClaim'"},
		{name: "snapshot source", body: claim(t, `"dataSource":{"kind":"PersistentVolumeClaim","name":"src"},"dataSourceRef":{"kind":"PersistentVolumeClaim","name":"src"}`, `"dataSourceRef":{"apiGroup":"snapshot.storage.k8s.io","kind":"VolumeSnapshot","name":"snap"}`)},
		{name: "bad source group", body: claim(t, `"dataSourceRef":{"kind":"PersistentVolumeClaim","name":"src"}`, `"dataSourceRef":{"apiGroup":"Snap!","kind":"VolumeSnapshot","name":"snap"}`), fields: []string{"spec.dataSourceRef.apiGroup", "spec.dataSource"}},
		{name: "sources disagree", body: claim(t, `"dataSourceRef":{"kind":"PersistentVolumeClaim","name":"src"}`, `"dataSourceRef":{"kind":"PersistentVolumeClaim","name":"other"}`), fields: []string{"spec.dataSource"}, inMessage: "must match dataSourceRef"},
		{name: "cross-namespace source with a dataSource", body: claim(t, `"dataSourceRef":{"kind":"PersistentVolumeClaim","name":"src"}`, `"dataSourceRef":{"kind":"PersistentVolumeClaim","name":"src","namespace":"other"}`), fields: []string{"spec.dataSource"}},
		{name: "bad source namespace", body: claim(t, `"dataSource":{"kind":"PersistentVolumeClaim","name":"src"},"dataSourceRef":{"kind":"PersistentVolumeClaim","name":"src"}`, `"dataSourceRef":{"kind":"PersistentVolumeClaim","name":"src","namespace":"Other"}`), fields: []string{"spec.dataSourceRef.namespace"}},

		{name: "unknown field", body: claim(t, `"storageClassName"`, `"storageClas":"x","storageClassName"`), badRequest: true, inMessage: `unknown field "spec.storageClas"`},
		{name: "field of another case", body: claim(t, `"storageClassName"`, `"StorageClassName"`), badRequest: true, inMessage: "StorageClassName"},
		{name: "duplicate field", body: claim(t, `"volumeMode":"Filesystem"`, `"volumeMode":"Filesystem","volumeMode":"Block"`), badRequest: true, inMessage: "duplicate field"},
		{name: "wrong type", body: claim(t, `"accessModes":["ReadWriteOnce"]`, `"accessModes":"ReadWriteOnce"`), badRequest: true},
		{name: "not JSON", body: `{"metadata":`, badRequest: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			c, err := claimvalidation.Check([]byte(tc.body))
			if took := time.Since(start); took > 200*time.Millisecond {
				t.Errorf("took %v", took)
			}
			switch {
			case tc.badRequest:
				if !apierrors.IsBadRequest(err) || !strings.Contains(err.Error(), tc.inMessage) {
					t.Fatalf("%v, want BadRequest with %q", err, tc.inMessage)
				}
				return
			case tc.fields == nil:
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if c.Name == "" && c.GenerateName == "" {
					t.Fatalf("decoded %+v", c)
				}
				return
			}
			if !apierrors.IsInvalid(err) {
				t.Fatalf("%v, want Invalid", err)
			}
			var got []string
			var se apierrors.APIStatus
			if errors.As(err, &se) && se.Status().Details != nil {
				for _, cause := range se.Status().Details.Causes {
					got = append(got, cause.Field)
				}
			}
			for _, f := range tc.fields {
				if !slices.Contains(got, f) {
					t.Errorf("fields %v, want %s: %v", got, f, err)
				}
			}
			if len(got) != len(tc.fields) {
				t.Errorf("fields %v, want %v: %v", got, tc.fields, err)
			}
			if !strings.Contains(err.Error(), tc.inMessage) {
				t.Errorf("%v, want %q", err, tc.inMessage)
			}
		})
	}
}

// The quantity paths DecodeJSON checks are every resource.Quantity of a
// claim, by their JSON names: a new one in k8s.io/api fails here.
func TestQuantityFieldsCoverTheType(t *testing.T) {
	var found []string
	var walk func(t reflect.Type, path string, seen map[reflect.Type]bool)
	quantity := reflect.TypeOf(resource.Quantity{})
	walk = func(typ reflect.Type, path string, seen map[reflect.Type]bool) {
		for typ.Kind() == reflect.Pointer || typ.Kind() == reflect.Slice {
			typ = typ.Elem()
		}
		if typ == quantity {
			found = append(found, path)
			return
		}
		if typ.Kind() == reflect.Map && typ.Elem() == quantity {
			found = append(found, path+"[*]")
			return
		}
		if typ.Kind() != reflect.Struct || seen[typ] {
			return
		}
		seen[typ] = true
		defer delete(seen, typ)
		for i := range typ.NumField() {
			f := typ.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "" {
				name = f.Name
			}
			walk(f.Type, path+"."+name, seen)
		}
	}
	walk(reflect.TypeOf(corev1.PersistentVolumeClaim{}), "", map[reflect.Type]bool{})
	want := []string{".spec.resources.limits[*]", ".spec.resources.requests[*]", ".status.capacity[*]", ".status.allocatedResources[*]"}
	slices.Sort(found)
	slices.Sort(want)
	if !slices.Equal(found, want) {
		t.Fatalf("a claim's quantities are %v; DecodeJSON checks %v", found, want)
	}
}

func ExampleCheck() {
	_, err := claimvalidation.Check([]byte(`{"metadata":{"name":"data","namespace":"team"},"spec":{"accessModes":["ReadWriteOnce"],"resources":{"requests":{"storage":"1E+999999999"}}}}`))
	fmt.Println(err)
	// Output:
	// PersistentVolumeClaim "data" is invalid: spec.resources.requests[storage]: Invalid value: "1E+999999999": the exponent +999999999 is out of range: a quantity's exponent is at most 64 in magnitude
}
