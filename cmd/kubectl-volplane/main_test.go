package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"k8s.io/kubectl/pkg/cmd/plugin"

	"github.com/volplane/volplane/internal/kubectlplugin"
)

// TestMain is this package's main when the test binary is started under
// the plugin's names (the tests link them to it): kubectl runs it as
// kubectl_complete-volplane for completion.
func TestMain(m *testing.M) {
	switch filepath.Base(os.Args[0]) {
	case "kubectl-volplane", kubectlplugin.CompletionExecutable:
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// pathWithPlugin is a directory holding kubectl-volplane and
// kubectl_complete-volplane, as make build leaves them in ./bin (links to
// one binary: here, this test binary, whose TestMain runs main).
func pathWithPlugin(t *testing.T) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, name := range []string{"kubectl-volplane", kubectlplugin.CompletionExecutable} {
		if err := os.Symlink(self, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// kubectlComplete runs kubectl's own plugin completion
// (k8s.io/kubectl/pkg/cmd/plugin, wired as kubectl's root command wires
// it: on __complete, SetupPluginCompletion) for `kubectl args...`, with
// only dir on the PATH, and returns the completions and directive.
func kubectlComplete(t *testing.T, dir string, args ...string) ([]string, string) {
	t.Helper()
	t.Setenv("PATH", dir)
	kubectl := &cobra.Command{
		Use: "kubectl",
		PersistentPreRun: func(cmd *cobra.Command, args []string) {
			if cmd.Name() == cobra.ShellCompRequestCmd {
				plugin.SetupPluginCompletion(cmd, args)
			}
		},
		Run: func(*cobra.Command, []string) {},
	}
	kubectl.AddCommand(&cobra.Command{Use: "get", Run: func(*cobra.Command, []string) {}})
	var out bytes.Buffer
	kubectl.SetOut(&out)
	kubectl.SetErr(&bytes.Buffer{})
	kubectl.SetArgs(append([]string{cobra.ShellCompRequestCmd}, args...))
	if err := kubectl.Execute(); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var comps []string
	for _, l := range lines[:len(lines)-1] {
		comps = append(comps, strings.SplitN(l, "\t", 2)[0])
	}
	return comps, lines[len(lines)-1]
}

// kubectl completes `kubectl volplane ...` by running
// kubectl_complete-volplane from the PATH: the plugin's commands, its
// flags' values, and the plugin's name itself.
func TestKubectlPluginCompletion(t *testing.T) {
	dir := pathWithPlugin(t)
	for name, tc := range map[string]struct {
		args      []string
		want      []string
		directive string
	}{
		"the plugin":      {[]string{"vol"}, []string{"volplane"}, ":4"},
		"its commands":    {[]string{"volplane", ""}, []string{"claims", "completion", "drivers", "explain", "help", "match", "operations", "orphans", "reclaims", "sync", "timeline", "volumes"}, ":4"},
		"a subcommand":    {[]string{"volplane", "orphans", "d"}, []string{"delete"}, ":4"},
		"-o":              {[]string{"volplane", "claims", "-o", "ya"}, []string{"yaml"}, ":4"},
		"-o jsonpath=":    {[]string{"volplane", "explain", "pvc", "x", "-o", "jsonpath"}, []string{"jsonpath=", "jsonpath-as-json=", "jsonpath-file="}, ":6"},
		"a static value":  {[]string{"volplane", "reclaims", "--state", "f"}, []string{"failed"}, ":4"},
		"explain's kinds": {[]string{"volplane", "explain", ""}, []string{"pvc"}, ":4"},
		"completion":      {[]string{"volplane", "completion", ""}, []string{"bash", "fish", "powershell", "zsh"}, ":4"},
	} {
		t.Run(name, func(t *testing.T) {
			got, directive := kubectlComplete(t, dir, tc.args...)
			if !slices.Equal(got, tc.want) || directive != tc.directive {
				t.Errorf("kubectl __complete %q: %q %s, want %q %s", tc.args, got, directive, tc.want, tc.directive)
			}
		})
	}
}

// The binary run under its own name is the plugin; a kubectl on the PATH,
// if there is one, runs and completes it as a plugin.
func TestBinary(t *testing.T) {
	dir := pathWithPlugin(t)
	out, err := exec.Command(filepath.Join(dir, "kubectl-volplane"), "completion", "bash").Output()
	if err != nil || !strings.Contains(string(out), "__start_kubectl-volplane") {
		t.Fatalf("kubectl-volplane completion bash: %v\n%.200s", err, out)
	}
	cmd := exec.Command(filepath.Join(dir, "kubectl-volplane"), "pods")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err == nil || !strings.HasPrefix(stderr.String(), `error: unknown command "pods" for "kubectl volplane"`) {
		t.Errorf("kubectl-volplane pods: %v %q, want exit 1 and kubectl's error line", err, stderr.String())
	}
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("no kubectl on the PATH: the real kubectl's plugin handling is not checked")
	}
	run := exec.Command(kubectl, "volplane", "sync", "--help")
	run.Env = append(os.Environ(), "PATH="+dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	out, err = run.Output()
	if err != nil || !strings.Contains(string(out), "kubectl volplane sync (pvc|pv) NAME") {
		t.Errorf("kubectl volplane sync --help: %v\n%s", err, out)
	}
	comp := exec.Command(kubectl, "__complete", "volplane", "claims", "-o", "ya")
	comp.Env = run.Env
	out, err = comp.Output()
	if err != nil || !strings.HasPrefix(string(out), "yaml\n") {
		t.Errorf("kubectl __complete volplane claims -o ya: %v %q", err, out)
	}
}
