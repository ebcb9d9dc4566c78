package binder

import (
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volplane/volplane/pkg/match"
)

// findAndReserve chooses the best volume for the claim among the volumes not
// reserved for other claims, and reserves it for the claim, atomically with
// respect to the other workers of this replica.
func (s *store) findAndReserve(c *corev1.PersistentVolumeClaim, delayBinding bool) (*corev1.PersistentVolume, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := s.bestLocked(c, delayBinding, time.Now())
	if err != nil || v == nil {
		return nil, err
	}
	s.reserved[v.Name] = c.UID
	return v, nil
}

// bestLocked is the volume the binder binds the claim to now: the first
// candidate walk visits that breaks no rule. findAndReserve and explain
// both ask it, so explain's "would bind" is the binder's choice. The caller
// holds s.mu.
func (s *store) bestLocked(c *corev1.PersistentVolumeClaim, delayBinding bool, now time.Time) (*corev1.PersistentVolume, error) {
	fit, err := match.NewFit(c)
	if err != nil {
		return nil, err
	}
	var best *corev1.PersistentVolume
	s.walk(fit, walkOptions{delay: delayBinding, now: now}, func(cd candidate) bool {
		if cd.rule == match.RuleNone {
			best = cd.v
			return false
		}
		return true
	})
	return best, nil
}

// candidate is a volume walk visits for a claim, with the first rule it
// breaks (match.RuleNone: the claim can be bound to it now).
type candidate struct {
	v    *corev1.PersistentVolume
	rule match.Rule
	// heldBy, for RuleReserved: the claim UID this replica binds it for,
	// or "" when another replica holds it in etcd (until foreignUntil).
	heldBy       types.UID
	foreignUntil time.Time
}

// walkOptions say how walk goes.
type walkOptions struct {
	// delay: the claim's class is WaitForFirstConsumer and no node is known.
	delay bool
	// now decides which foreign reservations still hold.
	now time.Time
	// all visits every volume of the claim's class and every volume whose
	// claimRef names it (explain); otherwise only those that may fit, which
	// is all the binder needs (a free volume smaller than the request, of
	// a group without the claim's access modes, or while binding is
	// delayed, breaks a rule).
	all bool
	// after resumes after this position (explain's pages); nil starts at
	// the beginning.
	after *position
}

// position is a place in walk's order: the group of access modes, the
// section (volumes whose claimRef names the claim come first), then
// capacity and name.
type position struct {
	Group string `json:"g"`
	Ref   bool   `json:"r,omitempty"`
	Size  int64  `json:"s,omitempty"`
	Name  string `json:"n"`
}

// walk visits the candidates of fit's claim in the binder's order of
// preference (match.Fit.Before): groups of access modes by match.GroupLess;
// in each group the volumes whose claimRef names the claim (by name), then
// the free volumes of the claim's class by capacity and name, as the free
// index keeps them. visit returns false to stop. The cost is bounded by the
// index: the claim's class and the volumes naming the claim, never all
// volumes. The caller holds s.mu (a read lock is enough).
func (s *store) walk(fit *match.Fit, o walkOptions, visit func(candidate) bool) {
	c := fit.Claim()
	type group struct {
		key  string
		refs []*corev1.PersistentVolume
		free *freeList
	}
	groups := map[string]*group{}
	get := func(key string) *group {
		g := groups[key]
		if g == nil {
			g = &group{key: key}
			groups[key] = g
		}
		return g
	}
	for _, v := range s.byClaimRef[claimKey(c)] {
		g := get(match.ModesKey(v.Spec.AccessModes))
		g.refs = append(g.refs, v)
	}
	for key, l := range s.free[match.ClaimClass(c)] {
		get(key).free = l
	}
	ordered := make([]*group, 0, len(groups))
	for _, g := range groups {
		ordered = append(ordered, g)
	}
	sort.Slice(ordered, func(i, j int) bool { return match.GroupLess(ordered[i].key, ordered[j].key) })

	check := func(v *corev1.PersistentVolume) candidate {
		cd := candidate{v: v}
		if until, ok := s.foreign[v.Name]; ok && o.now.Before(until) {
			cd.foreignUntil = until
		} else if uid, ok := s.reserved[v.Name]; ok && uid != c.UID {
			cd.heldBy = uid
		}
		cd.rule = fit.Check(v, o.delay, !cd.foreignUntil.IsZero() || cd.heldBy != "")
		return cd
	}
	a := o.after
	for _, g := range ordered {
		if a != nil && match.GroupLess(g.key, a.Group) {
			continue
		}
		resume := a != nil && g.key == a.Group
		if !o.all && len(g.refs) == 0 && g.free != nil && !match.ContainsAllModes(g.free.modes, c.Spec.AccessModes) {
			continue // every volume of the group breaks RuleAccessModes
		}
		slices.SortFunc(g.refs, func(x, y *corev1.PersistentVolume) int { return strings.Compare(x.Name, y.Name) })
		if !resume || a.Ref {
			for _, v := range g.refs {
				if resume && v.Name <= a.Name {
					continue
				}
				if !visit(check(v)) {
					return
				}
			}
		}
		if g.free == nil || (!o.all && o.delay) {
			continue // while binding is delayed no free volume fits
		}
		entries := g.free.entries
		switch {
		case resume && !a.Ref:
			i := g.free.search(a.Size, a.Name)
			if i < len(entries) && entries[i].size == a.Size && entries[i].v.Name == a.Name {
				i++
			}
			entries = entries[i:]
		case !o.all:
			entries = g.free.from(fit.Requested()) // smaller ones break RuleCapacity
		}
		for _, e := range entries {
			if !visit(check(e.v)) {
				return
			}
		}
	}
}

// at is the position of candidate v in walk's order.
func at(v *corev1.PersistentVolume) position {
	p := position{Group: match.ModesKey(v.Spec.AccessModes), Ref: v.Spec.ClaimRef != nil, Name: v.Name}
	if !p.Ref {
		p.Size = match.Capacity(v)
	}
	return p
}

// reserve reserves a volume for a claim in this replica; false when another
// claim holds it.
func (s *store) reserve(volume string, uid types.UID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if held, ok := s.reserved[volume]; ok && held != uid {
		return false
	}
	s.reserved[volume] = uid
	return true
}

// markForeign records that another replica holds volume in etcd.
func (s *store) markForeign(volume string, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.foreign[volume] = time.Now().Add(d)
}

func (s *store) unreserve(volume string, uid types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reserved[volume] == uid {
		delete(s.reserved, volume)
	}
}
