package devcsi

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// checkCapability says why a capability cannot be served, or nil. Volumes
// are directories: access type mount with any file system type (there is
// none to format) and any access mode; block is not supported.
func checkCapability(c *csi.VolumeCapability) error {
	if c == nil {
		return errors.New("a volume capability is empty")
	}
	switch c.GetAccessType().(type) {
	case *csi.VolumeCapability_Mount:
	case *csi.VolumeCapability_Block:
		return errors.New("access type block is not supported: volumes are directories (use mount)")
	default:
		return errors.New("a volume capability has no access type (mount or block)")
	}
	mode := c.GetAccessMode().GetMode()
	if _, known := csi.VolumeCapability_AccessMode_Mode_name[int32(mode)]; !known || mode == csi.VolumeCapability_AccessMode_UNKNOWN {
		return fmt.Errorf("access mode %v is not supported", mode)
	}
	return nil
}

func checkCapabilities(caps []*csi.VolumeCapability) error {
	if len(caps) == 0 {
		return status.Error(codes.InvalidArgument, "volume_capabilities are required")
	}
	for _, c := range caps {
		if err := checkCapability(c); err != nil {
			return status.Error(codes.InvalidArgument, err.Error())
		}
	}
	return nil
}

// checkRange validates a capacity range's shape.
func checkRange(cr *csi.CapacityRange) error {
	req, lim := cr.GetRequiredBytes(), cr.GetLimitBytes()
	if req < 0 || lim < 0 {
		return status.Errorf(codes.InvalidArgument, "capacity_range: required_bytes %d and limit_bytes %d must not be negative", req, lim)
	}
	if lim > 0 && req > lim {
		return status.Errorf(codes.InvalidArgument, "capacity_range: required_bytes %d is above limit_bytes %d", req, lim)
	}
	return nil
}

// inRange reports whether a volume of size bytes satisfies cr.
func inRange(size int64, cr *csi.CapacityRange) bool {
	return size >= cr.GetRequiredBytes() && (cr.GetLimitBytes() == 0 || size <= cr.GetLimitBytes())
}

// size picks a new volume's capacity: the required bytes, else the default
// (within the limit), at least minimum (the content source's size).
func (d *Driver) size(cr *csi.CapacityRange, minimum int64) (int64, error) {
	size, lim := cr.GetRequiredBytes(), cr.GetLimitBytes()
	if size == 0 {
		size = d.defaultSize
		if lim > 0 && size > lim {
			size = lim
		}
	}
	size = max(size, minimum)
	if lim > 0 && size > lim {
		return 0, status.Errorf(codes.OutOfRange, "the content source holds %d bytes, above limit_bytes %d", minimum, lim)
	}
	if d.maxSize > 0 && size > d.maxSize {
		return 0, status.Errorf(codes.OutOfRange, "%d bytes is above this driver's largest volume, %d bytes", size, d.maxSize)
	}
	return size, nil
}

// reserve checks that grow more bytes fit in the driver's capacity; d.mu
// must be held.
func (d *Driver) reserve(grow int64) error {
	if d.capacity == 0 {
		return nil
	}
	if grow > d.capacity {
		return status.Errorf(codes.OutOfRange, "%d bytes is above this driver's whole capacity, %d bytes", grow, d.capacity)
	}
	if used := d.st.usedBytes(); used+grow > d.capacity {
		return status.Errorf(codes.ResourceExhausted, "not enough capacity: %d of %d bytes are used, %d more asked for", used, d.capacity, grow)
	}
	return nil
}

// pickNode chooses the node a new volume goes on: the first preferred
// segment naming a node under TopologyKey, else the first such requisite
// segment, else (no requirements) this driver's node.
func (d *Driver) pickNode(tr *csi.TopologyRequirement) (string, error) {
	if len(tr.GetPreferred()) == 0 && len(tr.GetRequisite()) == 0 {
		return d.nodeID, nil
	}
	for _, t := range append(tr.GetPreferred(), tr.GetRequisite()...) {
		if n := t.GetSegments()[TopologyKey]; n != "" {
			return n, nil
		}
	}
	return "", status.Errorf(codes.ResourceExhausted, "no accessibility requirement names a node under %s", TopologyKey)
}

// allowsNode reports whether tr accepts a volume on node.
func allowsNode(tr *csi.TopologyRequirement, node string) bool {
	if len(tr.GetPreferred()) == 0 && len(tr.GetRequisite()) == 0 {
		return true
	}
	for _, t := range append(tr.GetPreferred(), tr.GetRequisite()...) {
		if t.GetSegments()[TopologyKey] == node {
			return true
		}
	}
	return false
}

// segmentsText is topologies as a log shows them, each segment's keys in
// order: [{k=v,k2=v2} {...}], or [] for none. The dev driver logs a
// CreateVolume's accessibility requirements with it, which the cluster
// test compares between csi-provisioner and volplane.
func segmentsText(ts []*csi.Topology) string {
	parts := make([]string, 0, len(ts))
	for _, t := range ts {
		keys := make([]string, 0, len(t.GetSegments()))
		for k := range t.GetSegments() {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		kv := make([]string, len(keys))
		for i, k := range keys {
			kv[i] = k + "=" + t.GetSegments()[k]
		}
		parts = append(parts, "{"+strings.Join(kv, ",")+"}")
	}
	return "[" + strings.Join(parts, " ") + "]"
}
