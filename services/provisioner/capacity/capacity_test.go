package capacity

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// fakeCapacity answers GetCapacity from a table by zone and records the
// parameters asked with.
type fakeCapacity struct {
	free   map[string]int64
	params []map[string]string
}

func (f *fakeCapacity) GetCapacity(_ context.Context, in *csi.GetCapacityRequest, _ ...grpc.CallOption) (*csi.GetCapacityResponse, error) {
	f.params = append(f.params, in.GetParameters())
	return &csi.GetCapacityResponse{AvailableCapacity: f.free[in.GetAccessibleTopology().GetSegments()["zone"]], MaximumVolumeSize: wrapperspb.Int64(1 << 40)}, nil
}

// fakeDrivers serves one driver on nodes labelled with zones.
type fakeDrivers struct {
	d     Driver
	zones map[string]string // node -> zone
}

func (f *fakeDrivers) Names() []string { return []string{f.d.Name} }

func (f *fakeDrivers) Driver(name string) (Driver, bool) { return f.d, name == f.d.Name }

func (f *fakeDrivers) Segments(string) ([]map[string]string, error) {
	seen := map[string]bool{}
	var out []map[string]string
	for _, z := range f.zones {
		if !seen[z] {
			seen[z] = true
			out = append(out, map[string]string{"zone": z})
		}
	}
	return out, nil
}

func (f *fakeDrivers) Allowed(map[string]string, *storagev1.StorageClass) bool { return true }

var discard = slog.New(slog.DiscardHandler)

type alwaysElected struct{}

func (alwaysElected) Reserve(context.Context, string, string) error { return nil }

func TestCapacitySyncMatchesSegmentsAndClasses(t *testing.T) {
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	classes := []*storagev1.StorageClass{
		{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, Provisioner: "drv", VolumeBindingMode: &wffc,
			Parameters: map[string]string{"tier": "fast", "csi.storage.k8s.io/fstype": "xfs"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "now"}, Provisioner: "drv"},                           // Immediate: skipped
		{ObjectMeta: metav1.ObjectMeta{Name: "other"}, Provisioner: "x", VolumeBindingMode: &wffc}, // another driver's
	}
	api := fake.NewClientset()
	n := 0
	api.PrependReactor("create", "csistoragecapacities", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if o := a.(k8stesting.CreateAction).GetObject().(*storagev1.CSIStorageCapacity); o.Name == "" {
			n++ // the fake does not generate names
			o.Name = fmt.Sprintf("%s%d", o.GenerateName, n)
		}
		return false, nil, nil
	})
	factory := informers.NewSharedInformerFactory(api, 0)
	for _, sc := range classes {
		if err := factory.Storage().V1().StorageClasses().Informer().GetIndexer().Add(sc); err != nil {
			t.Fatal(err)
		}
	}
	f := &fakeCapacity{free: map[string]int64{"z1": 10, "z2": 20}}
	drivers := &fakeDrivers{d: Driver{Name: "drv", ProvisionerName: "drv", Ready: true, Topology: true, GetCapacity: true, Client: f},
		zones: map[string]string{"a": "z1", "b": "z2", "c": "z2"}}
	o := Options{Enabled: true, Namespace: "ns"}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	c := New(o, Config{Log: discard, Member: "me", Elect: alwaysElected{}, Client: api, Drivers: drivers, Factory: factory,
		Classes: factory.Storage().V1().StorageClasses().Lister(), Timeout: time.Second})

	objects := func() map[string]storagev1.CSIStorageCapacity {
		l, err := api.StorageV1().CSIStorageCapacities("ns").List(t.Context(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]storagev1.CSIStorageCapacity{}
		for _, o := range l.Items {
			out[fmt.Sprintf("%s/%s=%d", o.StorageClassName, o.NodeTopology.MatchLabels["zone"], o.Capacity.Value())] = o
		}
		return out
	}
	if err := c.sync(t.Context(), "drv"); err != nil {
		t.Fatal(err)
	}
	got := objects()
	if len(got) != 2 || got["fast/z1=10"].GenerateName != "csisc-" {
		t.Fatalf("objects %v, want fast in z1 (10) and z2 (20)", got)
	}
	for _, o := range got {
		if o.Labels[LabelDriverName] != "drv" || o.Labels[LabelManagedBy] != DefaultManagedBy || o.MaximumVolumeSize.Value() != 1<<40 {
			t.Errorf("object %+v", o)
		}
	}
	if _, ok := got["fast/z2=20"]; !ok {
		t.Errorf("objects %v lack fast/z2=20", got)
	}
	if p := f.params[0]; p["tier"] != "fast" || len(p) != 1 {
		t.Errorf("GetCapacity parameters %v, want the class's without csi.storage.k8s.io/ keys", p)
	}

	// Space used in z1, zone z2 gone, and a duplicate: one sync fixes all.
	f.free["z1"] = 4
	delete(drivers.zones, "b")
	delete(drivers.zones, "c")
	dup := got["fast/z1=10"]
	dup.Name, dup.ResourceVersion, dup.UID = "csisc-dup", "", "dup"
	if _, err := api.StorageV1().CSIStorageCapacities("ns").Create(t.Context(), &dup, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.sync(t.Context(), "drv"); err != nil {
		t.Fatal(err)
	}
	if got := objects(); len(got) != 1 || got["fast/z1=4"].Name == "" {
		t.Fatalf("objects %v, want only fast/z1=4", got)
	}
}

func TestCapacityOptions(t *testing.T) {
	for _, o := range []Options{
		{Enabled: true},
		{Enabled: true, Namespace: "ns", Owner: "Pod/x"},
		{Enabled: true, Namespace: "ns", PollInterval: -1},
	} {
		if err := o.Validate(); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
}
