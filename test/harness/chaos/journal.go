package chaos

import (
	"context"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Journaled watches the reclaim journal in etcd through the run and keeps,
// per volume, when a record of its reclaim was first seen: a volume whose
// reclaim started must never be rebound (docs/rebind.md). The watch
// resumes from its last revision across etcd restarts (the client does);
// a resume etcd refuses (compacted) starts again from a fresh read, and
// the gap is counted.
type Journaled struct {
	mu    sync.Mutex
	first map[string]time.Time
	gaps  int
}

// WatchJournal starts watching until ctx ends.
func WatchJournal(ctx context.Context, c *Cluster) *Journaled {
	j := &Journaled{first: map[string]time.Time{}}
	go j.run(ctx, c)
	return j
}

func (j *Journaled) run(ctx context.Context, c *Cluster) {
	cli, err := c.EtcdClient()
	for err != nil {
		if !sleep(ctx, time.Second) {
			return
		}
		cli, err = c.EtcdClient()
	}
	defer cli.Close()
	var rev int64
	for ctx.Err() == nil {
		if rev == 0 {
			gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			resp, err := cli.Get(gctx, reclaimJournalKey, clientv3.WithPrefix(), clientv3.WithKeysOnly())
			cancel()
			if err != nil {
				sleep(ctx, 200*time.Millisecond)
				continue
			}
			for _, kv := range resp.Kvs {
				j.see(string(kv.Key))
			}
			rev = resp.Header.Revision + 1
		}
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		for resp := range cli.Watch(wctx, reclaimJournalKey, clientv3.WithPrefix(), clientv3.WithRev(rev)) {
			if resp.CompactRevision != 0 {
				j.mu.Lock()
				j.gaps++
				j.mu.Unlock()
				rev = 0
				break
			}
			if resp.Err() != nil {
				break
			}
			for _, ev := range resp.Events {
				if ev.Type == clientv3.EventTypePut {
					j.see(string(ev.Kv.Key))
				}
			}
			rev = resp.Header.Revision + 1
		}
		cancel()
		sleep(ctx, 200*time.Millisecond)
	}
}

// see notes a record's key (the journal's record or its lock: both name
// the volume last).
func (j *Journaled) see(key string) {
	name := strings.TrimPrefix(key, reclaimJournalKey)
	if i := strings.LastIndex(name, "/"); i >= 0 {
		name = name[i+1:]
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if _, ok := j.first[name]; !ok {
		j.first[name] = time.Now()
	}
}

// First is when a reclaim of the volume was first seen journaled.
func (j *Journaled) First(volume string) (time.Time, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	t, ok := j.first[volume]
	return t, ok
}

// Gaps is how many times the watch had to read afresh.
func (j *Journaled) Gaps() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.gaps
}
