package main

import (
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// The lines Kubernetes' performance suites log (k8s.io/kubernetes
// test/e2e/storage/testsuites): volumeperf.go's "Creating N PVCs" step
// and its "Metrics to evaluate" (k8s.io/utils/dump of a Metrics: the
// duration in nanoseconds), pvcdeletionperf.go's "Deleted PV ..., PVC
// ... in D" per claim and "Deleted all PVC/PVs in D".
var (
	perfCreating  = regexp.MustCompile(`Creating (\d+) PVCs of size`)
	perfMetrics   = regexp.MustCompile(`Metrics to evaluate: [^{]*\{\s*AvgLatency: \(time\.Duration\) ([^,\s]+),\s*Throughput: \(float64\) ([-+.0-9eE]+)`)
	perfDeletedPV = regexp.MustCompile(`Deleted PV \S+, PVC \S+ in (\S+)`)
	perfDeleted   = regexp.MustCompile(`Deleted all PVC/PVs in (\S+)`)
)

// perfFigures are one e2e.test run's figures from the two performance
// suites; a zero field is one the log does not have (the suite did not
// run, or failed before it).
type perfFigures struct {
	claims     int           // the driver file's Count, from the first "Creating N PVCs"
	avgLatency time.Duration // volume-lifecycle-performance: creation to Bound, on average
	throughput float64       // volume-lifecycle-performance: claims / the slowest claim's latency
	deleteAll  time.Duration // pvc-deletion-performance: every claim deleted and its PV gone
	deletePV   []time.Duration
}

// readPerf reads the figures from an e2e.test log (its -ginkgo.v output).
func readPerf(file string) (perfFigures, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return perfFigures{}, err
	}
	return parsePerf(string(b), file)
}

// parsePerf finds the suites' lines in log; name is for errors.
func parsePerf(log, name string) (perfFigures, error) {
	var f perfFigures
	var err error
	if m := perfCreating.FindStringSubmatch(log); m != nil {
		f.claims, _ = strconv.Atoi(m[1])
	}
	if m := perfMetrics.FindStringSubmatch(log); m != nil {
		if f.avgLatency, err = parseLogDuration(m[1]); err != nil {
			return f, fmt.Errorf("%s: AvgLatency: %w", name, err)
		}
		if f.throughput, err = strconv.ParseFloat(m[2], 64); err != nil {
			return f, fmt.Errorf("%s: Throughput: %w", name, err)
		}
	}
	for _, m := range perfDeletedPV.FindAllStringSubmatch(log, -1) {
		d, err := parseLogDuration(m[1])
		if err != nil {
			return f, fmt.Errorf("%s: a PV's deletion: %w", name, err)
		}
		f.deletePV = append(f.deletePV, d)
	}
	if m := perfDeleted.FindStringSubmatch(log); m != nil {
		if f.deleteAll, err = parseLogDuration(m[1]); err != nil {
			return f, fmt.Errorf("%s: the whole deletion: %w", name, err)
		}
	}
	return f, nil
}

// parseLogDuration reads a duration as the suites log it: a Go duration
// (1m2.5s) or, from k8s.io/utils/dump, an integer of nanoseconds.
func parseLogDuration(s string) (time.Duration, error) {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return time.Duration(n), nil
	}
	return time.ParseDuration(s)
}

// perfRows are the figures of runs as rows, one column a run.
func perfRows(labels []string, figs []perfFigures) [][]string {
	rows := [][]string{append([]string{"FIGURE"}, labels...)}
	add := func(name string, cell func(perfFigures) string) {
		row := []string{name}
		for _, f := range figs {
			row = append(row, cell(f))
		}
		rows = append(rows, row)
	}
	add("claims per suite (Count)", func(f perfFigures) string { return orDash(f.claims != 0, strconv.Itoa(f.claims)) })
	add("volume-lifecycle-performance: average latency, creation to Bound", func(f perfFigures) string {
		return orDash(f.avgLatency != 0, f.avgLatency.Round(time.Millisecond).String())
	})
	add("volume-lifecycle-performance: throughput (claims/s)", func(f perfFigures) string {
		return orDash(f.throughput != 0, strconv.FormatFloat(f.throughput, 'f', 2, 64))
	})
	add("pvc-deletion-performance: all claims deleted, PVs gone", func(f perfFigures) string {
		return orDash(f.deleteAll != 0, f.deleteAll.Round(time.Millisecond).String())
	})
	add("pvc-deletion-performance: one PV's deletion, mean / max", func(f perfFigures) string {
		mean, most := meanMax(f.deletePV)
		return orDash(len(f.deletePV) != 0, fmt.Sprintf("%s / %s", mean.Round(time.Millisecond), most.Round(time.Millisecond)))
	})
	add("pvc-deletion-performance: PVs deleted", func(f perfFigures) string {
		return orDash(len(f.deletePV) != 0, strconv.Itoa(len(f.deletePV)))
	})
	return rows
}

// meanMax is the mean and the largest of ds (zero for none).
func meanMax(ds []time.Duration) (mean, most time.Duration) {
	if len(ds) == 0 {
		return 0, 0
	}
	var sum time.Duration
	for _, d := range ds {
		sum += d
		most = max(most, d)
	}
	return sum / time.Duration(len(ds)), most
}

// orDash is s, or "-" for a figure the run lacks.
func orDash(ok bool, s string) string {
	if !ok {
		return "-"
	}
	return s
}

// perfTable prints the runs' figures side by side (LABEL=e2e.log
// arguments); 1 when a run has none of them, since a suite that skipped
// or failed early left nothing to compare.
func perfTable(args []string, markdown bool, out io.Writer) (int, error) {
	if len(args) == 0 {
		return 2, fmt.Errorf("perf takes one or more LABEL=e2e.log\n%s", usage)
	}
	var labels []string
	var figs []perfFigures
	code := 0
	for _, a := range args {
		label, file, ok := strings.Cut(a, "=")
		if !ok || label == "" {
			return 2, fmt.Errorf("%q: want LABEL=e2e.log", a)
		}
		f, err := readPerf(file)
		if err != nil {
			return 2, err
		}
		if f.avgLatency == 0 && f.deleteAll == 0 {
			fmt.Fprintf(out, "NO FIGURES in %s's log %s: did the performance suites run?\n", label, file)
			code = 1
		}
		labels = append(labels, label)
		figs = append(figs, f)
	}
	printTable(out, perfRows(labels, figs), markdown)
	return code, nil
}
