package etcdmember

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/storage/wal"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sync/errgroup"

	"github.com/volplane/volplane/pkg/logging"
)

// peerPoll is how often a waiting member looks at its peers again.
const peerPoll = 2 * time.Second

// errForceNewCluster asks runEtcd to start etcd again as a cluster of one.
var errForceNewCluster = errors.New("start again as a new cluster of this member alone")

// runner is one member's run.
type runner struct {
	o      Options
	p      *parsed
	log    *slog.Logger
	board  statusBoard
	status *statusClient
	health healthHandler
	// alarmSeen: the NOSPACE alarm was seen at the last maintenance.
	alarmSeen bool
	// lastLog rate-limits repeated warnings by key.
	logMu   sync.Mutex
	lastLog map[string]time.Time
}

// Run runs the member until ctx ends (then stops etcd and returns nil)
// or etcd fails. Before starting etcd it decides, from its data
// directory and its peers' status, whether to start on its data,
// bootstrap a new cluster, join the running one (replacing its own
// former self), or wait; see decide. While etcd runs it promotes itself
// when it joined as a learner, compacts, defragments and disarms the
// NOSPACE alarm (maintain), and restores a quorum lost with the others'
// data (RecoverQuorumAfter).
func Run(ctx context.Context, o Options) error {
	p, err := o.validate()
	if err != nil {
		return err
	}
	sc, err := newStatusClient(&o)
	if err != nil {
		return err
	}
	r := &runner{o: o, p: p, log: o.Logger.With("member", o.Name), status: sc, lastLog: map[string]time.Time{}}
	r.board.set(r.localState(), 0, nil)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return r.serveStatus(gctx) })
	g.Go(func() error { return r.serveHealth(gctx) })
	g.Go(func() error {
		err := r.run(gctx)
		if err != nil {
			return err
		}
		// ctx ended: the servers stop with it.
		return nil
	})
	return g.Wait()
}

func (r *runner) localState() peerState {
	if hasData(r.o.DataDir) {
		return stateData
	}
	return stateEmpty
}

// hasData reports whether dir holds a member's data (a WAL).
func hasData(dir string) bool { return wal.Exist(filepath.Join(dir, "member", "wal")) }

func (r *runner) readID() uint64 {
	b, err := os.ReadFile(r.p.idPath)
	if err != nil {
		return 0
	}
	id, err := strconv.ParseUint(strings.TrimSpace(string(b)), 16, 64)
	if err != nil {
		return 0
	}
	return id
}

func (r *runner) writeID(id uint64) {
	if err := os.WriteFile(r.p.idPath, []byte(strconv.FormatUint(id, 16)+"\n"), 0o600); err != nil {
		r.log.Warn("cannot record the member ID next to the data directory", "path", r.p.idPath, "error", err)
	}
}

// wipe removes the data directory and its ID file.
func (r *runner) wipe() {
	if err := os.RemoveAll(r.o.DataDir); err != nil {
		r.log.Error("cannot remove the data directory", "dir", r.o.DataDir, "error", err)
	}
	_ = os.Remove(r.p.idPath)
	r.board.set(stateEmpty, 0, nil)
}

// run decides how to start, starts etcd and supervises it.
func (r *runner) run(ctx context.Context) error {
	lastReason := ""
	var lastLogged time.Time
	for {
		v := r.look(ctx)
		d := decide(r.o.Name, r.p.self.PeerURL.String(), v)
		if ctx.Err() != nil {
			return nil
		}
		if d.Action == wait {
			waiting.Set(1)
			r.health.setReason(d.Reason)
			if d.Reason != lastReason || time.Since(lastLogged) >= 30*time.Second {
				r.log.Info("waiting before starting etcd", "reason", d.Reason, "peers", v.Peers)
				lastReason, lastLogged = d.Reason, time.Now()
			}
			select {
			case <-time.After(peerPoll):
				continue
			case <-ctx.Done():
				return nil
			}
		}
		waiting.Set(0)
		r.log.Info("starting", "action", d.Action.String(), "reason", d.Reason)
		var (
			cfg    *embed.Config
			err    error
			joined bool
		)
		switch d.Action {
		case wipe:
			r.log.Warn("removing a data directory the cluster no longer knows", "dir", r.o.DataDir, "reason", d.Reason)
			r.wipe()
			continue
		case start:
			cfg, err = r.config(embed.ClusterStateFlagExisting, r.o.InitialCluster)
		case bootstrap:
			cfg, err = r.config(embed.ClusterStateFlagNew, r.o.InitialCluster)
		case join:
			var cluster string
			if cluster, err = r.join(ctx, v, d); err != nil {
				r.log.Warn("cannot join the cluster yet; deciding again", "error", err)
				select {
				case <-time.After(peerPoll):
					continue
				case <-ctx.Done():
					return nil
				}
			}
			joined = true
			cfg, err = r.config(embed.ClusterStateFlagExisting, cluster)
		}
		if err != nil {
			return err
		}
		return r.runEtcd(ctx, cfg, joined)
	}
}

// look gathers what decide needs.
func (r *runner) look(ctx context.Context) view {
	v := view{HasData: hasData(r.o.DataDir), ID: r.readID()}
	ss := r.peerStates(ctx)
	v.Peers = states(ss)
	var started []string
	for _, pr := range r.p.others() {
		s := ss[pr.Name]
		if s.State != stateStarted {
			continue
		}
		started = append(started, r.p.clientURL(pr))
		if v.Members == nil && len(s.Members) > 0 {
			v.Members = s.Members
		}
	}
	if len(started) == 0 {
		return v
	}
	cli, err := r.newClient(started)
	if err != nil {
		return v
	}
	defer cli.Close()
	lctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if resp, err := cli.MemberList(lctx); err == nil {
		v.Members, v.Quorum = members(resp.Members), true
	}
	return v
}

func members(ms []*pb.Member) []member {
	out := make([]member, len(ms))
	for i, m := range ms {
		out[i] = member{ID: m.ID, Name: m.Name, PeerURLs: m.PeerURLs, ClientURLs: m.ClientURLs, Learner: m.IsLearner}
	}
	return out
}

// join changes the membership as d says and returns the initial cluster
// to start with: every current member, this one by its name.
func (r *runner) join(ctx context.Context, v view, d decision) (string, error) {
	var started []string
	for _, pr := range r.p.others() {
		if v.Peers[pr.Name] == stateStarted {
			started = append(started, r.p.clientURL(pr))
		}
	}
	if len(started) == 0 {
		return "", errors.New("no started member to join")
	}
	cli, err := r.newClient(started)
	if err != nil {
		return "", err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for _, id := range d.Remove {
		if _, err := cli.MemberRemove(ctx, id); err != nil && !errors.Is(err, rpctypes.ErrMemberNotFound) {
			return "", fmt.Errorf("remove this member's former self %x: %w", id, err)
		}
		replacements.Inc()
		r.log.Warn("removed this member's former self from the cluster: its data is lost; joining as a new member", "former_id", fmt.Sprintf("%x", id))
	}
	self := r.p.self.PeerURL.String()
	var (
		ms     []member
		selfID uint64
	)
	if d.Add {
		resp, err := cli.MemberAddAsLearner(ctx, []string{self})
		if err != nil {
			return "", fmt.Errorf("add this member as a learner: %w", err)
		}
		ms, selfID = members(resp.Members), resp.Member.ID
		r.log.Info("added this member to the cluster as a learner", "id", fmt.Sprintf("%x", selfID))
	} else {
		ms = v.Members
		if resp, err := cli.MemberList(ctx); err == nil {
			ms = members(resp.Members)
		}
		for _, m := range ms {
			if !m.started() && slices.Contains(m.PeerURLs, self) {
				selfID = m.ID
			}
		}
		if selfID == 0 {
			return "", errors.New("the cluster no longer lists this member")
		}
	}
	return r.initialCluster(ms, selfID), nil
}

// initialCluster is ms as --initial-cluster: each member by its name (this
// one by its own, members not started yet by their initial cluster
// name).
func (r *runner) initialCluster(ms []member, selfID uint64) string {
	var parts []string
	for _, m := range ms {
		for _, u := range m.PeerURLs {
			name := m.Name
			switch {
			case m.ID == selfID:
				name = r.o.Name
			case name == "":
				name = r.p.byURL[u]
			}
			if name == "" {
				name = fmt.Sprintf("member-%x", m.ID)
			}
			parts = append(parts, name+"="+u)
		}
	}
	return strings.Join(parts, ",")
}

// config is the embedded etcd's configuration.
func (r *runner) config(state, initialCluster string) (*embed.Config, error) {
	o := r.o
	cfg := embed.NewConfig()
	cfg.Name = o.Name
	cfg.Dir = o.DataDir
	cfg.ListenClientUrls = r.p.listenCli
	cfg.AdvertiseClientUrls = []url.URL{*r.p.client}
	cfg.ListenPeerUrls = r.p.listenPr
	cfg.AdvertisePeerUrls = []url.URL{*r.p.self.PeerURL}
	cfg.InitialCluster = initialCluster
	cfg.InitialClusterToken = o.InitialClusterToken
	cfg.ClusterState = state
	cfg.QuotaBackendBytes = o.QuotaBackendBytes
	cfg.AutoCompactionMode = o.AutoCompactionMode
	cfg.AutoCompactionRetention = o.AutoCompactionRetention
	cfg.BootstrapDefragThresholdMegabytes = o.BootstrapDefragThresholdMegabytes
	if o.SnapshotCount > 0 {
		cfg.SnapshotCount = o.SnapshotCount
	}
	if o.HeartbeatInterval > 0 {
		cfg.TickMs = uint(o.HeartbeatInterval / time.Millisecond)
	}
	if o.ElectionTimeout > 0 {
		cfg.ElectionMs = uint(o.ElectionTimeout / time.Millisecond)
	}
	cfg.UnsafeNoFsync = o.UnsafeNoFsync
	cfg.StrictReconfigCheck = true
	if o.ClientTLS.set() {
		cfg.ClientTLSInfo = transport.TLSInfo{CertFile: o.ClientTLS.CertFile, KeyFile: o.ClientTLS.KeyFile, TrustedCAFile: o.ClientTLS.CAFile, ClientCertAuth: true}
	}
	if o.PeerTLS.set() {
		cfg.PeerTLSInfo = transport.TLSInfo{CertFile: o.PeerTLS.CertFile, KeyFile: o.PeerTLS.KeyFile, TrustedCAFile: o.PeerTLS.CAFile, ClientCertAuth: true}
	}
	cfg.Logger = "zap"
	cfg.LogLevel = o.EtcdLogLevel
	cfg.LogOutputs = []string{embed.StdErrLogOutput}
	if o.EtcdLogQuiet {
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	} else if level, err := zapcore.ParseLevel(o.EtcdLogLevel); err == nil {
		// etcd's lines (logger=etcd) in the member's format, at the
		// level of --etcd-log-level and of --log-level.
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(logging.ZapAt(r.log, level).Named("etcd"))
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("etcd configuration: %w", err)
	}
	return cfg, nil
}

// runEtcd starts etcd and supervises it until ctx ends (nil) or it fails;
// a lost quorum it may recover (errForceNewCluster) starts it again as a
// cluster of one.
func (r *runner) runEtcd(ctx context.Context, cfg *embed.Config, joined bool) error {
	for {
		e, err := embed.StartEtcd(cfg)
		if err != nil {
			if joined {
				// A learner that never joined holds nothing: start afresh.
				r.wipe()
			}
			return fmt.Errorf("start etcd: %w", err)
		}
		r.board.set(stateStarted, uint64(e.Server.MemberID()), func() []member { return clusterMembers(e) })
		r.health.setEtcd(e)
		ready, err := r.supervise(ctx, e)
		r.health.setEtcd(nil)
		r.health.setReason("etcd stopped")
		if !ready {
			// Close waits for the client servers, which start only once
			// etcd is ready: stop the server first.
			e.Server.HardStop()
		}
		e.Close()
		if errors.Is(err, errForceNewCluster) {
			quorumRecoveries.Inc()
			cfg.ForceNewCluster = true
			joined = false
			continue
		}
		if err != nil && joined && !ready {
			r.wipe()
		}
		return err
	}
}

func clusterMembers(e *embed.Etcd) []member {
	ms := e.Server.Cluster().Members()
	out := make([]member, 0, len(ms))
	for _, m := range ms {
		out = append(out, member{ID: uint64(m.ID), Name: m.Name, PeerURLs: m.PeerURLs, ClientURLs: m.ClientURLs, Learner: m.IsLearner})
	}
	return out
}

// supervise runs next to etcd: once it is ready, the ID file, the
// promotion of a learner and the maintenance; all along, the watch for a
// lost quorum. It returns nil when ctx ends, etcd's error when it fails,
// errForceNewCluster to recover a quorum; ready says whether etcd became
// ready.
func (r *runner) supervise(ctx context.Context, e *embed.Etcd) (ready bool, err error) {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		select {
		case <-e.Server.ReadyNotify():
		case <-gctx.Done():
			return nil
		}
		ready = true
		id := uint64(e.Server.MemberID())
		r.writeID(id)
		r.log.Info("etcd member ready", "id", fmt.Sprintf("%x", id), "learner", e.Server.IsLearner())
		return r.afterReady(gctx, e, id)
	})
	g.Go(func() error { return r.watchQuorum(gctx, e) })
	g.Go(func() error {
		select {
		case err := <-e.Err():
			return fmt.Errorf("etcd: %w", err)
		case <-e.Server.StopNotify():
			return errors.New("etcd stopped (removed from the cluster?)")
		case <-gctx.Done():
			return nil
		}
	})
	err = g.Wait()
	return ready, err
}

// afterReady promotes a learner, then maintains the member until ctx
// ends.
func (r *runner) afterReady(ctx context.Context, e *embed.Etcd, id uint64) error {
	local, err := r.newClient([]string{r.o.AdvertiseClientURL})
	if err != nil {
		return err
	}
	defer local.Close()
	all := make([]string, len(r.p.peers))
	for i, pr := range r.p.peers {
		all[i] = r.p.clientURL(pr)
	}
	cluster, err := r.newClient(all)
	if err != nil {
		return err
	}
	defer cluster.Close()
	r.promote(ctx, cluster, id)
	t := time.NewTicker(r.o.MaintenancePeriod)
	defer t.Stop()
	for {
		r.maintain(ctx, e, local, cluster)
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil
		}
	}
}

// promote makes this member a voting member once it is in sync, if it
// joined as a learner.
func (r *runner) promote(ctx context.Context, cli *clientv3.Client, id uint64) {
	for {
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := cli.MemberList(lctx)
		if err == nil {
			learner := false
			for _, m := range resp.Members {
				if m.ID == id {
					learner = m.IsLearner
				}
			}
			if !learner {
				cancel()
				return
			}
			if _, err = cli.MemberPromote(lctx, id); err == nil {
				cancel()
				r.log.Info("promoted this member from learner to voting member", "id", fmt.Sprintf("%x", id))
				return
			}
		}
		cancel()
		r.every("promote", 30*time.Second, func() {
			r.log.Info("learner not promoted yet (catching up with the leader)", "error", err)
		})
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
			return
		}
	}
}

// watchQuorum returns errForceNewCluster when this member has seen no
// leader for RecoverQuorumAfter and every other member says its data is
// gone (recoverQuorum); nil when ctx ends.
func (r *runner) watchQuorum(ctx context.Context, e *embed.Etcd) error {
	after := r.o.RecoverQuorumAfter
	if after <= 0 || len(r.p.peers) <= 1 {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(min(5*time.Second, max(after/4, 100*time.Millisecond)))
	defer t.Stop()
	var since time.Time
	for {
		// A learner holds no quorum's data; a cluster of this member alone
		// (as after a forced start) elects itself.
		if e.Server.Leader() != 0 || e.Server.IsLearner() || len(e.Server.Cluster().Members()) <= 1 {
			since = time.Time{}
		} else {
			if since.IsZero() {
				since = time.Now()
			}
			if lost := time.Since(since); lost >= after {
				peers := r.othersOf(ctx, e)
				if recoverQuorum(lost, after, peers) {
					r.log.Error("no leader, and every other member's data is gone: starting again as a cluster of this member alone (--force-new-cluster); the others join it",
						"no_leader_for", lost.Round(time.Second).String(), "peers", peers)
					return errForceNewCluster
				}
				r.every("quorum", 30*time.Second, func() {
					r.log.Warn("no leader; waiting for the other members (a cluster of one is forced only when every other member's data is gone)",
						"no_leader_for", lost.Round(time.Second).String(), "peers", peers)
				})
			}
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil
		}
	}
}

// othersOf is every other member of e's cluster, by name, as
// recoverQuorum sees it.
func (r *runner) othersOf(ctx context.Context, e *embed.Etcd) map[string]other {
	statuses := r.peerStates(ctx)
	out := map[string]other{}
	self := uint64(e.Server.MemberID())
	for _, m := range clusterMembers(e) {
		if m.ID == self {
			continue
		}
		name := m.Name
		for _, u := range m.PeerURLs {
			if name == "" {
				name = r.p.byURL[u]
			}
		}
		if name == "" {
			name = fmt.Sprintf("member-%x", m.ID)
		}
		out[name] = other{Started: m.started(), State: statuses[name].State}
	}
	return out
}

// newClient is an etcd client of endpoints with the member's client TLS.
func (r *runner) newClient(endpoints []string) (*clientv3.Client, error) {
	cfg := clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
	if r.o.ClientTLS.set() {
		tc, err := transport.TLSInfo{CertFile: r.o.ClientTLS.CertFile, KeyFile: r.o.ClientTLS.KeyFile, TrustedCAFile: r.o.ClientTLS.CAFile}.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("etcd client TLS: %w", err)
		}
		cfg.TLS = tc
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd client of %s: %w", strings.Join(endpoints, ","), err)
	}
	return cli, nil
}

// every runs f at most once per period for key.
func (r *runner) every(key string, period time.Duration, f func()) {
	r.logMu.Lock()
	due := time.Since(r.lastLog[key]) >= period
	if due {
		r.lastLog[key] = time.Now()
	}
	r.logMu.Unlock()
	if due {
		f()
	}
}
