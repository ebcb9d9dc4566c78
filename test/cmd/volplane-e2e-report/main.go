// Command volplane-e2e-report reads the JUnit reports Kubernetes' e2e.test
// writes (-report-dir: junit_01.xml) for hack/e2e-storage.sh: one line
// per spec that ran or was skipped while running (the specs the focus
// left out are counted, not listed), and two runs side by side, spec by
// spec (the A/B table of make test-e2e-storage); and the figures the
// performance suites log, run beside run (make bench-e2e-perf).
//
//	volplane-e2e-report summary junit_01.xml
//	volplane-e2e-report table [-markdown] A=a/junit_01.xml B=b/junit_01.xml
//	volplane-e2e-report perf [-markdown] A=a/e2e.log B=b/e2e.log
//
// summary exits 1 when a spec failed; table exits 1 when a spec passes
// in the first run and not in a later one; perf exits 1 when a log has
// none of the figures.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/volplane/volplane/pkg/cmdutil"
)

const usage = `usage:
  volplane-e2e-report summary JUNIT.xml
  volplane-e2e-report table [-markdown] LABEL=JUNIT.xml LABEL=JUNIT.xml...
  volplane-e2e-report perf [-markdown] LABEL=e2e.log...`

const description = `volplane-e2e-report reads the JUnit reports of Kubernetes' e2e.test
(junit_01.xml in its -report-dir) for hack/e2e-storage.sh: summary prints one line per spec and
exits 1 when one failed; table puts two runs or more side by side, spec by spec, and exits 1 when
a spec passes in the first run and not in a later one; perf puts the figures of Kubernetes' performance
suites (volume-lifecycle-performance, pvc-deletion-performance) from e2e.test logs side by side.`

func main() {
	if len(os.Args) > 1 && strings.HasPrefix(os.Args[1], "-") {
		// --help, --version (every volplane command answers them), or a
		// flag where a subcommand goes.
		cmd := cmdutil.NewCommand("volplane-e2e-report", description)
		cmd.Usage = "volplane-e2e-report summary JUNIT.xml | table [-markdown] LABEL=JUNIT.xml... | perf [-markdown] LABEL=e2e.log..."
		if code, done := cmd.Parse(os.Args[1:]); done {
			os.Exit(code)
		}
		fmt.Fprintln(os.Stderr, "volplane-e2e-report: a subcommand comes first: summary, table or perf; --help says more")
		os.Exit(2)
	}
	code, err := run(os.Args[1:], os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "volplane-e2e-report:", err)
	}
	os.Exit(code)
}

// run carries out one subcommand and returns the exit code.
func run(args []string, out io.Writer) (int, error) {
	if len(args) == 0 {
		return 2, fmt.Errorf("no subcommand\n%s", usage)
	}
	switch args[0] {
	case "summary":
		if len(args) != 2 {
			return 2, fmt.Errorf("summary takes one report\n%s", usage)
		}
		r, err := readReport(args[1])
		if err != nil {
			return 2, err
		}
		return r.summary(out), nil
	case "table", "perf":
		fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		markdown := fs.Bool("markdown", false, "a Markdown table (for docs/testing.md)")
		if err := fs.Parse(args[1:]); err != nil {
			return 2, err
		}
		if args[0] == "perf" {
			return perfTable(fs.Args(), *markdown, out)
		}
		runs, err := readRuns(fs.Args())
		if err != nil {
			return 2, err
		}
		return sideBySide(runs, *markdown, out), nil
	}
	return 2, fmt.Errorf("unknown subcommand %q\n%s", args[0], usage)
}

// readRuns reads LABEL=FILE arguments, at least two.
func readRuns(args []string) ([]labelled, error) {
	if len(args) < 2 {
		return nil, fmt.Errorf("table takes two or more LABEL=JUNIT.xml\n%s", usage)
	}
	var runs []labelled
	for _, a := range args {
		label, file, ok := strings.Cut(a, "=")
		if !ok || label == "" {
			return nil, fmt.Errorf("%q: want LABEL=JUNIT.xml", a)
		}
		r, err := readReport(file)
		if err != nil {
			return nil, err
		}
		runs = append(runs, labelled{label: label, report: r})
	}
	return runs, nil
}
