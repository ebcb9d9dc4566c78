package main

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// A path names a field of an object, one step a map key or a list
// selector:
//
//	name=X   the element of a list of maps whose "name" is X
//	=X       the string element equal to X
//	~RE      every string element RE matches (they must be adjacent)
//	#N       the list element at index N
//
// Anything else is a map key, taken literally (dots and slashes too).
type path []string

func (p path) String() string { return strings.Join(p, "/") }

// site is where a path ends: a map and its key, or a list held by its
// parent map's key and the indexes of the selected elements.
type site struct {
	m    map[string]any
	key  string
	list bool  // the path ends on list elements of m[key]
	idx  []int // the elements' indexes, ascending and adjacent
}

// value is the value at a site: the field, or the first selected element.
func (s site) value() (any, bool) {
	v, ok := s.m[s.key]
	if !s.list || !ok {
		return v, ok
	}
	return v.([]any)[s.idx[0]], true
}

// values are the selected list elements, or the field alone.
func (s site) values() []any {
	if !s.list {
		v := s.m[s.key]
		return []any{v}
	}
	var out []any
	for _, i := range s.idx {
		out = append(out, s.m[s.key].([]any)[i])
	}
	return out
}

// set puts v in place of the site's field, or of its elements (all of them
// become one element v).
func (s site) set(v any) {
	if !s.list {
		s.m[s.key] = v
		return
	}
	l := s.m[s.key].([]any)
	out := append([]any{}, l[:s.idx[0]]...)
	out = append(out, v)
	out = append(out, l[s.idx[len(s.idx)-1]+1:]...)
	s.m[s.key] = out
}

// wrap puts list elements begin before the site's elements and end after
// them.
func (s site) wrap(begin, end any) {
	l := s.m[s.key].([]any)
	first, last := s.idx[0], s.idx[len(s.idx)-1]
	out := append([]any{}, l[:first]...)
	out = append(out, begin)
	out = append(out, l[first:last+1]...)
	out = append(out, end)
	out = append(out, l[last+1:]...)
	s.m[s.key] = out
}

// resolve finds the site of p in obj. The last step may be a map key that
// is absent (present reports it); every step before it must exist.
func resolve(obj map[string]any, p path) (s site, present bool, err error) {
	cur := any(obj)
	for i, step := range p {
		last := i == len(p)-1
		switch {
		case isSelector(step):
			parent, ok := cur.([]any)
			if !ok {
				return site{}, false, fmt.Errorf("%s: %s is not a list", p, path(p[:i]))
			}
			idx, err := selectElems(parent, step)
			if err != nil {
				return site{}, false, fmt.Errorf("%s: %w", p, err)
			}
			if last {
				return site{m: s.m, key: s.key, list: true, idx: idx}, true, nil
			}
			if len(idx) != 1 {
				return site{}, false, fmt.Errorf("%s: %s selects %d elements, want one", p, step, len(idx))
			}
			cur = parent[idx[0]]
		default:
			m, ok := cur.(map[string]any)
			if !ok {
				return site{}, false, fmt.Errorf("%s: %s is not a map", p, path(p[:i]))
			}
			v, ok := m[step]
			s = site{m: m, key: step}
			if last {
				return s, ok, nil
			}
			if !ok {
				return site{}, false, fmt.Errorf("%s: no %s", p, path(p[:i+1]))
			}
			cur = v
		}
	}
	return site{}, false, fmt.Errorf("empty path")
}

func isSelector(step string) bool {
	return strings.HasPrefix(step, "name=") || strings.HasPrefix(step, "=") ||
		strings.HasPrefix(step, "~") || strings.HasPrefix(step, "#")
}

// selectElems are the indexes of the list elements a selector picks: at
// least one, adjacent.
func selectElems(l []any, step string) ([]int, error) {
	var match func(any) bool
	switch {
	case strings.HasPrefix(step, "#"):
		n, err := strconv.Atoi(step[1:])
		if err != nil || n < 0 || n >= len(l) {
			return nil, fmt.Errorf("no element %s in a list of %d", step, len(l))
		}
		return []int{n}, nil
	case strings.HasPrefix(step, "name="):
		match = func(e any) bool { m, ok := e.(map[string]any); return ok && m["name"] == step[len("name="):] }
	case strings.HasPrefix(step, "="):
		match = func(e any) bool { return e == step[1:] }
	default:
		re, err := regexp.Compile(step[1:])
		if err != nil {
			return nil, err
		}
		match = func(e any) bool { s, ok := e.(string); return ok && re.MatchString(s) }
	}
	var idx []int
	for i, e := range l {
		if match(e) {
			idx = append(idx, i)
		}
	}
	switch {
	case len(idx) == 0:
		return nil, fmt.Errorf("no element %s", step)
	case idx[len(idx)-1]-idx[0] != len(idx)-1:
		return nil, fmt.Errorf("the elements %s are not adjacent (%v)", step, idx)
	case !strings.HasPrefix(step, "~") && len(idx) > 1:
		return nil, fmt.Errorf("%d elements %s, want one", len(idx), step)
	}
	return idx, nil
}
