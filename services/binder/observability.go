package binder

import (
	"sync/atomic"

	"github.com/volplane/volplane/pkg/timeline"
)

// observability is what the controller records for its readers beyond
// the Prometheus metrics of metrics.go: the steps taken for each claim,
// the claims waiting for a consumer, another binder's writes, and the
// binds made.
type observability struct {
	// timeline records the steps taken for each claim (timeline.go); nil
	// records nothing.
	timeline *timeline.Store
	// waits: the claims waiting for their first consumer, since when
	// (timeline.go).
	waits consumerWaits
	// foreign notices another binder's writes (foreign.go); nil: not
	// looked for.
	foreign *foreignBinders
	// bindsTotal counts the claims this replica bound.
	bindsTotal atomic.Int64
}
