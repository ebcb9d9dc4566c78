package main

import (
	"embed"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"text/template"

	"sigs.k8s.io/yaml"
)

// skel holds the chart's files that are not objects of the base: its
// Chart.yaml and values.yaml (templates of the generator), its schema,
// helpers and notes.
//
//go:embed skel/Chart.yaml skel/values.yaml skel/values.schema.json skel/_helpers.tpl skel/NOTES.txt
var skel embed.FS

// skeleton makes the chart's own files: Chart.yaml at version, values.yaml
// with the base's defaults, the schema, the helpers and the notes. Every
// default must appear in values.yaml and in the schema, and values.yaml
// may name no key the hooks do not give.
func skeleton(defaults map[string]any, version string) (map[string]string, error) {
	used := map[string]bool{}
	funcs := template.FuncMap{"v": func(key string, indent int) (string, error) {
		v, ok := defaults[key]
		if !ok {
			return "", fmt.Errorf("values.yaml names %s, which no hook gives", key)
		}
		used[key] = true
		return valueText(v, indent)
	}}
	out := map[string]string{}
	for file, dest := range map[string]string{"Chart.yaml": "Chart.yaml", "values.yaml": "values.yaml"} {
		t, err := template.New(file).Funcs(funcs).Option("missingkey=error").ParseFS(skel, "skel/"+file)
		if err != nil {
			return nil, err
		}
		var b strings.Builder
		if err := t.Execute(&b, map[string]string{"Version": version}); err != nil {
			return nil, err
		}
		out[dest] = b.String()
	}
	for key := range defaults {
		if !used[key] {
			return nil, fmt.Errorf("values key %s has a hook but no line in hack/genchart/skel/values.yaml", key)
		}
	}
	for file, dest := range map[string]string{"values.schema.json": "values.schema.json", "_helpers.tpl": "templates/_helpers.tpl", "NOTES.txt": "templates/NOTES.txt"} {
		b, err := skel.ReadFile("skel/" + file)
		if err != nil {
			return nil, err
		}
		out[dest] = string(b)
	}
	return out, checkSchema([]byte(out["values.schema.json"]), defaults)
}

// valueText is a default as values.yaml writes it after "key:": inline
// for scalars and empty maps, else a block indented by indent.
func valueText(v any, indent int) (string, error) {
	switch x := v.(type) {
	case map[string]any:
		if len(x) == 0 {
			return " {}", nil
		}
	case []any:
		if len(x) == 0 {
			return " []", nil
		}
	default:
		b, err := json.Marshal(v)
		return " " + string(b), err
	}
	b, err := yaml.Marshal(v)
	if err != nil {
		return "", err
	}
	pad := strings.Repeat(" ", indent)
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	for i := range lines {
		lines[i] = pad + lines[i]
	}
	return "\n" + strings.Join(lines, "\n"), nil
}

// checkSchema fails when a values key has no property in the schema.
func checkSchema(b []byte, defaults map[string]any) error {
	var schema map[string]any
	if err := json.Unmarshal(b, &schema); err != nil {
		return fmt.Errorf("values.schema.json: %w", err)
	}
	var missing []string
	for key := range defaults {
		s := schema
		for _, part := range strings.Split(key, ".") {
			next, ok := property(schema, s, part)
			if !ok {
				missing = append(missing, key)
				break
			}
			s = next
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return fmt.Errorf("hack/genchart/skel/values.schema.json has no property for %s", strings.Join(missing, ", "))
	}
	return nil
}

// property is the schema of a property of schema s, through $ref
// (#/definitions/...) and allOf.
func property(root, s map[string]any, name string) (map[string]any, bool) {
	if ref, ok := s["$ref"].(string); ok {
		defs, _ := root["definitions"].(map[string]any)
		s, _ = defs[strings.TrimPrefix(ref, "#/definitions/")].(map[string]any)
	}
	if props, ok := s["properties"].(map[string]any); ok {
		if p, ok := props[name].(map[string]any); ok {
			return p, true
		}
	}
	all, _ := s["allOf"].([]any)
	for _, sub := range all {
		if m, ok := sub.(map[string]any); ok {
			if p, ok := property(root, m, name); ok {
				return p, true
			}
		}
	}
	return nil, false
}
