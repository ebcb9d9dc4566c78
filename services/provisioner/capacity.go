package provisioner

import (
	"context"
	"fmt"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	storagev1 "k8s.io/api/storage/v1"

	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	"github.com/volplane/volplane/services/provisioner/capacity"
)

// capacityDrivers is what capacity tracking asks of the drivers served
// and of their nodes' topology.
type capacityDrivers struct {
	reg   *registry
	nodes nodes
}

var _ capacity.Drivers = capacityDrivers{}

func (c capacityDrivers) Names() []string {
	var out []string
	for _, d := range c.reg.all() {
		if n := d.name(); n != "" {
			out = append(out, n)
		}
	}
	return out
}

func (c capacityDrivers) Driver(name string) (capacity.Driver, bool) {
	d := c.reg.byDriver(name)
	if d == nil {
		return capacity.Driver{}, false
	}
	return capacity.Driver{Name: d.name(), ProvisionerName: d.provisionerName(), Ready: d.ready(), Topology: d.current().topology,
		GetCapacity: d.has(csi.ControllerServiceCapability_RPC_GET_CAPACITY), Client: d.controller}, true
}

// Segments are the segments of every node where the driver is installed
// (its CSINode lists it with topology keys, and the Node has their labels);
// for a node-deployed driver, the segments its sidecars registered, so
// that each node's capacity is asked of that node's driver.
func (c capacityDrivers) Segments(driver string) ([]map[string]string, error) {
	if d := c.reg.byDriver(driver); d != nil && d.nodeDeployed() {
		// Each node's own segment, as its sidecar registered it.
		var segs []map[string]string
		for _, ep := range d.sidecars.nodeEndpoints() {
			segs = append(segs, ep.topology)
		}
		return dedupe(segs), nil
	}
	cns, err := c.nodes.CSINodes()
	if err != nil {
		return nil, fmt.Errorf("list CSINodes: %w", err)
	}
	var segs []map[string]string
	for _, cn := range cns {
		keys := topologyKeys(cn, driver)
		if len(keys) == 0 {
			continue
		}
		node, err := c.nodes.Node(cn.Name)
		if err != nil {
			continue
		}
		if seg, err := segmentOf(node, keys); err == nil {
			segs = append(segs, seg)
		}
	}
	return dedupe(segs), nil
}

func (c capacityDrivers) Allowed(seg map[string]string, class *storagev1.StorageClass) bool {
	return allowed(seg, class.AllowedTopologies)
}

// GetCapacity shows the CSIStorageCapacity objects published for a
// driver, read from the API server.
func (s *server) GetCapacity(ctx context.Context, req *provisionerv1.GetCapacityRequest) (*provisionerv1.GetCapacityResponse, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "name (the driver's name) is required")
	}
	d := s.p.drivers.byDriver(req.GetName())
	if d == nil {
		d = s.p.drivers.byProvisioner(req.GetName())
	}
	if d == nil {
		return nil, status.Errorf(codes.NotFound, "driver %q is not served by this provisioner (GET /v1/drivers lists those that are)", req.GetName())
	}
	if !d.has(csi.ControllerServiceCapability_RPC_GET_CAPACITY) {
		return nil, status.Errorf(codes.FailedPrecondition, "driver %q does not report the GET_CAPACITY controller capability: it tells no capacity, so none is published", d.name())
	}
	if s.capacity == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "capacity tracking is off in this provisioner: start it with --enable-capacity to publish CSIStorageCapacity objects for driver %q", d.name())
	}
	list, err := s.capacity.Published(ctx, d.name())
	if err != nil {
		return nil, apiStatus(err, "CSIStorageCapacities")
	}
	return &provisionerv1.GetCapacityResponse{DriverName: d.name(), Capacities: list}, nil
}
