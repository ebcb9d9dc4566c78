package watchclient_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/pkg/watchclient"
	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

// keyOf returns a claim key the ring over members gives member.
func keyOf(t *testing.T, members []string, member string) string {
	t.Helper()
	r := coord.NewRing(members)
	for i := range 1000 {
		k := fmt.Sprintf("ns/c%d", i)
		if r.Owner("pvc/"+k) == member {
			return k
		}
	}
	t.Fatalf("no key for %s", member)
	return ""
}

func list(seq uint64, keys ...string) []*watcherv1.WatchResponse {
	out := []*watcherv1.WatchResponse{ev(watcherv1.EventType_EVENT_TYPE_RESET, "", seq)}
	for _, k := range keys {
		e := ev(watcherv1.EventType_EVENT_TYPE_ADDED, k, seq)
		e.Kind = watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM
		out = append(out, e)
	}
	return append(out, ev(watcherv1.EventType_EVENT_TYPE_SYNCED, "", seq))
}

func (s *script) requestsSoFar() []*watcherv1.WatchRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requests)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// With a Shard, no stream opens before the first Set; the stream asks
// for the shard, and Holds follows the shard of the last full list
// delivered, never the one merely asked for. A new shard ends the stream
// and the next one starts over without a cursor; an unchanged one (same
// members, other order) keeps the stream.
func TestShardAsksForTheClaimsAndRelistsWhenItChanges(t *testing.T) {
	two := []string{"a", "b"}
	ka, kb := keyOf(t, two, "a"), keyOf(t, two, "b")
	s := &script{streams: [][]*watcherv1.WatchResponse{list(5, ka)}}
	cc := serve(t, s)
	shard := watchclient.NewShard()
	var listed atomic.Int32
	shard.OnListed(func() {
		if !shard.Holds(ka) {
			t.Error("OnListed called before Holds answers from the list")
		}
		listed.Add(1)
	})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() {
		done <- watchclient.Run(ctx, cc, watchclient.Options{Shard: shard, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}, &recorder{})
	}()
	defer func() { cancel(); <-done }()

	if n := len(s.requestsSoFar()); n != 0 || shard.Holds(ka) {
		t.Fatalf("before Set: %d streams, holds %s: %v", n, ka, shard.Holds(ka))
	}
	shard.Set([]string{"b", "a"}, "a")
	waitFor(t, "the first list", func() bool { return shard.Holds(ka) })
	if shard.Holds(kb) {
		t.Fatalf("holds %s of b", kb)
	}
	req := s.requestsSoFar()[0]
	if got := req.GetClaimShard(); !slices.Equal(got.GetMembers(), two) || got.GetMember() != "a" || req.GetResumeAfter() != nil {
		t.Fatalf("first request %v, want shard a of [a b] and no cursor", req)
	}
	// The stream broke after the list: the next resumes, same shard.
	waitFor(t, "a resumed stream", func() bool { return len(s.requestsSoFar()) == 2 })
	if req := s.requestsSoFar()[1]; req.GetResumeAfter().GetSequence() != 5 || req.GetClaimShard().GetMember() != "a" {
		t.Fatalf("second request %v, want a resume after 5 with the shard", req)
	}
	shard.Set([]string{"a", "b"}, "a") // unchanged

	// b leaves: a's shard is every claim. Until the new list is in, Holds
	// stays with the old shard.
	s.mu.Lock()
	s.streams = append(s.streams, list(9, ka, kb))
	s.mu.Unlock()
	shard.Set([]string{"a"}, "a")
	waitFor(t, "the new shard's list", func() bool { return shard.Holds(kb) })
	reqs := s.requestsSoFar()
	// The third stream is the new shard's: the unchanged Set did not
	// restart the second (which would have resumed with the old shard).
	if req := reqs[2]; req.GetResumeAfter() != nil || !slices.Equal(req.GetClaimShard().GetMembers(), []string{"a"}) {
		t.Fatalf("third request %v, want the new shard and no cursor", req)
	}
	waitFor(t, "OnListed after the second list", func() bool { return listed.Load() == 2 })
	if ms, m := shard.Listed(); !slices.Equal(ms, []string{"a"}) || m != "a" {
		t.Fatalf("Listed = %v %q", ms, m)
	}
}

// Holds is false for a shard asked for whose list never came.
func TestShardHoldsNothingBeforeAList(t *testing.T) {
	s := &script{} // streams that never list
	cc := serve(t, s)
	shard := watchclient.NewShard()
	shard.Set([]string{"a"}, "a")
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() { done <- watchclient.Run(ctx, cc, watchclient.Options{Shard: shard}, &recorder{}) }()
	waitFor(t, "a stream", func() bool { return len(s.requestsSoFar()) == 1 })
	if shard.Holds("ns/c") {
		t.Fatal("holds a claim before any list")
	}
	cancel()
	<-done
}
