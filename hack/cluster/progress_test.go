// Package cluster holds the tests of the scripts that build and run the
// local cluster (hack/cluster/*.sh, bash); it has no Go code of its own.
package cluster

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestWithProgress runs lib.sh's with_progress, which every long build of
// hack/ (build-kube.sh, build-external-provisioner.sh, build.sh) runs
// under, on a short dummy command that prints what `go build -v` prints,
// with progress every second instead of every 30: the command's output
// goes to the log file, and stderr says what is being built and for how
// long while it runs. The dummy command runs until the test has seen the
// progress line it expects (a file it polls for), so nothing depends on
// timing but the one-second interval.
func TestWithProgress(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	for _, tc := range []struct {
		name string
		// script is the dummy command; it waits for $STOP to exist
		// where it says `wait_stop`.
		script string
		// progress matches the line after which the test creates $STOP.
		progress string
		wantRC   int
		// want are more lines (regular expressions) stderr must have.
		want []string
		// wantLog is what the log file must hold.
		wantLog string
	}{
		{
			name:     "compiling",
			script:   "echo 'go: downloading example.com/a v1.0.0'; echo example.com/a; echo example.com/b; wait_stop; echo example.com/c",
			progress: `^\d\d:\d\d:\d\d     building dummy v1: \d+s elapsed, 2 packages compiled, last example.com/b$`,
			want:     []string{`^\d\d:\d\d:\d\d     building dummy v1: done in \d+s, \d+ CPU-seconds$`},
			wantLog:  "go: downloading example.com/a v1.0.0\nexample.com/a\nexample.com/b\nexample.com/c\n",
		},
		{
			name:     "downloading",
			script:   "echo 'go: downloading example.com/a v1.0.0'; echo 'go: downloading example.com/b v1.2.0'; wait_stop",
			progress: `^\d\d:\d\d:\d\d     building dummy v1: \d+s elapsed, 2 modules downloaded, no package compiled yet$`,
			want:     []string{`building dummy v1: done in`},
		},
		{
			name:     "failing",
			script:   "echo example.com/a; wait_stop; echo 'a.go:1: syntax error' >&2; exit 3",
			progress: `building dummy v1: \d+s elapsed, 1 packages compiled, last example.com/a$`,
			wantRC:   3,
			want: []string{
				`^a\.go:1: syntax error$`,
				`^\d\d:\d\d:\d\d building dummy v1 failed \(exit 3\) after \d+s; full output in .*/build\.log$`,
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			dir := t.TempDir()
			stop, logFile := filepath.Join(dir, "stop"), filepath.Join(dir, "build.log")
			lib, err := filepath.Abs("lib.sh")
			if err != nil {
				t.Fatal(err)
			}
			dummy := "wait_stop() { while [ ! -e \"$STOP\" ]; do sleep 0.05; done; }; " + tc.script
			cmd := exec.CommandContext(ctx, "bash", "-c",
				`set -euo pipefail; source "$1"; with_progress "building dummy v1" "$2" bash -c "$3"`,
				"test", lib, logFile, dummy)
			cmd.Env = append(os.Environ(), "VOLPLANE_PROGRESS_EVERY=1", "STOP="+stop)
			cmd.WaitDelay = 5 * time.Second
			stderr, err := cmd.StderrPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			progress := regexp.MustCompile(tc.progress)
			var lines []string
			sc := bufio.NewScanner(stderr)
			for sc.Scan() {
				lines = append(lines, sc.Text())
				if progress.MatchString(sc.Text()) {
					if err := os.WriteFile(stop, nil, 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			err = cmd.Wait()
			rc := 0
			if ee, ok := err.(*exec.ExitError); ok {
				rc = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			out := strings.Join(lines, "\n")
			if rc != tc.wantRC {
				t.Fatalf("exit %d, want %d; stderr:\n%s", rc, tc.wantRC, out)
			}
			for _, re := range append([]string{tc.progress}, tc.want...) {
				if !regexp.MustCompile("(?m)" + re).MatchString(out) {
					t.Errorf("stderr has no line matching %s:\n%s", re, out)
				}
			}
			if tc.wantLog != "" {
				b, err := os.ReadFile(logFile)
				if err != nil {
					t.Fatal(err)
				}
				if string(b) != tc.wantLog {
					t.Errorf("log file %q, want %q", b, tc.wantLog)
				}
			}
		})
	}
}
