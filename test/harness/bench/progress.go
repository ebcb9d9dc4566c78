package bench

import (
	"fmt"
	"time"
)

// progressEvery is how often a run says, while it waits, how many of its
// claims are Bound: a burst of 10,000 can take minutes, and a run that
// prints nothing meanwhile cannot be told from one that is stuck.
const progressEvery = 5 * time.Second

// progress makes the lines a run prints every progressEvery while it
// waits for its claims:
//
//	4213/10000 claims Bound, 10000 created, 25s elapsed, 812/s in the last 5s
//
// The rate since the previous line shows at a glance whether the binder is
// still working or has stalled (0/s).
type progress struct {
	n      int       // claims of the run
	start  time.Time // when the first create was sent
	bound  int       // claims Bound at the previous line
	lastAt time.Time // when the previous line was made, start before the first
	// done and sent say what is counted: "claims Bound" of those
	// "created", or (a deletion burst) "volumes gone" of those "deleted".
	done, sent string
}

func newProgress(n int, start time.Time) *progress {
	return &progress{n: n, start: start, lastAt: start, done: "claims Bound", sent: "created"}
}

// line is the progress line at now, bound claims being Bound and created
// sent; it remembers bound for the next line's rate.
func (p *progress) line(bound, created int, now time.Time) string {
	s := fmt.Sprintf("  %d/%d %s, %d %s, %s elapsed", bound, p.n, p.done, min(created, p.n), p.sent, now.Sub(p.start).Round(time.Second))
	if d := now.Sub(p.lastAt); d > 0 {
		s += fmt.Sprintf(", %.0f/s in the last %s", float64(bound-p.bound)/d.Seconds(), d.Round(time.Second))
	}
	p.bound, p.lastAt = bound, now
	return s
}
