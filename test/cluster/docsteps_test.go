package cluster

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// installDoc is the platform team's install (docs/install.md), whose
// marked shell blocks the tests run as they are.
const installDoc = "docs/install.md"

// stepMarker is the line before a block the tests run:
// <!-- step: NAME -->.
var stepMarker = regexp.MustCompile(`^<!-- step: ([a-z0-9-]+) -->$`)

// docStep is one marked shell block of a doc.
type docStep struct {
	Name, Script string
	Line         int // of the marker
}

// parseSteps reads the marked ```sh blocks of a Markdown document, in
// order. A marker must be followed at once by a ```sh fence, and a name
// may be used once.
func parseSteps(doc []byte) ([]docStep, error) {
	var steps []docStep
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(doc))
	line := 0
	for sc.Scan() {
		line++
		m := stepMarker.FindStringSubmatch(strings.TrimSpace(sc.Text()))
		if m == nil {
			continue
		}
		name, at := m[1], line
		if seen[name] {
			return nil, fmt.Errorf("line %d: step %q again", at, name)
		}
		seen[name] = true
		if !sc.Scan() || strings.TrimSpace(sc.Text()) != "```sh" {
			return nil, fmt.Errorf("line %d: step %q is not followed by a ```sh block", at, name)
		}
		line++
		var body strings.Builder
		closed := false
		for sc.Scan() {
			line++
			if strings.TrimSpace(sc.Text()) == "```" {
				closed = true
				break
			}
			body.WriteString(sc.Text() + "\n")
		}
		if !closed {
			return nil, fmt.Errorf("line %d: step %q's block is not closed", at, name)
		}
		steps = append(steps, docStep{Name: name, Script: body.String(), Line: at})
	}
	return steps, sc.Err()
}

// repoRoot is the top of the tree (the tests run in test/cluster).
func repoRoot(t testing.TB) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// Install runs docs/install.md's steps by name, in the order given, each
// in a bash of its own (-euo pipefail) at the top of the tree, with the
// settings of the local cluster in the environment.
type Install struct {
	steps map[string]docStep
	env   []string
	root  string
	// dir is where the steps run (the files they write stay there); the
	// top of the tree when empty.
	dir string
}

// newInstall reads docs/install.md and checks that it has every step the
// tests run.
func newInstall(t testing.TB, env map[string]string) *Install {
	t.Helper()
	root := repoRoot(t)
	doc, err := os.ReadFile(filepath.Join(root, installDoc))
	if err != nil {
		t.Fatal(err)
	}
	steps, err := parseSteps(doc)
	if err != nil {
		t.Fatalf("%s: %v", installDoc, err)
	}
	in := &Install{steps: map[string]docStep{}, root: root}
	for _, s := range steps {
		in.steps[s.Name] = s
	}
	for _, want := range installSteps {
		if _, ok := in.steps[want]; !ok {
			t.Fatalf("%s lost the step %q that the cluster test runs (<!-- step: %s --> before a ```sh block)", installDoc, want, want)
		}
	}
	in.env = os.Environ()
	for k, v := range env {
		in.env = append(in.env, k+"="+v)
	}
	return in
}

// installSteps are the steps of docs/install.md the tests run: the
// install and the flip (TestCluster/install) and the rollback
// (TestCluster/rollback).
var installSteps = []string{
	"settings", "prerequisites", "find-sidecars", "apply", "grant-sidecars", "rollout",
	"swap-sidecars", "kcm-binder-off", "kcm-wait", "binder-on", "gateway", "check-claim",
	"rollback-volplane", "kcm-binder-on", "kcm-wait-on", "sidecars-back",
}

// Setenv sets a variable of the steps' environment (the last of a name
// counts).
func (in *Install) Setenv(name, value string) {
	in.env = append(in.env, name+"="+value)
}

// Run runs the named step after the settings step (every step reads the
// settings), logs what it printed and how long it took, and fails the
// test when it fails.
func (in *Install) Run(t testing.TB, name string) string {
	t.Helper()
	s := in.steps[name]
	script := "set -euo pipefail\n" + in.steps["settings"].Script + "set -x\n" + s.Script
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	cmd.Dir, cmd.Env = in.root, in.env
	if in.dir != "" {
		cmd.Dir = in.dir
	}
	cmd.WaitDelay = 10 * time.Second
	start := time.Now()
	out, err := cmd.CombinedOutput()
	t.Logf("%s, step %s (line %d), %v:\n%s", installDoc, name, s.Line, time.Since(start).Round(100*time.Millisecond), out)
	if err != nil {
		t.Fatalf("%s, step %s: %v", installDoc, name, err)
	}
	return string(out)
}

// The doc's steps parse, and the parser refuses what would silently skip
// a step.
func TestInstallDocSteps(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(repoRoot(t), installDoc))
	if err != nil {
		t.Fatal(err)
	}
	steps, err := parseSteps(doc)
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, s := range steps {
		have[s.Name] = true
		if strings.TrimSpace(s.Script) == "" {
			t.Errorf("step %s is empty", s.Name)
		}
	}
	for _, want := range installSteps {
		if !have[want] {
			t.Errorf("no step %q", want)
		}
	}
	for _, tc := range []struct{ name, doc, want string }{
		{"marker without block", "<!-- step: a -->\ntext\n", "not followed"},
		{"block not sh", "<!-- step: a -->\n```yaml\nx\n```\n", "not followed"},
		{"unclosed", "<!-- step: a -->\n```sh\nx\n", "not closed"},
		{"twice", "<!-- step: a -->\n```sh\nx\n```\n<!-- step: a -->\n```sh\ny\n```\n", "again"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := parseSteps([]byte(tc.doc)); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
}
