package deploy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The scanner finds the figures of prose only, and gives each the holder
// its marker or flag says; what nothing holds stays unheld.
func TestDocFiguresScanner(t *testing.T) {
	doc := strings.Join([]string{
		"# T",
		"",
		"It retries 5 times. `--workers` (128 workers), `--timeout`, 30s)",
		"and backs off from 1 s <!-- const: services/binder.releaseLinger --> to",
		"`5s` in code, [a link](x-3s.md), then 2 s <!-- figures: measured --> and 4 s.",
		"",
		"```",
		"9 s in a fence",
		"```",
		"",
		"    7 s indented code",
		"",
		"<!-- figures: measured -->",
		"| step | time |",
		"| --- | --- |",
		"| a | 6 s |",
		"",
		"| Flag | Default | Meaning |",
		"|---|---|---|",
		"| `--x` | 8s | at least 3s |",
		"",
		"## A",
		"",
		"<!-- figures below: measured -->",
		"10 s here",
		"",
		"### A.1",
		"",
		"11 s here too",
		"",
		"## B",
		"",
		"12 s not, `<!-- figures below: shown in code -->`",
		"",
		"13 s not either",
	}, "\n")
	want := map[string]string{
		"5 times": "", "128 workers": "stated", "30s": "stated", "1 s": "const",
		"2 s": "figures", "4 s": "", "6 s": "figures", "8s": "stated", "3s": "",
		"10 s": "figures", "11 s": "figures", "12 s": "", "13 s": "",
	}
	got := map[string]string{}
	for _, f := range docFigures(doc) {
		if _, dup := got[f.text]; dup {
			t.Errorf("%q found twice", f.text)
		}
		got[f.text] = f.held.kind
	}
	for text, kind := range want {
		if k, ok := got[text]; !ok || k != kind {
			t.Errorf("%q: held by %q (found %v), want %q", text, k, ok, kind)
		}
	}
	for text := range got {
		if _, ok := want[text]; !ok {
			t.Errorf("found %q, which is not prose", text)
		}
	}
}

// A figure checks against its constant in the figure's unit, and says
// what the code holds when they differ: issue 39's backoff drift.
func TestFigureCheckCatchesDrift(t *testing.T) {
	dir := t.TempDir()
	src := `package p

import "time"

const (
	start = 1 * time.Second
	max   = 5 * start * 60
	size  = 1 << 20
	n     = (size / 1024) + 3
	name  = "x"
)

var workers = 100
`
	if err := os.MkdirAll(filepath.Join(dir, "p"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "p", "p.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	r := newConstReader(dir)
	for _, c := range []struct {
		doc, ref string
		ok       bool
	}{
		{"backs off from 1 s <!-- const: p.start -->", "", true},
		{"backs off from 100 ms <!-- const: p.start -->", "p.start is 1s", false},
		{"up to 5 minutes <!-- const: p.max -->", "", true},
		{"up to 5m <!-- const: p.max -->", "", true},
		{"1 MiB <!-- const: p.size -->", "", true},
		{"1027 entries <!-- const: p.n -->", "", true},
		{"100 workers <!-- const: p.workers -->", "", true},
		{"4 workers <!-- const: p.workers -->", "p.workers is 100", false},
		{"4 workers <!-- const: p.missing -->", "declares no constant", false},
		{"4 workers <!-- const: p.name -->", "is a string", false},
		{"4 workers <!-- const: q.workers -->", "no Go package", false},
	} {
		figs := docFigures(c.doc)
		if len(figs) != 1 {
			t.Fatalf("%q: %d figures", c.doc, len(figs))
		}
		err := figs[0].check(r, nil)
		if (err == nil) != c.ok || (err != nil && !strings.Contains(err.Error(), c.ref)) {
			t.Errorf("%q: %v, want ok=%v %q", c.doc, err, c.ok, c.ref)
		}
	}
	unheld := docFigures("retries 5 times")[0]
	if err := unheld.check(r, nil); err == nil || !strings.Contains(err.Error(), "held by nothing") {
		t.Errorf("an unheld figure: %v", err)
	}
}

// A flag marker compares with --help's default.
func TestFigureFlagMarker(t *testing.T) {
	help := map[string]map[string]string{"binder": {"retry-interval-start": "1s", "workers": "128"}}
	for _, c := range []struct {
		doc string
		ok  bool
	}{
		{"from 1 s <!-- flag: binder --retry-interval-start -->", true},
		{"from 100 ms <!-- flag: binder --retry-interval-start -->", false},
		{"128 workers <!-- flag: binder --workers -->", true},
		{"4 workers <!-- flag: binder --workers -->", false},
		{"4 workers <!-- flag: binder --nope -->", false},
		{"4 workers <!-- flag: nobody --workers -->", false},
		{"4 workers <!-- flag: binder workers -->", false},
	} {
		err := docFigures(c.doc)[0].check(nil, help)
		if (err == nil) != c.ok {
			t.Errorf("%q: %v, want ok=%v", c.doc, err, c.ok)
		}
	}
}

// A flags-table row is checked flag by flag, value by value, for the
// binaries it names.
func TestFlagTableRowCheck(t *testing.T) {
	help := map[string]map[string]string{
		"watcher": {"listen": "127.0.0.1:7701", "qps": ""},
		"binder":  {"listen": "127.0.0.1:7702", "workers": "128", "a": "1s", "b": "5m0s", "on": "true", "id": ""},
	}
	doc := strings.Join([]string{
		"| Flag | services | Default | Meaning |",
		"|---|---|---|---|",
		"| `--listen` | all | watcher `127.0.0.1:7701`, binder `…:7702` | m |",
		"| `--workers` | binder | 128 | m |",
		"| `--a`, `--b` | binder | 1s, 5m | m |",
		"| `--on` | binder | on (mostly) | m |",
		"| `--id` | binder | hostname plus a random suffix | m |",
		"| `--workers` | binder | 100 | drift |",
		"| `--a`, `--b` | binder | 1s, 10m | drift |",
		"| `--listen` | all | watcher `127.0.0.1:7701`, binder `…:7709` | drift |",
		"| `--qps` | watcher | 100 | no marker |",
		"| `--gone` | binder | 1 | no such flag |",
	}, "\n")
	rows := flagTableRows(doc)
	if len(rows) != 10 {
		t.Fatalf("%d rows, want 10", len(rows))
	}
	for i, row := range rows {
		errs := checkRow(row, "", help, nil)
		if wantErr := i >= 5; (len(errs) > 0) != wantErr {
			t.Errorf("row %d (%s): %v", i, row.def, errs)
		}
	}
	if missing := missingRows(rows[:1], help["binder"]); len(missing) != 5 {
		t.Errorf("missing rows: %v", missing)
	}
}
