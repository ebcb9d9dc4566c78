package kubectlplugin

import (
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// complete runs `__complete args...` (what kubectl_complete-volplane
// runs) and returns the completions and the directive line.
func complete(t *testing.T, gw string, args ...string) ([]string, string) {
	t.Helper()
	out, _, err := run(t, gw, append([]string{cobra.ShellCompRequestCmd}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var comps []string
	for _, l := range lines[:len(lines)-1] {
		comps = append(comps, strings.SplitN(l, "\t", 2)[0])
	}
	return comps, lines[len(lines)-1]
}

// Completion of commands, -o values, kinds, and names the gateway lists.
func TestCompletion(t *testing.T) {
	srv := httptest.NewServer(&fakeGateway{})
	defer srv.Close()
	for name, tc := range map[string]struct {
		args      []string
		want      []string
		directive string
	}{
		"commands":              {[]string{""}, []string{"claims", "completion", "drivers", "explain", "help", "match", "operations", "orphans", "reclaims", "sync", "timeline", "volumes"}, ":4"},
		"a prefix":              {[]string{"o"}, []string{"operations", "orphans"}, ":4"},
		"subcommands":           {[]string{"reclaims", ""}, []string{"retry", "start"}, ":4"},
		"-o of a list":          {[]string{"claims", "-o", ""}, []string{"wide", "json", "yaml", "kyaml", "name", "jsonpath=", "jsonpath-as-json=", "jsonpath-file=", "go-template=", "go-template-file="}, ":4"},
		"-o json":               {[]string{"claims", "-o", "js"}, []string{"json", "jsonpath=", "jsonpath-as-json=", "jsonpath-file="}, ":4"},
		"-o jsonpath goes on":   {[]string{"volumes", "-o", "jsonpath"}, []string{"jsonpath=", "jsonpath-as-json=", "jsonpath-file="}, ":6"},
		"-o of a write":         {[]string{"sync", "-o", ""}, []string{"json", "yaml", "kyaml", "name", "jsonpath=", "jsonpath-as-json=", "jsonpath-file=", "go-template=", "go-template-file="}, ":4"},
		"--phase":               {[]string{"volumes", "--phase", "R"}, []string{"Released"}, ":4"},
		"--state":               {[]string{"reclaims", "--state", ""}, states, ":4"},
		"explain's kind":        {[]string{"explain", ""}, []string{"pvc"}, ":4"},
		"explain's claim":       {[]string{"explain", "pvc", ""}, []string{"c0", "c1", "c2", "c3", "c4"}, ":4"},
		"explain pvc/":          {[]string{"explain", "pvc/c"}, []string{"pvc/c0", "pvc/c1", "pvc/c2", "pvc/c3", "pvc/c4"}, ":4"},
		"sync's kinds":          {[]string{"sync", ""}, []string{"pvc", "pv"}, ":4"},
		"sync's volumes":        {[]string{"sync", "pv", "pv-"}, []string{"pv-a", "pv-b"}, ":4"},
		"--context":             {[]string{"claims", "--context", ""}, []string{"ctx"}, ":4"},
		"--user":                {[]string{"claims", "--user", "v"}, []string{"viewer"}, ":4"},
		"delete-backing's pv":   {[]string{"volumes", "delete-backing", ""}, []string{"pv-a", "pv-b"}, ":4"},
		"no completion, no err": {[]string{"claims", "--driver", ""}, nil, ":4"}, // the fake refuses drivers
	} {
		t.Run(name, func(t *testing.T) {
			got, directive := complete(t, srv.URL, tc.args...)
			if !slices.Equal(got, tc.want) || directive != tc.directive {
				t.Errorf("got %q %s, want %q %s", got, directive, tc.want, tc.directive)
			}
		})
	}
}

// `completion SHELL` writes cobra's script for each shell.
func TestCompletionScripts(t *testing.T) {
	for shell, want := range map[string]string{
		"bash":       "complete -o default -F __start_kubectl-volplane kubectl-volplane",
		"zsh":        "#compdef kubectl-volplane",
		"fish":       "complete -c kubectl-volplane ",
		"powershell": "Register-ArgumentCompleter -CommandName 'kubectl-volplane'",
	} {
		t.Run(shell, func(t *testing.T) {
			out, _, err := run(t, "http://127.0.0.1:1", "completion", shell)
			if err != nil || !strings.Contains(out, want) || !strings.Contains(out, "__complete") {
				t.Errorf("completion %s: %v, lacks %q:\n%.300s", shell, err, want, out)
			}
		})
	}
}

func TestArgs(t *testing.T) {
	for _, tc := range []struct {
		argv0 string
		args  []string
		want  []string
	}{
		{"/usr/local/bin/kubectl-volplane", []string{"claims"}, []string{"claims"}},
		{"/home/u/bin/kubectl_complete-volplane", []string{"claims", "-n", ""}, []string{"__complete", "claims", "-n", ""}},
		{`C:\bin\kubectl_complete-volplane.exe`, []string{""}, []string{"__complete", ""}},
	} {
		if got := Args(strings.ReplaceAll(tc.argv0, `\`, "/"), tc.args); !slices.Equal(got, tc.want) {
			t.Errorf("Args(%q, %q) = %q, want %q", tc.argv0, tc.args, got, tc.want)
		}
	}
}
