package provisioner

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// classify decides, in this one place, what a CSI call's error means for
// the operation (external-provisioner's checkError):
//   - the driver may still be working on it (timeouts, cancellation, the
//     driver unreachable or asking to be retried): IN_BACKGROUND, keep the
//     operation journaled and retry with the same name;
//   - out of resources on the node the scheduler chose: RESCHEDULE, so the
//     scheduler picks another node (nothing was made);
//   - anything else is final: the driver made nothing. NO_CHANGE.
//
// mayReschedule is true when the claim has a selected node and the driver
// reports topology (VOLUME_ACCESSIBILITY_CONSTRAINTS), as
// external-provisioner's supportsTopology.
func classify(err error, mayReschedule bool) provisionerv1.Outcome {
	if err == nil {
		return provisionerv1.Outcome_OUTCOME_FINISHED
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return provisionerv1.Outcome_OUTCOME_IN_BACKGROUND
	}
	st, ok := status.FromError(err)
	if !ok {
		// Not an answer from the driver at all (e.g. the connection broke
		// mid-call): it may have acted.
		return provisionerv1.Outcome_OUTCOME_IN_BACKGROUND
	}
	switch st.Code() {
	case codes.DeadlineExceeded, codes.Unavailable, codes.Canceled, codes.Aborted:
		return provisionerv1.Outcome_OUTCOME_IN_BACKGROUND
	case codes.ResourceExhausted:
		if mayReschedule {
			return provisionerv1.Outcome_OUTCOME_RESCHEDULE
		}
	}
	return provisionerv1.Outcome_OUTCOME_NO_CHANGE
}

// infeasible reports whether the driver refused the request as it stands
// (InvalidArgument): the same request would be refused again, so the
// caller delays the next attempt by --retry-interval-max unless the
// claim's StorageClass is replaced (sig-storage-lib-external-provisioner
// v13's isInfeasibleError, and its slow set). The outcome stays
// NO_CHANGE: the driver made nothing.
func infeasible(err error) bool {
	return status.Code(err) == codes.InvalidArgument
}
