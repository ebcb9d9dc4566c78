package reclaimer

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
)

// Each failed step is counted under the reason an operator acts on.
func TestRetryReason(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{recorded{&refusal{reason: "claim ns/c points at the volume"}}, retryInUse},
		{recorded{failedStep{"Recycle failed: pod failed"}}, retryFailed},
		{fmt.Errorf("%w: record the reclaim of pv: %w", errJournal, errors.New("context deadline exceeded")), retryEtcd},
		{recorded{provisionerError{fmt.Errorf("provisioner DeleteVolume: %w", status.Error(codes.Unavailable, "no connection"))}}, retryProvisioner},
		{recorded{apierrors.NewServiceUnavailable("etcd is down")}, retryAPI},
		{fmt.Errorf("read recycler pod: %w", apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "p", errors.New("no"))), retryAPI},
		{errors.New("something else"), retryOther},
	} {
		t.Run(tc.err.Error(), func(t *testing.T) {
			if got := retryReason(tc.err); got != tc.want {
				t.Errorf("retryReason = %q, want %q", got, tc.want)
			}
		})
	}
}

// A reclaim that ends is counted by policy and result, and timed from its
// start; a successful Delete through the provisioner is also
// kube-controller-manager's "delete" operation.
func TestEndedReclaims(t *testing.T) {
	start := time.Now().Add(-90 * time.Second)
	r := &reclaimerv1.Reclaim{VolumeName: "pv", Policy: "Delete", Method: reclaimerv1.Method_METHOD_PROVISIONER, Driver: "ended.csi.example.com",
		CreateTime: timestamppb.New(start)}
	before := counter(t, reclaimsTotal.WithLabelValues("Delete", "succeeded"))
	ended(r, reclaimerv1.State_STATE_SUCCEEDED, time.Now())
	if got := counter(t, reclaimsTotal.WithLabelValues("Delete", "succeeded")); got != before+1 {
		t.Errorf("volplane_reclaimer_reclaims_total{policy=Delete,result=succeeded} %v, want %v", got, before+1)
	}
	var m dto.Metric
	if err := reclaimSeconds.WithLabelValues("Delete", "succeeded").(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	if h := m.GetHistogram(); h.GetSampleCount() == 0 || h.GetSampleSum() < 90 {
		t.Errorf("reclaim duration: %d samples, sum %v; want one of about 90s", h.GetSampleCount(), h.GetSampleSum())
	}
}

func counter(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
