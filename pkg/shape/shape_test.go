package shape_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/volplane/volplane/pkg/shape"
)

func nest(open, close string, n int, inner string) string {
	return strings.Repeat(open, n) + inner + strings.Repeat(close, n)
}

// laughs is the billion laughs: levels of ten aliases each.
func laughs(levels int) string {
	var b strings.Builder
	b.WriteString(`a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]` + "\n")
	for c := 'b'; c < 'a'+rune(levels); c++ {
		p := string(c - 1)
		fmt.Fprintf(&b, "%c: &%c [*%s,*%s,*%s,*%s,*%s,*%s,*%s,*%s,*%s,*%s]\n", c, c, p, p, p, p, p, p, p, p, p, p)
	}
	return b.String()
}

func TestChecks(t *testing.T) {
	small := shape.Limits{MaxDepth: 3, MaxElements: 10, MaxStringBytes: 5, MaxKeyBytes: 3}
	for _, tc := range []struct {
		name   string
		yaml   bool
		doc    string
		limits shape.Limits
		want   shape.Limit // 0: passes
		at     string
	}{
		{name: "flat", doc: `{"a":1,"b":"x"}`, limits: small},
		{name: "at the depth limit", doc: `{"a":{"b":{"c":1}}}`, limits: small},
		{name: "one over the depth", doc: `{"a":{"b":{"c":{}}}}`, limits: small, want: shape.Depth, at: "a.b.c"},
		{name: "arrays nest too", doc: `{"a":[[[1]]]}`, limits: small, want: shape.Depth, at: "a[0][0]"},
		{name: "scalars add no depth", doc: `[[["x"]]]`, limits: small},
		{name: "at the element limit", doc: `[1,2,3,4,5,6,7,8,9]`, limits: small},
		{name: "one over the elements", doc: `[1,2,3,4,5,6,7,8,9,10]`, limits: small, want: shape.Elements, at: "[9]"},
		{name: "members count", doc: `{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"i":9,"j":10}`, limits: small, want: shape.Elements, at: "j"},
		{name: "string at the limit", doc: `{"a":"12345"}`, limits: small},
		{name: "string over", doc: `{"a":["123456"]}`, limits: small, want: shape.StringBytes, at: "a[0]"},
		{name: "escapes count as what they decode to", doc: `{"a":"\u00e9\u00e9\u00e9"}`, limits: small, want: shape.StringBytes, at: "a"},
		{name: "key at the limit", doc: `{"abc":1}`, limits: small},
		{name: "key over", doc: `{"x":{"abcd":1}}`, limits: small, want: shape.KeyBytes, at: `x.abcd`},
		{name: "odd key quoted in the path", doc: `{"a.b":{"c":{"d":{}}}}`, limits: small, want: shape.Depth, at: `["a.b"].c.d`},
		{name: "not JSON is the decoder's", doc: `{"a":`, limits: small},
		{name: "after the first value", doc: `{"a":1} [[[[[[`, limits: small},
		{name: "scalar document", doc: `"12345678"`, limits: small, want: shape.StringBytes},
		{name: "empty", doc: ``, limits: small},
		{name: "5000 levels", doc: nest(`{"a":`, "}", 5000, "1"), want: shape.Depth},
		{name: "defaults for zero limits", doc: nest("[", "]", shape.DefaultMaxDepth, "")},

		{name: "YAML flat", yaml: true, doc: "a: 1\nb: x\n", limits: small},
		{name: "YAML at the depth limit", yaml: true, doc: "a:\n  b:\n    c: 1\n", limits: small},
		{name: "YAML over the depth", yaml: true, doc: "a:\n  b:\n    c:\n      d: 1\n", limits: small, want: shape.Depth, at: "a.b.c"},
		{name: "YAML flow", yaml: true, doc: "a: [[[1]]]\n", limits: small, want: shape.Depth, at: "a[0][0]"},
		{name: "YAML elements", yaml: true, doc: "[1,2,3,4,5,6,7,8,9,10]", limits: small, want: shape.Elements, at: "[9]"},
		{name: "YAML string", yaml: true, doc: "a: |\n  123456\n", limits: small, want: shape.StringBytes, at: "a"},
		{name: "YAML key", yaml: true, doc: "abcd: 1\n", limits: small, want: shape.KeyBytes, at: "abcd"},
		{name: "YAML alias within", yaml: true, doc: "a: &x [1, 2]\nb: *x\n", limits: small},
		{name: "YAML aliases expand", yaml: true, doc: "a: &x [1, 2, 3]\nb: [*x, *x]\n", limits: small, want: shape.Elements, at: "b[1]"},
		{name: "YAML alias nests its anchor", yaml: true, doc: "a: &x [[1]]\nb: [*x]\n", limits: small, want: shape.Depth, at: "b[0]"},
		{name: "YAML alias to a long string", yaml: true, doc: "a: &x 12345\nb: *x\n", limits: small},
		{name: "YAML alias as a key", yaml: true, doc: "a: &k abcd\n", limits: shape.Limits{MaxKeyBytes: 3}},
		{name: "YAML billion laughs", yaml: true, doc: laughs(9), want: shape.Elements},
		{name: "YAML only the first document", yaml: true, doc: "a: 1\n---\n" + nest("[", "]", 500, ""), limits: small},
		{name: "YAML deep flow, 5000", yaml: true, doc: "a: " + nest("[", "]", 5000, ""), want: shape.Depth},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			var err error
			if tc.yaml {
				err = shape.CheckYAML([]byte(tc.doc), tc.limits)
			} else {
				err = shape.CheckJSON([]byte(tc.doc), tc.limits)
			}
			if took := time.Since(start); took > time.Second {
				t.Errorf("took %v", took)
			}
			var e *shape.Error
			switch {
			case tc.want == 0 && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want == 0:
			case !errors.As(err, &e) || e.Limit != tc.want:
				t.Fatalf("%v, want limit %d", err, tc.want)
			case tc.at != "" && e.At != tc.at:
				t.Fatalf("at %q, want %q (%v)", e.At, tc.at, err)
			}
		})
	}
}

// A YAML text that does not parse is an error, and not an *Error.
func TestCheckYAMLRefusesWhatDoesNotParse(t *testing.T) {
	err := shape.CheckYAML([]byte("a: [b\n"), shape.Default)
	var e *shape.Error
	if err == nil || errors.As(err, &e) || !strings.Contains(err.Error(), "not YAML") {
		t.Fatalf("%v", err)
	}
}

func TestCheckStruct(t *testing.T) {
	small := shape.Limits{MaxDepth: 3, MaxElements: 10, MaxStringBytes: 5, MaxKeyBytes: 3}
	for _, tc := range []struct {
		name string
		doc  string
		want shape.Limit
	}{
		{"within", `{"a":{"b":{"c":"12345"}}}`, 0},
		{"deep", `{"a":{"b":{"c":{}}}}`, shape.Depth},
		{"deep list", `{"a":[[[1]]]}`, shape.Depth},
		{"wide", `{"a":[1,2,3,4,5,6,7,8,9]}`, shape.Elements},
		{"string", `{"a":"123456"}`, shape.StringBytes},
		{"key", `{"abcd":1}`, shape.KeyBytes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var m map[string]any
			if err := json.Unmarshal([]byte(tc.doc), &m); err != nil {
				t.Fatal(err)
			}
			s, err := structpb.NewStruct(m)
			if err != nil {
				t.Fatal(err)
			}
			err = shape.CheckStruct(s, small)
			var e *shape.Error
			if (tc.want == 0) != (err == nil) || (err != nil && (!errors.As(err, &e) || e.Limit != tc.want)) {
				t.Fatalf("%v, want limit %d", err, tc.want)
			}
		})
	}
}

func FuzzCheckJSON(f *testing.F) {
	for _, s := range []string{`{"a":[1,{"b":"c"}]}`, `[[[[`, `{"a":}`, `"x"`, `{}`, `[]`, `{"a":{"b":[1,2,[3]]},"c":"d"}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		l := shape.Limits{MaxDepth: 2, MaxElements: 5, MaxStringBytes: 4, MaxKeyBytes: 2}
		err := shape.CheckJSON([]byte(s), l)
		var v any
		if json.Unmarshal([]byte(s), &v) != nil {
			return
		}
		// A valid document that passes is within the limits.
		if err == nil && exceeds(v, l, 0) {
			t.Fatalf("%q passed", s)
		}
	})
}

// exceeds reports whether v breaks l (the slow way).
func exceeds(v any, l shape.Limits, depth int) bool {
	n := 0
	var walk func(v any, depth int) bool
	walk = func(v any, depth int) bool {
		n++
		switch x := v.(type) {
		case map[string]any:
			if depth+1 > l.MaxDepth {
				return true
			}
			for k, e := range x {
				if len(k) > l.MaxKeyBytes || walk(e, depth+1) {
					return true
				}
			}
		case []any:
			if depth+1 > l.MaxDepth {
				return true
			}
			for _, e := range x {
				if walk(e, depth+1) {
					return true
				}
			}
		case string:
			return len(x) > l.MaxStringBytes
		}
		return false
	}
	return walk(v, depth) || n > l.MaxElements
}

func Example() {
	body := []byte(`{"spec":{"selector":{"matchLabels":{"tier":"gold"}}}}`)
	fmt.Println(shape.CheckJSON(body, shape.Default))
	fmt.Println(shape.CheckJSON(body, shape.Limits{MaxDepth: 2}))
	// Output:
	// <nil>
	// objects and arrays nest deeper than 2 levels (at spec.selector)
}
