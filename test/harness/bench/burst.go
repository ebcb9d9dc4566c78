package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// load is how the measured claims arrive: all at once from clients
// goroutines (a burst of n), or open loop at rate per second for duration.
type load struct {
	n        int
	clients  int
	rate     float64
	duration time.Duration
}

func (l load) claims() int {
	if l.rate > 0 {
		return arrivals(l.rate, l.duration)
	}
	return l.n
}

// create creates every claim with create(i).
func (l load) create(ctx context.Context, create func(i int) error) (Lateness, error) {
	if l.rate > 0 {
		return schedule(ctx, l.rate, l.claims(), create)
	}
	return Lateness{}, parallel(ctx, l.n, l.clients, create)
}

// boundWait is how long a run waits for the claims to be Bound once all
// are created.
func boundWait(n int) time.Duration { return 2*time.Minute + time.Duration(n)*50*time.Millisecond }

// startProfiles takes CPU profiles of what binds (volplane's binder and
// watcher, and provisioner when dynamic; or kube-controller-manager, and
// csi-provisioner when dynamic) and of kube-apiserver while a burst's
// claims are bound, or while a steady rate's claims arrive, into
// ProfileDir (a steady rate's into ProfileDir/rate-<R>), one
// <process>.pprof each; the function it returns waits for them and saves
// heap profiles.
func (t *trial) startProfiles(ctx context.Context, l load, n int) func() error {
	if t.o.ProfileDir == "" || t.sys == sysCeiling || t.noProfiles {
		return func() error { return nil }
	}
	dir, seconds := t.o.ProfileDir, profileSeconds(t.o.ProfileSeconds, n)
	if l.rate > 0 {
		dir, seconds = filepath.Join(dir, fmt.Sprintf("rate-%g", l.rate)), max(2, int(l.duration.Seconds()))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return func() error { return err }
	}
	services := slices.Sorted(maps.Keys(t.debug))
	errc := make(chan error, len(services)+1)
	for _, s := range services {
		go func() {
			errc <- fetch(ctx, debugClient(t.debug[s]), fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", t.debug[s], seconds), filepath.Join(dir, s+".pprof"))
		}()
	}
	// The apiserver too: it spends most of every claim's CPU.
	go func() {
		b, err := t.client.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").Param("seconds", strconv.Itoa(seconds)).
			Timeout(time.Duration(seconds+60) * time.Second).DoRaw(ctx)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, "kube-apiserver.pprof"), b, 0o644)
		}
		if err != nil {
			err = fmt.Errorf("profile kube-apiserver: %w", err)
		}
		errc <- err
	}()
	return func() error {
		var err error
		for range len(services) + 1 {
			err = errors.Join(err, <-errc)
		}
		for _, s := range services {
			err = errors.Join(err, fetch(ctx, debugClient(t.debug[s]), t.debug[s]+"/debug/pprof/heap", filepath.Join(dir, s+".heap")))
		}
		return err
	}
}

// profileSeconds is how long a burst of n claims is profiled from its
// first create: set (Options.ProfileSeconds), or n/300 s and 2 s at least,
// the first few seconds of a burst of 1,000.
func profileSeconds(set, n int) int {
	if set > 0 {
		return set
	}
	return max(2, n/300)
}

// debugClient is the client for a process's debug URL: kube-controller-
// manager's is its secure port.
func debugClient(base string) *http.Client {
	if strings.HasPrefix(base, "https://") {
		return insecureClient
	}
	return http.DefaultClient
}

// fetch saves what url answers into path.
func fetch(ctx context.Context, client *http.Client, url, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
