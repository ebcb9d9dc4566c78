package timeline

import (
	"google.golang.org/protobuf/types/known/timestamppb"

	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// ToAPI converts spans to the API's, each marked with the service and the
// replica that recorded it.
func ToAPI(spans []Span, service, member string) []*provisionerv1.TimelineSpan {
	out := make([]*provisionerv1.TimelineSpan, 0, len(spans))
	for _, s := range spans {
		ts := &provisionerv1.TimelineSpan{Service: service, Name: s.Name, Code: s.Code, Detail: s.Detail, MemberId: member,
			StartTime: timestamppb.New(s.StartTime()), EndTime: timestamppb.New(s.EndTime())}
		if s.TraceID.IsValid() {
			ts.TraceId = s.TraceID.String()
		}
		out = append(out, ts)
	}
	return out
}
