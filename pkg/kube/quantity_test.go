package kube_test

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/volplane/volplane/pkg/kube"
)

func TestParseQuantity(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    string // the canonical value; "" when refused
		errText string
	}{
		{"1Gi", "1Gi", ""},
		{"1G", "1G", ""},
		{"1.5Gi", "1536Mi", ""},
		{"1e9", "1e9", ""},
		{"5E3", "5e3", ""},
		{"100m", "100m", ""},
		{"1E", "1E", ""},
		{"8Ei", "8Ei", ""},
		{"9223372036854775807", "9223372036854775807", ""},
		{"-9223372036854775807", "-9223372036854775807", ""},
		{"0.000000001", "1n", ""},
		{"1e-64", "1n", ""},
		{"1e18", "1e18", ""},
		{"lots", "", "quantities must match"},
		{"", "", "quantities must match"},
		{"1Qi", "", "quantities must match"},
		{"1.2.3", "", ""},
		// What makes the API server (and resource.Quantity) compute for
		// minutes, refused from the text.
		{"1E+999999999", "", "exponent +999999999 is out of range"},
		{"1e999999999", "", "out of range"},
		{"1E-999999999", "", "out of range"},
		{"1234567890123456789E+999999999", "", "out of range"},
		{"1e99999999999999999999", "", "out of range"},
		{"1e65", "", "out of range"},
		{"1" + strings.Repeat("0", 70), "", "at most 64 characters"},
		// Beyond an int64.
		{"9223372036854775808", "", "8Ei"},
		{"9Ei", "9223372036854775807", ""}, // binary suffixes are capped, as the API server caps them
		{"10E", "", "8Ei"},
		{"1e64", "", "8Ei"},
		{"-1e30", "", "8Ei"},
		{"99999999999999999999999999999999999999999999999999999999999999", "", "8Ei"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			start := time.Now()
			q, err := kube.ParseQuantity(tc.in)
			if took := time.Since(start); took > 100*time.Millisecond {
				t.Errorf("took %v", took)
			}
			if tc.want != "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if want := resource.MustParse(tc.want); q.Cmp(want) != 0 {
					t.Fatalf("%s, want %s", q.String(), tc.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted as %s", q.String())
			}
			if !strings.Contains(err.Error(), tc.errText) {
				t.Fatalf("%v, want %q", err, tc.errText)
			}
		})
	}
}
