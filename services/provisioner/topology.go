package provisioner

import (
	"fmt"
	"hash/fnv"
	"sort"
	"strings"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
)

// nodes is what the provisioner needs to know of the cluster's nodes for
// topology: the Node (its labels) and the CSINode (the driver's topology
// keys) of a node, and all CSINodes.
type nodes interface {
	Node(name string) (*corev1.Node, error)
	CSINode(name string) (*storagev1.CSINode, error)
	CSINodes() ([]*storagev1.CSINode, error)
}

// topologyKeys are the keys the driver reports on a node (CSINode), nil
// when the driver is not installed there.
func topologyKeys(cn *storagev1.CSINode, driver string) []string {
	if cn == nil {
		return nil
	}
	for _, d := range cn.Spec.Drivers {
		if d.Name == driver {
			return d.TopologyKeys
		}
	}
	return nil
}

// segmentOf is the node's topology segment for keys, from its labels.
func segmentOf(node *corev1.Node, keys []string) (map[string]string, error) {
	seg := make(map[string]string, len(keys))
	for _, k := range keys {
		v, ok := node.Labels[k]
		if !ok {
			return nil, fmt.Errorf("node %q has no label %q, a topology key of its CSI driver", node.Name, k)
		}
		seg[k] = v
	}
	return seg, nil
}

// accessibilityRequirements is where the volume may be made, as
// external-provisioner decides it:
//   - a selected node (WaitForFirstConsumer): that node's segment, which must
//     lie within the class's allowedTopologies;
//   - else the class's allowedTopologies, every combination of values;
//   - else every segment of a node where the driver is installed.
//
// Preferred lists the same segments, the selected node's first, else
// rotated by the volume name so volumes spread over the segments.
func accessibilityRequirements(n nodes, driver string, class *storagev1.StorageClass, selectedNode, pvName string) (*csi.TopologyRequirement, error) {
	var segs []map[string]string
	switch {
	case selectedNode != "":
		node, err := n.Node(selectedNode)
		if err != nil {
			return nil, fmt.Errorf("selected node %q: %w", selectedNode, err)
		}
		cn, err := n.CSINode(selectedNode)
		if err != nil {
			return nil, fmt.Errorf("CSINode of selected node %q: %w", selectedNode, err)
		}
		keys := topologyKeys(cn, driver)
		if len(keys) == 0 {
			return nil, fmt.Errorf("the CSINode of selected node %q reports no topology keys for driver %q: the driver is not installed there (yet)", selectedNode, driver)
		}
		seg, err := segmentOf(node, keys)
		if err != nil {
			return nil, err
		}
		if len(class.AllowedTopologies) > 0 && !allowed(seg, class.AllowedTopologies) {
			return nil, fmt.Errorf("selected node %q (topology %s) is outside the allowedTopologies of StorageClass %q", selectedNode, segmentString(seg), class.Name)
		}
		return &csi.TopologyRequirement{Requisite: toTopology([]map[string]string{seg}), Preferred: toTopology([]map[string]string{seg})}, nil
	case len(class.AllowedTopologies) > 0:
		for _, term := range class.AllowedTopologies {
			segs = append(segs, expandTerm(term)...)
		}
	default:
		cns, err := n.CSINodes()
		if err != nil {
			return nil, fmt.Errorf("list CSINodes: %w", err)
		}
		for _, cn := range cns {
			keys := topologyKeys(cn, driver)
			if len(keys) == 0 {
				continue
			}
			node, err := n.Node(cn.Name)
			if err != nil {
				continue // a CSINode outliving its Node
			}
			if seg, err := segmentOf(node, keys); err == nil {
				segs = append(segs, seg)
			}
		}
	}
	segs = dedupe(segs)
	if len(segs) == 0 {
		return nil, nil
	}
	preferred := append([]map[string]string(nil), segs...)
	h := fnv.New32a()
	h.Write([]byte(pvName))
	k := int(h.Sum32() % uint32(len(preferred)))
	preferred = append(preferred[k:], preferred[:k]...)
	return &csi.TopologyRequirement{Requisite: toTopology(segs), Preferred: toTopology(preferred)}, nil
}

// allowed reports whether seg satisfies one of the terms: every expression
// of the term names a key of seg with one of its values.
func allowed(seg map[string]string, terms []corev1.TopologySelectorTerm) bool {
	for _, t := range terms {
		ok := true
		for _, e := range t.MatchLabelExpressions {
			v, has := seg[e.Key]
			if !has || !contains(e.Values, v) {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// expandTerm turns {zone in [a,b], rack in [1]} into {zone:a,rack:1},
// {zone:b,rack:1}.
func expandTerm(t corev1.TopologySelectorTerm) []map[string]string {
	out := []map[string]string{{}}
	for _, e := range t.MatchLabelExpressions {
		var next []map[string]string
		for _, seg := range out {
			for _, v := range e.Values {
				s := make(map[string]string, len(seg)+1)
				for k, x := range seg {
					s[k] = x
				}
				s[e.Key] = v
				next = append(next, s)
			}
		}
		out = next
	}
	if len(out) == 1 && len(out[0]) == 0 {
		return nil
	}
	return out
}

func segmentString(seg map[string]string) string {
	keys := make([]string, 0, len(seg))
	for k := range seg {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + seg[k]
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// dedupe drops repeated segments and sorts them, so requirements are the
// same whatever order the nodes were listed in.
func dedupe(segs []map[string]string) []map[string]string {
	seen := map[string]bool{}
	var out []map[string]string
	for _, s := range segs {
		k := segmentString(s)
		if !seen[k] {
			seen[k] = true
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool { return segmentString(out[i]) < segmentString(out[j]) })
	return out
}

func toTopology(segs []map[string]string) []*csi.Topology {
	out := make([]*csi.Topology, len(segs))
	for i, s := range segs {
		out[i] = &csi.Topology{Segments: s}
	}
	return out
}

// nodeAffinity pins the PV to where the driver says the volume can be
// reached: one term per accessible segment.
func nodeAffinity(accessible []*csi.Topology) *corev1.VolumeNodeAffinity {
	if len(accessible) == 0 {
		return nil
	}
	var terms []corev1.NodeSelectorTerm
	for _, t := range accessible {
		keys := make([]string, 0, len(t.GetSegments()))
		for k := range t.GetSegments() {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var exprs []corev1.NodeSelectorRequirement
		for _, k := range keys {
			exprs = append(exprs, corev1.NodeSelectorRequirement{Key: k, Operator: corev1.NodeSelectorOpIn, Values: []string{t.GetSegments()[k]}})
		}
		if len(exprs) > 0 {
			terms = append(terms, corev1.NodeSelectorTerm{MatchExpressions: exprs})
		}
	}
	if len(terms) == 0 {
		return nil
	}
	return &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: terms}}
}
