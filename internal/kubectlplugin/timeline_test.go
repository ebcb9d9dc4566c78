package kubectlplugin

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestDescribeTimeline(t *testing.T) {
	const answer = `{"claim":{"namespace":"team","name":"data","phase":"Bound"},"spans":[
	{"service":"binder","name":"seen","startTime":"2026-11-27T12:44:15Z","endTime":"2026-11-27T12:44:15.200Z","detail":"created, seen"},
	{"service":"binder","name":"sync","startTime":"2026-11-27T12:44:15.200Z","endTime":"2026-11-27T12:44:15.210Z","code":"PROVISION"},
	{"service":"provisioner","name":"CreateVolume","startTime":"2026-11-27T12:44:15.250Z","endTime":"2026-11-27T12:44:17.250Z","code":"OK","detail":"pvc-1","memberId":"p-1"},
	{"service":"binder","name":"bind claim","startTime":"2026-11-27T12:44:17.300Z","endTime":"2026-11-27T12:44:17.300400Z","code":"OK"}
	],"dropped":3,"missing":["provisioner: unavailable"]}`
	ans, err := decodeObject([]byte(answer))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := describeTimeline(&out, ans, false); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	t.Log("\n" + got)
	lines := strings.Split(got, "\n")
	for _, want := range []string{
		"Claim team/data (Bound): 4 steps in 2.3s",
		"Longest step: provisioner CreateVolume, 2s (86% of 2.3s).",
		"3 older steps were dropped",
		"Missing: provisioner: unavailable",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("no %q", want)
		}
	}
	// One line per span, in order, with offset, duration and a bar whose
	// marks are where the step is.
	for i, want := range []struct{ prefix, bar string }{
		{"+0s 200ms", "|███·"},
		{"+200ms 10ms", "|···█·"},
		{"+250ms 2s", "|····██████████████████████████████████··|"},
		{"+2.3s 400µs", "·█|"},
	} {
		line := lines[3+i]
		f := strings.Fields(line)
		if len(f) < 2 || f[0]+" "+f[1] != want.prefix || !strings.Contains(line, want.bar) {
			t.Errorf("line %d = %q, want it to start %q and hold %q", i, line, want.prefix, want.bar)
		}
	}
	t.Run("wide shows the replica", func(t *testing.T) {
		out.Reset()
		if err := describeTimeline(&out, ans, true); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.String(), "REPLICA") || !strings.Contains(out.String(), "p-1") {
			t.Errorf("wide:\n%s", out.String())
		}
	})
	t.Run("no spans", func(t *testing.T) {
		out.Reset()
		empty, _ := decodeObject([]byte(`{"claim":{"namespace":"team","name":"old","phase":"Bound"}}`))
		if err := describeTimeline(&out, empty, false); err != nil || !strings.Contains(out.String(), "no steps recorded") {
			t.Errorf("%v\n%s", err, out.String())
		}
	})
}

func TestBar(t *testing.T) {
	for name, tc := range map[string]struct {
		offset, d, total time.Duration
		want             string
	}{
		"whole":           {0, time.Second, time.Second, "|" + strings.Repeat("█", barWidth) + "|"},
		"instant at end":  {time.Second, 0, time.Second, "|" + strings.Repeat("·", barWidth-1) + "█|"},
		"nothing in time": {0, 0, 0, "|" + strings.Repeat("█", barWidth) + "|"},
		"second half":     {time.Second, time.Second, 2 * time.Second, "|" + strings.Repeat("·", barWidth/2) + strings.Repeat("█", barWidth/2) + "|"},
	} {
		t.Run(name, func(t *testing.T) {
			if got := bar(tc.offset, tc.d, tc.total); got != tc.want {
				t.Errorf("bar = %q, want %q", got, tc.want)
			}
		})
	}
}
