package devcsi

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// CreationTimeKey is the volume_context key under which the driver reports
// when a volume was made (RFC 3339, UTC). The provisioner's orphan report
// reads it to give an orphan's age; CSI itself has no such field.
const CreationTimeKey = "volplane.io/creation-time"

// NodeKey is the volume_context key naming the node a volume is on (its
// topology segment's value). The kubelet passes the volume context to
// NodeStageVolume, so a node plugin can tell a volume of another node
// from one that does not exist, even when it cannot see that node's
// state.
const NodeKey = "volplane.io/node"

// SetNodeCapacity sets the bytes node holds, overriding
// Options.NodeCapacity for that node; 0 means no limit there. Volumes
// already on the node are kept even when they exceed it.
func (d *Driver) SetNodeCapacity(node string, bytes int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.nodeCapacities == nil {
		d.nodeCapacities = map[string]int64{}
	}
	d.nodeCapacities[node] = bytes
}

// nodeLimit is the bytes node holds, 0 for no limit; d.mu must be held.
func (d *Driver) nodeLimit(node string) int64 {
	if c, ok := d.nodeCapacities[node]; ok {
		return c
	}
	return d.nodeCapacity
}

// usedOn is the capacity given out to volumes on node; d.mu must be held.
func (d *Driver) usedOn(node string) int64 {
	var n int64
	for _, v := range d.st.Volumes {
		if v.Node == node {
			n += v.CapacityBytes
		}
	}
	return n
}

// reserveOn checks that grow more bytes fit on node as well as in the
// driver's whole capacity; d.mu must be held.
func (d *Driver) reserveOn(node string, grow int64) error {
	if err := d.reserve(grow); err != nil {
		return err
	}
	limit := d.nodeLimit(node)
	if limit == 0 {
		return nil
	}
	if used := d.usedOn(node); used+grow > limit {
		return status.Errorf(codes.ResourceExhausted, "not enough capacity on node %q: %d of %d bytes are used, %d more asked for", node, used, limit, grow)
	}
	return nil
}

// available is what GetCapacity reports for node ("" for no segment), and
// whether a limit applies at all; d.mu must be held.
func (d *Driver) available(node string) (int64, bool) {
	var left int64 = -1
	if d.capacity > 0 {
		left = max(d.capacity-d.st.usedBytes(), 0)
	}
	if node != "" {
		if limit := d.nodeLimit(node); limit > 0 {
			onNode := max(limit-d.usedOn(node), 0)
			if left < 0 || onNode < left {
				left = onNode
			}
		}
	}
	return left, left >= 0
}
