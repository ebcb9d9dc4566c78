package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"sync"
	"time"
)

// lateAfter is how far behind its scheduled time a creation may be sent
// before it counts as late: the load generator, not the system, fell
// behind.
const lateAfter = 10 * time.Millisecond

// Lateness is how far behind schedule the bench sent open-loop arrivals.
type Lateness struct {
	Count int           // creations sent more than lateAfter after their time
	Max   time.Duration // the largest delay
}

// arrivals is the number of claims that arrive at rate per second over d.
func arrivals(rate float64, d time.Duration) int {
	return max(1, int(math.Round(rate*d.Seconds())))
}

// schedule calls create(i) for i = 0..n-1 at start + i/rate, each in a
// goroutine of its own, so that an arrival never waits for an earlier
// one (open loop); it returns once every create has returned, with how
// late they were sent and the first error (which stops the arrivals).
func schedule(ctx context.Context, rate float64, n int, create func(i int) error) (Lateness, error) {
	var (
		mu   sync.Mutex
		late Lateness
		err  error
		wg   sync.WaitGroup
	)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	start := time.Now()
	for i := range n {
		at := start.Add(time.Duration(float64(i) * float64(time.Second) / rate))
		if d := time.Until(at); d > 0 {
			timer.Reset(d)
			select {
			case <-ctx.Done():
				wg.Wait()
				return late, ctx.Err()
			case <-timer.C:
			}
		}
		mu.Lock()
		failed := err != nil
		mu.Unlock()
		if failed {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			lag := time.Since(at)
			cerr := create(i)
			mu.Lock()
			defer mu.Unlock()
			if lag > lateAfter {
				late.Count++
			}
			late.Max = max(late.Max, lag)
			if cerr != nil && err == nil {
				err = cerr
			}
		}()
	}
	wg.Wait()
	return late, err
}

// runRates measures open-loop arrivals at each rate, each on a fresh
// control plane, and ends with the highest rate whose p99 stayed under
// a second.
func runRates(ctx context.Context, o *Options) error {
	var results []*Result
	for _, rate := range o.Rates {
		fmt.Fprintf(o.Log, "== %g claims/s for %s\n", rate, o.Duration)
		r, err := once(ctx, o, o.system(), load{rate: rate, duration: o.Duration, clients: o.Clients})
		if err != nil {
			return fmt.Errorf("rate %g/s: %w", rate, err)
		}
		r.Print(o.Out)
		fmt.Fprintln(o.Out)
		results = append(results, r)
	}
	printRates(o.Out, results)
	return nil
}

// p99Target is the create-to-Bound p99 a rate must stay under.
const p99Target = time.Second

// printRates writes one line per rate and the highest rate whose p99
// stayed under p99Target with every claim Bound.
func printRates(w io.Writer, results []*Result) {
	if len(results) == 0 {
		return
	}
	fmt.Fprintf(w, "%s, %s, open-loop arrivals for %s at each rate (fresh control plane each):\n", results[0].System, results[0].mode(), results[0].Duration)
	fmt.Fprintf(w, "%8s %7s %9s %9s %9s %9s %10s %9s\n", "rate/s", "claims", "p50", "p90", "p99", "max", "not Bound", "late")
	best := 0.0
	for _, r := range results {
		fmt.Fprintf(w, "%8g %7d %9s %9s %9s %9s %10d %9d\n", r.Rate, r.Claims, round(r.Latency.P50), round(r.Latency.P90),
			round(r.Latency.P99), round(r.Latency.Max), r.Unbound, r.Late.Count)
		if r.Unbound == 0 && r.Latency.P99 < p99Target {
			best = max(best, r.Rate)
		}
	}
	if best > 0 {
		fmt.Fprintf(w, "highest rate with p99 < %s: %g claims/s\n", p99Target, best)
	} else {
		fmt.Fprintf(w, "highest rate with p99 < %s: none of these\n", p99Target)
	}
	fmt.Fprintf(w, "(late: creations the bench sent more than %s behind schedule)\n", lateAfter)
}
