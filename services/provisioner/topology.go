package provisioner

import (
	"fmt"
	"hash/fnv"
	"sort"
	"strconv"
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
	Nodes() ([]*corev1.Node, error)
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
// external-provisioner v6.3.0 decides it (GenerateAccessibilityRequirements;
// --immediate-topology=false is unconstrained, checked before):
//   - requisite: with --strict-topology and a selected node, that node's
//     segment alone (within the class's allowedTopologies); else the
//     class's allowedTopologies, every combination of values; else every
//     segment of a node labelled with the driver's topology keys (the
//     selected node's keys, or for Immediate binding those of a CSINode
//     that lists the driver: none at all is an error, as the driver must
//     have registered somewhere first). Sorted, without repeats.
//   - preferred: the same, rotated so that the selected node's segment
//     comes first; for Immediate binding rotated by a hash of the claim's
//     name with upstream's StatefulSet rule, so that the claims of one
//     StatefulSet member land together and the members spread.
func accessibilityRequirements(n nodes, driver string, class *storagev1.StorageClass, selectedNode, claimName string, strict bool) (*csi.TopologyRequirement, error) {
	var requisite []map[string]string
	var keys []string
	var selected map[string]string
	if selectedNode != "" {
		cn, err := n.CSINode(selectedNode)
		if err != nil {
			return nil, fmt.Errorf("failed to get selected CSINode %s: %w", selectedNode, err)
		}
		if keys = topologyKeys(cn, driver); len(keys) == 0 {
			return nil, fmt.Errorf("no topology key found for node %s", selectedNode)
		}
		node, err := n.Node(selectedNode)
		if err != nil {
			return nil, fmt.Errorf("selected node %q: %w", selectedNode, err)
		}
		if selected, err = segmentOf(node, keys); err != nil {
			return nil, err
		}
		if strict {
			if len(class.AllowedTopologies) > 0 && !allowed(selected, class.AllowedTopologies) {
				return nil, fmt.Errorf("selected node %q (topology %s) is outside the allowedTopologies of StorageClass %q", selectedNode, segmentString(selected), class.Name)
			}
			requisite = []map[string]string{selected}
		}
	}
	if len(requisite) == 0 {
		if len(class.AllowedTopologies) > 0 {
			for _, term := range class.AllowedTopologies {
				requisite = append(requisite, expandTerm(term)...)
			}
		} else {
			var err error
			if requisite, err = aggregate(n, driver, keys); err != nil {
				return nil, err
			}
			if len(requisite) == 0 {
				return nil, fmt.Errorf("no available topology found")
			}
		}
	}
	requisite = dedupe(requisite)
	if len(requisite) == 0 {
		return nil, nil
	}
	var preferred []map[string]string
	switch {
	case selectedNode == "":
		hash, index := claimNameHash(claimName)
		k := int((hash + index) % uint32(len(requisite)))
		preferred = rotate(requisite, k)
	case strict:
		preferred = requisite
	default:
		for i, seg := range requisite {
			if subset(seg, selected) {
				preferred = rotate(requisite, i)
				break
			}
		}
		if preferred == nil {
			return nil, fmt.Errorf("topology %s from selected node %q is not in requisite", segmentString(selected), selectedNode)
		}
	}
	return &csi.TopologyRequirement{Requisite: toTopology(requisite), Preferred: toTopology(preferred)}, nil
}

// aggregate is every segment, for keys, of the nodes labelled with all of
// them. With no keys (Immediate binding) the keys are those a CSINode
// lists for the driver; none: no segments.
func aggregate(n nodes, driver string, keys []string) ([]map[string]string, error) {
	if len(keys) == 0 {
		cns, err := n.CSINodes()
		if err != nil {
			return nil, fmt.Errorf("error listing CSINodes: %w", err)
		}
		sort.Slice(cns, func(i, j int) bool { return cns[i].Name < cns[j].Name })
		for _, cn := range cns {
			if keys = topologyKeys(cn, driver); len(keys) > 0 {
				break
			}
		}
		if len(keys) == 0 {
			return nil, nil
		}
	}
	nodes, err := n.Nodes()
	if err != nil {
		return nil, fmt.Errorf("error listing nodes: %w", err)
	}
	var segs []map[string]string
	for _, node := range nodes {
		if seg, err := segmentOf(node, keys); err == nil {
			segs = append(segs, seg)
		}
	}
	if len(segs) == 0 {
		return nil, fmt.Errorf("topologyKeys %v were not found on any nodes", keys)
	}
	return segs, nil
}

// claimNameHash is external-provisioner's spreading hash of a claim name
// (getPVCNameHashAndIndexOffset): a name ending in "-<n>" hashes its
// prefix and is offset by n, and of "<claim>-<statefulset>-<n>" only the
// part after the prefix's last dash is hashed, so every claim of one
// StatefulSet member gets the same segment and members round-robin.
func claimNameHash(name string) (hash, index uint32) {
	s := name
	if dash := strings.LastIndexByte(name, '-'); dash != -1 {
		if id, err := strconv.ParseUint(name[dash+1:], 10, 32); err == nil {
			index = uint32(id)
			s = name[:dash]
			if d := strings.LastIndexByte(s, '-'); d != -1 {
				s = s[d+1:]
			}
		}
	}
	h := fnv.New32()
	h.Write([]byte(s))
	return h.Sum32(), index
}

// rotate returns segs starting at k.
func rotate(segs []map[string]string, k int) []map[string]string {
	return append(append([]map[string]string(nil), segs[k:]...), segs[:k]...)
}

// subset reports whether every key of seg has the same value in of.
func subset(seg, of map[string]string) bool {
	for k, v := range seg {
		if of[k] != v {
			return false
		}
	}
	return true
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
	sort.SliceStable(out, func(i, j int) bool { return compareSegments(out[i], out[j]) < 0 })
	return out
}

// compareSegments orders segments as external-provisioner orders its terms
// (topologyTerm.compare): fewer keys first, then key by key (in key order),
// by key, then by value.
func compareSegments(a, b map[string]string) int {
	if len(a) != len(b) {
		return len(a) - len(b)
	}
	ka, kb := sortedKeys(a), sortedKeys(b)
	for i := range ka {
		if c := strings.Compare(ka[i], kb[i]); c != 0 {
			return c
		}
		if c := strings.Compare(a[ka[i]], b[kb[i]]); c != 0 {
			return c
		}
	}
	return 0
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
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
