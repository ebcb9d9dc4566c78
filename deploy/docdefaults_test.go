package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Every default a doc states for a flag, "`--workers` (100)" or
// "`--a`/`--b` (1s/5m)", is the binary's default as its --help prints
// it: a service's README against that service, the rest of the docs
// against any binary with the flag. Issue 39 found three such drifts by
// reading; this keeps them from coming back.
func TestFlagDefaultsInDocs(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every binary")
	}
	defaults := helpOfEveryBinary(t)
	own := map[string]string{
		"../services/watcher/README.md":     "watcher",
		"../services/binder/README.md":      "binder",
		"../services/provisioner/README.md": "provisioner",
		"../services/reclaimer/README.md":   "reclaimer",
		"../gateway/README.md":              "gateway",
	}
	docs, _ := filepath.Glob("../docs/*.md")
	docs = append(docs, "../README.md", "../internal/devcsi/README.md")
	for f := range own {
		docs = append(docs, f)
	}
	checked := 0
	for _, f := range docs {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range statedDefaults(string(b)) {
			var candidates []string
			for name, fl := range defaults {
				if d, ok := fl[st.flag]; ok && (own[f] == "" || own[f] == name) {
					candidates = append(candidates, name+" "+quoteEmpty(d))
					if sameDefault(st.value, d) {
						candidates = nil
						break
					}
				}
			}
			checked++
			if len(candidates) > 0 {
				t.Errorf("%s: `--%s` (%s), but the default is: %s", f, st.flag, st.value, strings.Join(candidates, ", "))
			}
		}
	}
	t.Logf("%d stated defaults checked against %d binaries", checked, len(defaults))
}

// stated is one default a doc gives a flag.
type stated struct{ flag, value string }

var (
	// "`--name` (value ...)" or "`--name` (default value ...)": the value
	// is the first word in the parentheses.
	statedOne = regexp.MustCompile("`--([a-z0-9-]+)`\\s*\\((?:default )?`?([0-9][0-9a-zA-Z.]*(?: (?:minutes?|seconds?|hours?|min|ms|s|KiB|MiB|GiB))?)`?[,;:)\\s]")
	// "`--a`/`--b` (1s/5m)"
	statedPair = regexp.MustCompile("`--([a-z0-9-]+)`/`--([a-z0-9-]+)`\\s*\\(`?([0-9][0-9a-zA-Z.]*)/([0-9][0-9a-zA-Z.]*)`?\\)")
	// "(after `--name`, 2s)"
	statedAfter = regexp.MustCompile("`--([a-z0-9-]+)`, ([0-9][0-9a-zA-Z.]*)\\)")
)

// statedDefaults finds the numbers and durations docs give as flags'
// defaults.
func statedDefaults(doc string) []stated {
	var out []stated
	for _, s := range statedAt(doc) {
		out = append(out, s.stated)
	}
	return out
}

// statedSpan is a stated default and where its value is in the doc.
type statedSpan struct {
	stated
	start, end int
}

// statedAt finds the stated defaults with their values' offsets.
func statedAt(doc string) []statedSpan {
	var out []statedSpan
	for _, re := range []*regexp.Regexp{statedOne, statedAfter} {
		for _, m := range re.FindAllStringSubmatchIndex(doc, -1) {
			out = append(out, statedSpan{stated{doc[m[2]:m[3]], doc[m[4]:m[5]]}, m[4], m[5]})
		}
	}
	for _, m := range statedPair.FindAllStringSubmatchIndex(doc, -1) {
		out = append(out,
			statedSpan{stated{doc[m[2]:m[3]], doc[m[6]:m[7]]}, m[6], m[7]},
			statedSpan{stated{doc[m[4]:m[5]], doc[m[8]:m[9]]}, m[8], m[9]})
	}
	return out
}

// helpOfEveryBinary builds every binary and reads each one's flag
// defaults from its --help: binary -> flag -> default.
func helpOfEveryBinary(t *testing.T) map[string]map[string]string {
	t.Helper()
	bin := build(t)
	defaults := map[string]map[string]string{}
	for path := range binaries {
		name := filepath.Base(path)
		out, _ := exec.Command(filepath.Join(bin, name), "--help").CombinedOutput()
		defaults[name] = helpDefaults(string(out))
	}
	return defaults
}

// helpDefaults reads each flag's "(default X)" from pflag's --help; a
// flag without one defaults to its zero value, which counts as "".
func helpDefaults(help string) map[string]string {
	flagStart := regexp.MustCompile(`^(?:  -[a-z0-9], |      )--([a-z0-9][a-z0-9-]*)`)
	def := regexp.MustCompile(`\(default (.*)\)\s*$`)
	out := map[string]string{}
	var cur string
	var text strings.Builder
	flush := func() {
		if cur == "" {
			return
		}
		out[cur] = ""
		if m := def.FindStringSubmatch(text.String()); m != nil {
			out[cur] = strings.Trim(m[1], `"`)
		}
	}
	for _, line := range strings.Split(help, "\n") {
		if m := flagStart.FindStringSubmatch(line); m != nil {
			flush()
			cur = m[1]
			text.Reset()
		}
		if strings.TrimSpace(line) == "" {
			flush()
			cur = ""
		}
		text.WriteString(" " + strings.TrimSpace(line))
	}
	flush()
	return out
}

// sameDefault says whether a doc's value is the binary's default: equal
// as text, as numbers, or as durations (5m and 5m0s).
func sameDefault(doc, bin string) bool {
	if doc == bin {
		return true
	}
	doc = withUnit(doc)
	if bin == "" {
		bin = "0" // pflag prints no default for a zero number or duration
	}
	if a, err := strconv.ParseFloat(doc, 64); err == nil {
		b, err := strconv.ParseFloat(bin, 64)
		return err == nil && a == b
	}
	a, err1 := time.ParseDuration(doc)
	b, err2 := time.ParseDuration(bin)
	return err1 == nil && err2 == nil && a == b
}

// withUnit writes "10 minutes" as a duration and "1 MiB" as bytes.
func withUnit(v string) string {
	n, unit, ok := strings.Cut(v, " ")
	if !ok {
		return v
	}
	f, err := strconv.ParseFloat(n, 64)
	if err != nil {
		return v
	}
	switch strings.TrimSuffix(unit, "s") {
	case "second", "":
		return n + "s"
	case "m":
		return n + "ms"
	case "minute", "min":
		return n + "m"
	case "hour":
		return n + "h"
	case "KiB":
		return strconv.FormatFloat(f*(1<<10), 'f', -1, 64)
	case "MiB":
		return strconv.FormatFloat(f*(1<<20), 'f', -1, 64)
	case "GiB":
		return strconv.FormatFloat(f*(1<<30), 'f', -1, 64)
	}
	return v
}

func quoteEmpty(s string) string {
	if s == "" {
		return `""`
	}
	return s
}
