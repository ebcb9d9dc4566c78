package bench

import (
	"context"
	"fmt"
	"io"
)

// runVsCeiling runs o.VsCeiling rounds of a burst bound by the binder
// under test (volplane, or kube-controller-manager) and then by the
// ceiling, A/B/A/B, each on a fresh control plane, so that the machine's
// drift reaches both alike; it prints every run, then both figures and
// their ratio per round and over all rounds.
func runVsCeiling(ctx context.Context, o *Options) error {
	subject := o.system()
	var a, b []*Result
	for round := 1; round <= o.VsCeiling; round++ {
		for _, sys := range []system{subject, sysCeiling} {
			fmt.Fprintf(o.Log, "== round %d of %d: %s\n", round, o.VsCeiling, o.name(sys))
			r, err := once(ctx, o, sys, load{n: o.N, clients: o.Clients})
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", round, o.name(sys), err)
			}
			r.Print(o.Out)
			fmt.Fprintln(o.Out)
			if sys == sysCeiling {
				b = append(b, r)
			} else {
				a = append(a, r)
			}
		}
	}
	printVsCeiling(o.Out, a, b)
	return nil
}

// printVsCeiling writes each round's figures and ratio, and the ratio of
// the means.
func printVsCeiling(w io.Writer, a, b []*Result) {
	if len(a) == 0 || len(a) != len(b) {
		return
	}
	fmt.Fprintf(w, "%s against the ceiling, %s, %d claims, rounds of A/B: %d (fresh control plane each run):\n",
		a[0].System, a[0].mode(), a[0].Claims, len(a))
	var sumA, sumB float64
	lo, hi := 0.0, 0.0
	for i := range a {
		ratio := a[i].PerSecond / b[i].PerSecond
		if i == 0 || ratio < lo {
			lo = ratio
		}
		if i == 0 || ratio > hi {
			hi = ratio
		}
		sumA += a[i].PerSecond
		sumB += b[i].PerSecond
		fmt.Fprintf(w, "  round %d  %s: %s\n", i+1, a[i].System, a[i].shortLine())
		fmt.Fprintf(w, "  round %d  %s: %s\n", i+1, b[i].System, b[i].shortLine())
		fmt.Fprintf(w, "  round %d  ratio: %.1f %%\n", i+1, 100*ratio)
	}
	meanA, meanB := sumA/float64(len(a)), sumB/float64(len(b))
	fmt.Fprintf(w, "  mean     %s: %.1f %s\n", a[0].System, meanA, a[0].unit())
	fmt.Fprintf(w, "  mean     %s: %.1f %s\n", b[0].System, meanB, b[0].unit())
	fmt.Fprintf(w, "  ratio:   %.1f %% of the ceiling (rounds %.1f–%.1f %%)\n", 100*meanA/meanB, 100*lo, 100*hi)
}
