package bench

import (
	"testing"
	"time"
)

func TestProgressLine(t *testing.T) {
	start := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return start.Add(time.Duration(s * float64(time.Second))) }
	type call struct {
		bound, created int
		at             time.Time
		want           string
	}
	for _, tc := range []struct {
		name  string
		n     int
		calls []call
	}{
		{"a burst binding, then stalled", 1000, []call{
			{0, 400, at(5), "  0/1000 claims Bound, 400 created, 5s elapsed, 0/s in the last 5s"},
			{350, 1000, at(10), "  350/1000 claims Bound, 1000 created, 10s elapsed, 70/s in the last 5s"},
			{990, 1000, at(15), "  990/1000 claims Bound, 1000 created, 15s elapsed, 128/s in the last 5s"},
			{990, 1000, at(20), "  990/1000 claims Bound, 1000 created, 20s elapsed, 0/s in the last 5s"},
		}},
		{"minutes, and a tick that came late", 10000, []call{
			{2500, 10000, at(125), "  2500/10000 claims Bound, 10000 created, 2m5s elapsed, 20/s in the last 2m5s"},
			{2600, 10000, at(132.4), "  2600/10000 claims Bound, 10000 created, 2m12s elapsed, 14/s in the last 7s"},
		}},
		{"more creates counted than claims are never shown", 3, []call{
			{3, 5, at(5), "  3/3 claims Bound, 3 created, 5s elapsed, 1/s in the last 5s"},
		}},
		{"two lines at once: no rate over no time", 10, []call{
			{1, 10, at(5), "  1/10 claims Bound, 10 created, 5s elapsed, 0/s in the last 5s"},
			{2, 10, at(5), "  2/10 claims Bound, 10 created, 5s elapsed"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newProgress(tc.n, start)
			for i, c := range tc.calls {
				if got := p.line(c.bound, c.created, c.at); got != c.want {
					t.Errorf("line %d:\n got %q\nwant %q", i, got, c.want)
				}
			}
		})
	}
}
