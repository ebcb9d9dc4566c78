package shape

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	yaml "go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// Limits bounds a document's shape. A zero field means its default.
type Limits struct {
	// MaxDepth is how deep objects and arrays may nest (a flat object is
	// 1).
	MaxDepth int
	// MaxElements is how many values the document may hold, object members
	// and array elements together (a YAML alias counts as what it expands
	// to).
	MaxElements int
	// MaxStringBytes is the longest string value, in bytes.
	MaxStringBytes int
	// MaxKeyBytes is the longest object key, in bytes.
	MaxKeyBytes int
}

// The defaults: generous for any Kubernetes object (a claim nests about 7
// levels, Kubernetes refuses a label key over 317 bytes and an object's
// annotations over 256 KiB together) and far below what costs anything:
// protobuf refuses a google.protobuf.Struct nested about 3,300 levels deep.
const (
	DefaultMaxDepth       = 100
	DefaultMaxElements    = 10000
	DefaultMaxStringBytes = 512 << 10
	DefaultMaxKeyBytes    = 1024
)

// Default are the default limits.
var Default = Limits{MaxDepth: DefaultMaxDepth, MaxElements: DefaultMaxElements, MaxStringBytes: DefaultMaxStringBytes, MaxKeyBytes: DefaultMaxKeyBytes}

func (l Limits) withDefaults() Limits {
	set := func(v *int, def int) {
		if *v <= 0 {
			*v = def
		}
	}
	set(&l.MaxDepth, DefaultMaxDepth)
	set(&l.MaxElements, DefaultMaxElements)
	set(&l.MaxStringBytes, DefaultMaxStringBytes)
	set(&l.MaxKeyBytes, DefaultMaxKeyBytes)
	return l
}

// Limit names one of the limits.
type Limit int

// The limits an Error may name.
const (
	Depth Limit = iota + 1
	Elements
	StringBytes
	KeyBytes
)

// Error is a document that exceeds a limit.
type Error struct {
	// Limit is the limit exceeded, Max its value.
	Limit Limit
	Max   int
	// At is where it was exceeded, as a path such as spec.selector[0]
	// (shortened when long); empty for the document as a whole.
	At string
}

func (e *Error) Error() string {
	var what string
	switch e.Limit {
	case Depth:
		what = fmt.Sprintf("objects and arrays nest deeper than %d levels", e.Max)
	case Elements:
		what = fmt.Sprintf("it holds more than %d values (object members and array elements, aliases expanded)", e.Max)
	case StringBytes:
		what = fmt.Sprintf("a string is longer than %d bytes", e.Max)
	case KeyBytes:
		what = fmt.Sprintf("a key is longer than %d bytes", e.Max)
	default:
		what = "it exceeds a limit"
	}
	if e.At != "" {
		what += " (at " + e.At + ")"
	}
	return what
}

// path is where a walk is, for an Error's At.
type path []string

func (p path) String() string {
	s := strings.TrimPrefix(strings.Join(p, ""), ".")
	if len(s) > 120 {
		s = s[:60] + "..." + s[len(s)-57:]
	}
	return s
}

func key(k string) string {
	if len(k) > 40 {
		k = k[:37] + "..."
	}
	for _, c := range k {
		if !(c == '-' || c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return "[" + strconv.Quote(k) + "]"
		}
	}
	return "." + k
}

func index(i int) string { return "[" + strconv.Itoa(i) + "]" }

// counter counts values and checks each against the limits.
type counter struct {
	l        Limits
	elements int
	// at is where the walk is; where, when set, says it instead.
	at    path
	where func() string
}

func (c *counter) fail(l Limit, max int) error {
	at := ""
	if c.where != nil {
		at = c.where()
	} else {
		at = c.at.String()
	}
	return &Error{Limit: l, Max: max, At: at}
}

// value counts n values at depth.
func (c *counter) value(n, depth int) error {
	if depth > c.l.MaxDepth {
		return c.fail(Depth, c.l.MaxDepth)
	}
	c.elements += n
	if c.elements > c.l.MaxElements {
		return c.fail(Elements, c.l.MaxElements)
	}
	return nil
}

func (c *counter) str(s string) error {
	if len(s) > c.l.MaxStringBytes {
		return c.fail(StringBytes, c.l.MaxStringBytes)
	}
	return nil
}

func (c *counter) key(k string) error {
	if len(k) > c.l.MaxKeyBytes {
		return c.fail(KeyBytes, c.l.MaxKeyBytes)
	}
	return nil
}

// frame is an open JSON object or array.
type frame struct {
	object bool
	// wantKey: the object's next token is a key or its end.
	wantKey bool
	// key is the object's current member, index the array's current
	// element (-1 before the first).
	key   string
	index int
}

// CheckJSON checks the first JSON value of data against l, token by token,
// without building it. Text that is not JSON is left to the decoder:
// CheckJSON reports only a limit exceeded before the syntax error.
func CheckJSON(data []byte, l Limits) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var stack []frame
	c := &counter{l: l.withDefaults(), where: func() string {
		var p path
		for _, f := range stack {
			switch {
			case f.object && !f.wantKey:
				p = append(p, key(f.key))
			case !f.object && f.index >= 0:
				p = append(p, index(f.index))
			}
		}
		return p.String()
	}}
	// done finishes a value: the object holding it expects a key next.
	done := func() bool {
		if len(stack) == 0 {
			return true
		}
		if top := &stack[len(stack)-1]; top.object {
			top.wantKey = true
		}
		return false
	}
	for {
		tok, err := dec.Token()
		if err != nil {
			return nil // empty, or a syntax error: the decoder says which
		}
		d, delim := tok.(json.Delim)
		if n := len(stack); n > 0 && stack[n-1].object && stack[n-1].wantKey {
			if delim { // '}'
				stack = stack[:n-1]
				if done() {
					return nil
				}
				continue
			}
			k, _ := tok.(string)
			stack[n-1].key, stack[n-1].wantKey = k, false
			if err := c.key(k); err != nil {
				return err
			}
			continue
		}
		if delim && d == ']' {
			stack = stack[:len(stack)-1]
			if done() {
				return nil
			}
			continue
		}
		if n := len(stack); n > 0 && !stack[n-1].object {
			stack[n-1].index++
		}
		if delim { // '{' or '['
			if err := c.value(1, len(stack)+1); err != nil {
				return err
			}
			stack = append(stack, frame{object: d == '{', wantKey: d == '{', index: -1})
			continue
		}
		if err := c.value(1, len(stack)); err != nil {
			return err
		}
		if s, ok := tok.(string); ok {
			if err := c.str(s); err != nil {
				return err
			}
		}
		if done() {
			return nil
		}
	}
}

// CheckYAML checks the first YAML document of data against l, aliases
// counted as what they expand to. Text that does not parse as YAML is an
// error too (not an *Error): a decoder should not see it.
func CheckYAML(data []byte, l Limits) (err error) {
	var doc yaml.Node
	defer func() {
		// The YAML parser is not this code's: whatever it does with hostile
		// text, the caller gets an error, not a crash.
		if p := recover(); p != nil {
			err = fmt.Errorf("not YAML: %v", p)
		}
	}()
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("not YAML: %w", err)
	}
	y := &yamlWalk{counter: counter{l: l.withDefaults()}, sizes: map[*yaml.Node]measure{}}
	root := &doc
	if root.Kind == yaml.DocumentNode {
		if len(root.Content) == 0 {
			return nil
		}
		root = root.Content[0]
	}
	_, err = y.walk(root, 0)
	return err
}

// measure is what an anchored node expands to: its values and height.
type measure struct {
	elements, height int
	busy             bool
}

type yamlWalk struct {
	counter
	sizes map[*yaml.Node]measure
}

// walk checks n at depth (of its parent) and returns its height (0 for a
// scalar, 1 for a flat mapping).
func (y *yamlWalk) walk(n *yaml.Node, depth int) (int, error) {
	if n.Kind == yaml.AliasNode {
		return y.alias(n, depth)
	}
	switch n.Kind {
	case yaml.MappingNode, yaml.SequenceNode:
		if err := y.value(1, depth+1); err != nil {
			return 0, err
		}
		height := 0
		for i, child := range n.Content {
			isKey := n.Kind == yaml.MappingNode && i%2 == 0
			switch {
			case n.Kind == yaml.SequenceNode:
				y.at = append(y.at, index(i))
			case isKey:
				y.at = append(y.at, key(scalarOf(child)))
			}
			if isKey {
				if err := y.key(scalarOf(child)); err != nil {
					return 0, err
				}
				if child.Kind == yaml.ScalarNode {
					continue // a key is part of its member, not a value
				}
			}
			h, err := y.walk(child, depth+1)
			if err != nil {
				return 0, err
			}
			height = max(height, h)
			if !isKey {
				y.at = y.at[:len(y.at)-1]
			}
		}
		return height + 1, nil
	default:
		if err := y.value(1, depth); err != nil {
			return 0, err
		}
		return 0, y.str(n.Value)
	}
}

// alias counts an alias as the values of its anchor, measured once.
func (y *yamlWalk) alias(n *yaml.Node, depth int) (int, error) {
	target := n.Alias
	if target == nil {
		return 0, nil
	}
	m, seen := y.sizes[target]
	if m.busy {
		return 0, errors.New("not YAML: an alias refers to the node that contains it")
	}
	if !seen {
		// Measure the anchor's expansion on its own: the elements and
		// height it adds wherever it is used.
		sub := &yamlWalk{counter: counter{l: y.l}, sizes: y.sizes}
		y.sizes[target] = measure{busy: true}
		h, err := sub.walk(target, 0)
		delete(y.sizes, target)
		if err != nil {
			var e *Error
			if errors.As(err, &e) {
				e.At = y.at.String()
			}
			return 0, err
		}
		m = measure{elements: sub.elements, height: h}
		y.sizes[target] = m
	}
	if depth+m.height > y.l.MaxDepth {
		return 0, y.fail(Depth, y.l.MaxDepth)
	}
	if err := y.value(m.elements, 0); err != nil {
		return 0, err
	}
	return m.height, nil
}

// scalarOf is the text of a key (the anchor's, for an alias).
func scalarOf(n *yaml.Node) string {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if n.Kind == yaml.ScalarNode {
		return n.Value
	}
	return ""
}

// CheckStruct checks a decoded google.protobuf.Struct against l.
func CheckStruct(s *structpb.Struct, l Limits) error {
	c := &counter{l: l.withDefaults()}
	return c.structValue(s, 0)
}

func (c *counter) structValue(s *structpb.Struct, depth int) error {
	if err := c.value(1, depth+1); err != nil {
		return err
	}
	for k, v := range s.GetFields() {
		c.at = append(c.at, key(k))
		if err := c.key(k); err != nil {
			return err
		}
		if err := c.protoValue(v, depth+1); err != nil {
			return err
		}
		c.at = c.at[:len(c.at)-1]
	}
	return nil
}

func (c *counter) protoValue(v *structpb.Value, depth int) error {
	switch k := v.GetKind().(type) {
	case *structpb.Value_StructValue:
		return c.structValue(k.StructValue, depth)
	case *structpb.Value_ListValue:
		if err := c.value(1, depth+1); err != nil {
			return err
		}
		for i, e := range k.ListValue.GetValues() {
			c.at = append(c.at, index(i))
			if err := c.protoValue(e, depth+1); err != nil {
				return err
			}
			c.at = c.at[:len(c.at)-1]
		}
		return nil
	case *structpb.Value_StringValue:
		if err := c.value(1, depth); err != nil {
			return err
		}
		return c.str(k.StringValue)
	default:
		return c.value(1, depth)
	}
}
