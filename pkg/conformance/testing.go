package conformance

import "testing"

// RunTest runs the suite of service against cfg.Address as subtests of t,
// one per check: a failed check fails its subtest with the check's
// message, a skipped one skips it. cfg.Logf defaults to t.Logf.
func RunTest(t *testing.T, service Service, cfg Config) []Result {
	t.Helper()
	if cfg.Logf == nil {
		cfg.Logf = t.Logf
	}
	s, err := New(service, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var out []Result
	for _, c := range s.Checks() {
		t.Run(c.Name, func(t *testing.T) {
			r := s.Run(t.Context(), c)
			out = append(out, r)
			switch r.Outcome {
			case Failed:
				t.Error(r.Message)
			case Skipped:
				t.Skip(r.Message)
			}
		})
	}
	return out
}
