package timeline_test

import (
	"context"
	"fmt"
	"time"

	"github.com/volplane/volplane/pkg/timeline"
)

func Example() {
	// At most 1000 claims, 16 spans each, no OpenTelemetry.
	s := timeline.New(1000, 16, nil)
	ctx := context.Background()

	// A step measured after the fact...
	queued := time.Now().Add(-20 * time.Millisecond)
	s.Add(ctx, "claim-uid", "queued", queued, time.Now(), "-", "by a watch event")
	// ...and one timed as it runs; pass ctx on to the calls it makes.
	ctx, step := s.Start(ctx, "claim-uid", "CreateVolume")
	_ = ctx // e.g. driver.CreateVolume(ctx, req)
	step.EndErr(nil, "pvc-claim-uid")

	spans, dropped := s.Spans("claim-uid")
	for _, sp := range spans {
		fmt.Println(sp.Name, sp.Code, sp.Detail)
	}
	fmt.Println("dropped:", dropped)
	// Output:
	// queued - by a watch event
	// CreateVolume OK pvc-claim-uid
	// dropped: 0
}
