package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Every duration, size and count the docs state in prose ("backs off
// from 1 s", "10 minutes", "128 workers", "1 MiB") is held by the code,
// in one of four ways:
//
//   - it is a flag's stated default, "`--workers` (128)" or
//     "`--timeout`, 30s", which TestFlagDefaultsInDocs checks, or the
//     default cell of a flags table, which TestFlagTablesMatchHelp checks;
//   - a marker right after it names the Go constant or variable that
//     holds it, <!-- const: services/binder.releaseBatchWindow -->, whose
//     value this test reads from the source;
//   - a marker right after it names the flag whose default it is,
//     <!-- flag: binder --retry-interval-start -->, read from --help;
//   - it is not the code's to hold: a measurement, an example, a fact of
//     Kubernetes or of another project, said with its reason in a marker,
//     <!-- figures: measured: the run of 2026-11-20 --> for the paragraph,
//     table or list item the marker is in, or <!-- figures below: ... -->
//     for the rest of its section (to the next heading of its level or
//     above).
//
// A figure in none of these fails the test, so new prose cannot state a
// behaviour the code does not have. Issue 39 found docs/design.md's
// provisioning backoff at 100 ms, against the code's 1 s.
func TestDocsFiguresHeldByCode(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every binary")
	}
	help := helpOfEveryBinary(t)
	consts := newConstReader("..")
	pending := readPending(t)
	count := map[string]int{}
	for _, f := range figureDocs(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, fig := range docFigures(string(b)) {
			key := strings.TrimPrefix(f, "../") + "|" + fig.text
			if pending[key] > 0 && fig.held.kind == "" {
				pending[key]--
				fig.held.kind = "pending"
			}
			count[fig.held.kind]++
			if err := fig.check(consts, help); err != nil {
				t.Errorf("%s:%d: %q: %v", f, fig.line, fig.text, err)
			}
		}
	}
	for key, n := range pending {
		if n > 0 {
			t.Errorf("%s lists %q %d times more than the docs state it unheld: remove those lines", pendingFile, key, n)
		}
	}
	t.Logf("figures in docs: %d flag defaults, %d constants, %d flag markers, %d allowed (measurements, examples, external facts), %d pending (%s)",
		count["stated"], count["const"], count["flag"], count["figures"], count["pending"], pendingFile)
}

// pendingFile lists the figures not yet tied to the code, "doc|figure|why"
// a line, one per occurrence (a value the code writes inline, not as a
// named constant; a figure not reviewed yet): the debt this test started
// with, to shrink, never to grow.
const pendingFile = "testdata/docfigures-pending.txt"

// readPending reads pendingFile.
func readPending(t *testing.T) map[string]int {
	b, err := os.ReadFile(pendingFile)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, line := range strings.Split(string(b), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			doc, fig, _ := strings.Cut(line, "|")
			fig, _, _ = strings.Cut(fig, "|") // a third field says why
			out[doc+"|"+fig]++
		}
	}
	return out
}

// figureDocs are the docs a reader takes as true: docs/*.md and every
// README.
func figureDocs(t *testing.T) []string {
	var docs []string
	for _, pattern := range []string{"../docs/*.md", "../README.md", "../*/README.md", "../*/*/README.md"} {
		m, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, m...)
	}
	if len(docs) < 20 {
		t.Fatalf("found only %d docs", len(docs))
	}
	return docs
}

// figure is one duration, size or count a doc states, and what holds it.
type figure struct {
	line  int
	text  string // as written: "10 minutes"
	value float64
	unit  string // "ns" (a duration), "B" (a size) or "" (a count)
	held  holder
}

// holder is what holds a figure: kind "" (nothing: the test fails),
// "stated" (a flag's stated default), "const", "flag" or "figures".
type holder struct{ kind, arg string }

// check says why a figure is not what its holder holds.
func (f figure) check(consts *constReader, help map[string]map[string]string) error {
	switch f.held.kind {
	case "stated", "figures", "pending":
		return nil
	case "const":
		v, err := consts.value(f.held.arg)
		if err != nil {
			return err
		}
		if v != f.value {
			return fmt.Errorf("%s is %s", f.held.arg, f.format(v))
		}
		return nil
	case "flag":
		return f.checkFlag(help)
	}
	return fmt.Errorf("held by nothing: mark it <!-- const: pkg/path.Name -->, <!-- flag: binary --name -->, or <!-- figures: why it is not the code's -->")
}

// checkFlag compares the figure with a flag's default as --help prints it.
func (f figure) checkFlag(help map[string]map[string]string) error {
	name, flag, ok := strings.Cut(f.held.arg, " --")
	if !ok {
		return fmt.Errorf("flag marker %q: want <!-- flag: binary --name -->", f.held.arg)
	}
	defs, ok := help[name]
	if !ok {
		return fmt.Errorf("flag marker %q: no binary %s", f.held.arg, name)
	}
	d, ok := defs[flag]
	if !ok {
		return fmt.Errorf("%s has no --%s", name, flag)
	}
	v, err := parseFigureValue(d, f.unit)
	if err != nil || v != f.value {
		return fmt.Errorf("%s --%s defaults to %s", name, flag, quoteEmpty(d))
	}
	return nil
}

// format writes a value in the figure's unit, for a failure message.
func (f figure) format(v float64) string {
	switch f.unit {
	case "ns":
		return time.Duration(v).String()
	case "B":
		return strconv.FormatFloat(v, 'f', -1, 64) + " bytes"
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}

// parseFigureValue reads a --help default ("1m0s", "100", "1048576") in
// a figure's unit.
func parseFigureValue(s, unit string) (float64, error) {
	if unit == "ns" {
		d, err := time.ParseDuration(s)
		return float64(d), err
	}
	return strconv.ParseFloat(s, 64)
}
