package devenv

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestParseCPUSet(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		err      bool
	}{
		{in: "0", want: "0"},
		{in: "1-3", want: "1-3"},
		{in: "0,2-3,2", want: "0,2-3"},
		{in: "3,1,2", want: "1-3"},
		{in: "", err: true},
		{in: "a", err: true},
		{in: "3-1", err: true},
		{in: "-1", err: true},
		{in: "0-5000", err: true},
	} {
		t.Run(tc.in, func(t *testing.T) {
			s, err := ParseCPUSet(tc.in)
			if tc.err {
				if err == nil {
					t.Fatalf("ParseCPUSet(%q) = %v, want an error", tc.in, s)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := s.String(); got != tc.want {
				t.Errorf("ParseCPUSet(%q) = %s, want %s", tc.in, got, tc.want)
			}
		})
	}
}

// allowed is what /proc says the process's threads may run on, one entry
// per thread.
func allowed(t *testing.T, pid string) []string {
	t.Helper()
	tasks, err := os.ReadDir("/proc/" + pid + "/task")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, task := range tasks {
		b, err := os.ReadFile("/proc/" + pid + "/task/" + task.Name() + "/status")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
				out = append(out, strings.TrimSpace(v))
			}
		}
	}
	return out
}

// A pinned child runs on its CPU set from its first instruction, with
// every thread it makes; the parent's threads keep theirs.
func TestStartProcessOnPinsTheChild(t *testing.T) {
	cpus, err := AvailableCPUs()
	if err != nil {
		t.Fatal(err)
	}
	last := CPUSet{cpus[len(cpus)-1]}
	// The Go toolchain makes several threads at once: a child that makes
	// threads of its own.
	p, err := StartProcessOn(t.TempDir(), "sleeper", "/bin/sh", last, nil, "-c", "sleep 30 & sleep 30 & wait")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	pid := strconv.Itoa(p.PID())
	for _, a := range allowed(t, pid) {
		if a != last.String() {
			t.Errorf("child thread allowed on %s, want %s", a, last)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		kids, _ := os.ReadFile("/proc/" + pid + "/task/" + pid + "/children")
		if f := strings.Fields(string(kids)); len(f) > 0 {
			for _, k := range f {
				for _, a := range allowed(t, k) {
					if a != last.String() {
						t.Errorf("grandchild %s allowed on %s, want %s", k, a, last)
					}
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the child made no process")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The parent's other threads keep their CPUs: only the thread that
	// forked (and waits for the child) is pinned.
	if len(cpus) > 1 {
		pinned := 0
		for _, a := range allowed(t, "self") {
			if a == last.String() {
				pinned++
			}
		}
		if pinned > 1 {
			t.Errorf("%d threads of this process pinned to %s, want only the one that forked", pinned, last)
		}
	}
}
