package main

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"
)

// A chart being generated: the objects, the tokens standing where hooks
// go, and the values' defaults taken from the base.
type chart struct {
	objs     []*object
	tokens   []hook // token i stands for tokens[i]
	defaults map[string]any
}

// token is the placeholder of hook i in an object until it is rendered
// as YAML: a plain scalar YAML never quotes nor folds.
func token(i int) string { return fmt.Sprintf("volplanehook%dx", i) }

// endToken closes the elements of a cond hook, whose token opens them.
func endToken(i int) string { return fmt.Sprintf("volplanehookend%dx", i) }

var tokenRE = regexp.MustCompile(`['"]?volplanehook(end)?([0-9]+)x['"]?`)

// find is the one object of a kind and name.
func (c *chart) find(kind, name string) (*object, error) {
	var found []*object
	for _, o := range c.objs {
		if o.kind == kind && o.name == name {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		return nil, fmt.Errorf("%d objects %s/%s, want one: the base changed; update hack/genchart's hooks", len(found), kind, name)
	}
	return found[0], nil
}

// apply puts hook h's token in its object and records its default.
func (c *chart) apply(h hook) error {
	o, err := c.find(h.kind, h.name)
	if err != nil {
		return fmt.Errorf("values key %s: %w", h.key, err)
	}
	s, present, err := resolve(o.u, h.at)
	if err != nil {
		return fmt.Errorf("values key %s: %s/%s: %w: the base changed; update hack/genchart's hooks", h.key, h.kind, h.name, err)
	}
	if !present && h.how != optional {
		return fmt.Errorf("values key %s: %s/%s has no %s: the base changed; update hack/genchart's hooks", h.key, h.kind, h.name, h.at)
	}
	if h.expect == nil {
		if err := c.setDefaults(h, s, present); err != nil {
			return fmt.Errorf("%s/%s %s: %w", h.kind, h.name, h.at, err)
		}
	}
	h.expectAt = s.values()
	c.tokens = append(c.tokens, h)
	if h.how == cond {
		if !s.list {
			return fmt.Errorf("values key %s: %s/%s %s: a condition needs list elements", h.key, h.kind, h.name, h.at)
		}
		s.wrap(token(len(c.tokens)-1), endToken(len(c.tokens)-1))
		return nil
	}
	s.set(token(len(c.tokens) - 1))
	return nil
}

// setDefaults records the defaults a hook's site gives its key.
func (c *chart) setDefaults(h hook, s site, present bool) error {
	var v any
	switch {
	case h.def != nil && (h.how == cond || !present):
		v = h.def
	case present:
		v, _ = s.value()
	}
	d := map[string]any{h.key: v}
	if h.defaults != nil && present {
		d = h.defaults(v)
	}
	for k, v := range d {
		if old, ok := c.defaults[k]; ok && !sameJSON(old, v) {
			return fmt.Errorf("values key %s: the base has both %v and %v", k, old, v)
		}
		c.defaults[k] = v
	}
	return nil
}

// check runs every hook's expect against the base's values at its site.
func (c *chart) check() error {
	for _, h := range c.tokens {
		if h.expect == nil {
			continue
		}
		if want := h.expect(c.defaults); !sameJSON(h.expectAt, want) {
			return fmt.Errorf("%s/%s %s: the base has %v, the chart's template would render %v at the default values: the base changed; update hack/genchart's hook (and skel/_helpers.tpl)",
				h.kind, h.name, h.at, h.expectAt, want)
		}
	}
	return nil
}

func sameJSON(a, b any) bool {
	x, err1 := json.Marshal(a)
	y, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && string(x) == string(y)
}

// template renders object o as the text of a Helm template.
func (c *chart) template(o *object) (string, error) {
	b, err := yaml.Marshal(o.u)
	if err != nil {
		return "", err
	}
	// The base's own {{ (alert annotations, dashboards) are text, not actions.
	text := strings.ReplaceAll(string(b), "{{", `{{ "{{" }}`)
	var out []string
	for _, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		m := tokenRE.FindStringSubmatchIndex(line)
		if m == nil {
			out = append(out, line)
			continue
		}
		var i int
		fmt.Sscan(line[m[4]:m[5]], &i)
		r, err := c.render(c.tokens[i], m[2] >= 0, line[:m[0]], line[m[1]:])
		if err != nil {
			return "", fmt.Errorf("%s/%s: %w", o.kind, o.name, err)
		}
		out = append(out, r)
		if tokenRE.MatchString(line[m[1]:]) {
			return "", fmt.Errorf("%s/%s: two hooks on one line: %s", o.kind, o.name, line)
		}
	}
	body := strings.Join(out, "\n") + "\n"
	if o.cond != "" {
		body = fmt.Sprintf("{{- if .Values.%s }}\n%s{{- end }}\n", o.cond, body)
	}
	if o.source.cond != "" {
		body = fmt.Sprintf("{{- if %s }}\n%s{{- end }}\n", o.source.cond, body)
	}
	return body, nil
}

// render is the template text of hook h's line: prefix is the line up to
// the token ("  key: " or "  - "), rest what follows it; end says it is
// the line of a cond hook's endToken.
func (c *chart) render(h hook, end bool, prefix, rest string) (string, error) {
	indent := prefix[:len(prefix)-len(strings.TrimLeft(prefix, " "))]
	if h.how == cond {
		if strings.TrimSpace(prefix) != "-" || rest != "" {
			return "", fmt.Errorf("values key %s: %s is not a list element", h.key, h.at)
		}
		if end {
			return indent + "{{- end }}", nil
		}
		return indent + "{{- if " + ".Values." + h.key + " }}", nil
	}
	val := ".Values." + h.key
	expr := h.expr
	if expr == "" {
		expr = "toJson " + val
	}
	block := func(open, line string) string {
		return fmt.Sprintf("%s{{- %s }}\n%s%s\n%s{{- end }}", indent, open, prefix, line, indent)
	}
	switch h.how {
	case inline:
		return prefix + "{{ " + expr + " }}" + rest, nil
	case optional:
		return block("with "+val, "{{ toJson . }}"), nil
	case elems:
		if strings.TrimSpace(prefix) != "-" {
			return "", fmt.Errorf("values key %s: %s is not a list element", h.key, h.at)
		}
		return block("range $i := until (int "+val+")", "{{ "+expr+" | toJson }}"), nil
	}
	return "", fmt.Errorf("hook kind %d", h.how)
}

// files are the chart's templates: templates/<source>/<kind>-<name>.yaml.
func (c *chart) files() (map[string]string, error) {
	out := map[string]string{}
	for _, o := range c.objs {
		name := strings.ToLower(o.kind + "-" + o.name)
		if o.namespace != "" && c.ambiguous(o) {
			name += "-" + o.namespace
		}
		file := "templates/" + o.source.dir + "/" + name + ".yaml"
		if _, dup := out[file]; dup {
			return nil, fmt.Errorf("two objects make %s", file)
		}
		text, err := c.template(o)
		if err != nil {
			return nil, err
		}
		out[file] = header + text
	}
	return out, nil
}

// ambiguous reports whether another object has o's kind and name.
func (c *chart) ambiguous(o *object) bool {
	return slices.ContainsFunc(c.objs, func(p *object) bool { return p != o && p.kind == o.kind && p.name == o.name })
}

const header = "# Generated by hack/genchart from deploy/kubernetes: do not edit (make chart).\n"
