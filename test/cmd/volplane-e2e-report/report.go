package main

import (
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// junit is the part of a ginkgo v2 JUnit report read here.
type junit struct {
	Suites []struct {
		Cases []junitCase `xml:"testcase"`
	} `xml:"testsuite"`
}

type junitCase struct {
	Name    string  `xml:"name,attr"`
	Status  string  `xml:"status,attr"`
	Time    float64 `xml:"time,attr"`
	Skipped *struct {
		Message string `xml:"message,attr"`
	} `xml:"skipped"`
	Failure *struct {
		Text string `xml:",chardata"`
	} `xml:"failure"`
	Error *struct {
		Text string `xml:",chardata"`
	} `xml:"error"`
}

// spec is one spec's outcome.
type spec struct {
	name   string
	result string // passed, failed, skipped (or ginkgo's other states)
	reason string // a skip's message, a failure's first line
	took   time.Duration
}

// report is a run's specs by name, and how many the focus left out.
type report struct {
	specs    map[string]spec
	filtered int
}

// labelled is a report and its run's name.
type labelled struct {
	label  string
	report report
}

// filteredMessage is the skip message ginkgo gives a spec the focus or
// the skip left out; a spec skipped while it ran has its reason after it.
const filteredMessage = "skipped"

// readReport reads a JUnit file.
func readReport(file string) (report, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return report{}, err
	}
	var j junit
	if err := xml.Unmarshal(b, &j); err != nil {
		return report{}, fmt.Errorf("%s: %w", file, err)
	}
	r := report{specs: map[string]spec{}}
	for _, s := range j.Suites {
		for _, c := range s.Cases {
			if c.Skipped != nil && c.Skipped.Message == filteredMessage {
				r.filtered++
				continue
			}
			name := specName(c.Name)
			if name == "" {
				continue // a suite node (BeforeSuite, the reports)
			}
			r.specs[name] = spec{name: name, result: c.Status, reason: reason(c), took: time.Duration(c.Time * float64(time.Second))}
		}
	}
	return r, nil
}

// driverPrefix is what the External Storage tests put before every spec.
var driverPrefix = regexp.MustCompile(`^External Storage \[Driver: [^]]*\] `)

// specName is a test case's spec without ginkgo's node type and the
// driver's prefix; "" for suite nodes.
func specName(n string) string {
	if !strings.HasPrefix(n, "[It] ") {
		return ""
	}
	return driverPrefix.ReplaceAllString(strings.TrimPrefix(n, "[It] "), "")
}

// reason is a skip's message or a failure's first line.
func reason(c junitCase) string {
	var s string
	switch {
	case c.Skipped != nil:
		s = strings.TrimPrefix(c.Skipped.Message, filteredMessage+" - ")
	case c.Failure != nil:
		s = c.Failure.Text
	case c.Error != nil:
		s = c.Error.Text
	}
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return s
}

// names are the specs of the reports, sorted.
func names(reports ...report) []string {
	seen := map[string]bool{}
	var out []string
	for _, r := range reports {
		for n := range r.specs {
			if !seen[n] {
				seen[n] = true
				out = append(out, n)
			}
		}
	}
	sort.Strings(out)
	return out
}

// summary prints one line per spec and the counts; 1 when one failed.
func (r report) summary(out io.Writer) int {
	counts := map[string]int{}
	w := tabwriter.NewWriter(out, 0, 8, 2, ' ', 0)
	for _, n := range names(r) {
		s := r.specs[n]
		counts[s.result]++
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", strings.ToUpper(s.result), s.took.Round(time.Second), n, s.reason)
	}
	w.Flush()
	fmt.Fprintf(out, "%d passed, %d failed, %d skipped while running, %d left out by the focus\n",
		counts["passed"], len(r.specs)-counts["passed"]-counts["skipped"], counts["skipped"], r.filtered)
	if counts["passed"]+counts["skipped"] != len(r.specs) {
		return 1
	}
	return 0
}

// sideBySide prints each spec's result in each run; 1 when a spec that
// passed in the first run did not pass in another.
func sideBySide(runs []labelled, markdown bool, out io.Writer) int {
	reports := make([]report, len(runs))
	header := []string{"SPEC"}
	for i, r := range runs {
		reports[i] = r.report
		header = append(header, r.label)
	}
	rows := [][]string{header}
	var differ []string
	for _, n := range names(reports...) {
		row := []string{n}
		for i, r := range reports {
			row = append(row, cell(r.specs[n]))
			if i > 0 && reports[0].specs[n].result == "passed" && r.specs[n].result != "passed" {
				differ = append(differ, fmt.Sprintf("%s: %s %s", n, runs[i].label, cell(r.specs[n])))
			}
		}
		rows = append(rows, row)
	}
	printTable(out, rows, markdown)
	for _, d := range differ {
		fmt.Fprintln(out, "DIFFERENCE", d)
	}
	if len(differ) > 0 {
		return 1
	}
	return 0
}

// cell is a spec's result in a table ("-" when the run lacks it).
func cell(s spec) string {
	if s.result == "" {
		return "-"
	}
	if s.result == "passed" {
		return fmt.Sprintf("passed (%s)", s.took.Round(time.Second))
	}
	return s.result
}

// printTable prints rows aligned, or as a Markdown table.
func printTable(out io.Writer, rows [][]string, markdown bool) {
	if markdown {
		for i, r := range rows {
			fmt.Fprintf(out, "| %s |\n", strings.Join(escape(r), " | "))
			if i == 0 {
				fmt.Fprintf(out, "|%s\n", strings.Repeat("---|", len(r)))
			}
		}
		return
	}
	w := tabwriter.NewWriter(out, 0, 8, 2, ' ', 0)
	for _, r := range rows {
		fmt.Fprintln(w, strings.Join(r, "\t"))
	}
	w.Flush()
}

// escape makes cells safe in a Markdown table.
func escape(cells []string) []string {
	out := make([]string, len(cells))
	for i, c := range cells {
		out[i] = strings.NewReplacer("|", `\|`, "\n", " ").Replace(c)
	}
	return out
}
