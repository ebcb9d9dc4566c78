package etcdmember

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/volplane/volplane/test/harness/pki"
)

// logSink collects the log of every member of a test.
type logSink struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *logSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *logSink) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// lines are the log lines containing every one of words.
func (s *logSink) lines(words ...string) []string {
	var out []string
	for _, l := range strings.Split(s.String(), "\n") {
		all := l != ""
		for _, w := range words {
			all = all && strings.Contains(l, w)
		}
		if all {
			out = append(out, l)
		}
	}
	return out
}

// testCluster is a cluster of members run by Run in this process, each
// on its own loopback address (127.0.0.1, .2, .3) with the same ports, as
// pods have the same ports on their own addresses; peers and clients
// talk TLS with certificates of one CA, as in deploy/kubernetes.
type testCluster struct {
	t       *testing.T
	dir     string
	tls     TLSFiles
	names   []string
	hosts   []string
	ports   struct{ client, peer, status, metrics int }
	log     *logSink
	tune    func(*Options)
	mu      sync.Mutex
	running map[int]*running
}

type running struct {
	cancel context.CancelFunc
	done   chan error
}

func newTestCluster(t *testing.T, n int, tune func(*Options)) *testCluster {
	t.Helper()
	c := &testCluster{t: t, dir: t.TempDir(), log: &logSink{}, tune: tune, running: map[int]*running{}}
	for i := 0; i < n; i++ {
		c.names = append(c.names, fmt.Sprintf("etcd-%d", i))
		c.hosts = append(c.hosts, fmt.Sprintf("127.0.0.%d", i+1))
	}
	ca, err := pki.NewCA(filepath.Join(c.dir, "ca"), "etcd-test-ca")
	if err != nil {
		t.Fatal(err)
	}
	f, err := ca.Issue("etcd", c.hosts...)
	if err != nil {
		t.Fatal(err)
	}
	c.tls = TLSFiles{CAFile: f.CAFile, CertFile: f.CertFile, KeyFile: f.KeyFile}
	ports := freePorts(t, c.hosts, 4)
	c.ports.client, c.ports.peer, c.ports.status, c.ports.metrics = ports[0], ports[1], ports[2], ports[3]
	t.Cleanup(func() {
		c.mu.Lock()
		idx := make([]int, 0, len(c.running))
		for i := range c.running {
			idx = append(idx, i)
		}
		c.mu.Unlock()
		for _, i := range idx {
			c.stop(i)
		}
		if t.Failed() {
			t.Logf("members' log:\n%s", tail(c.log.String(), 20000))
		}
	})
	return c
}

func tail(s string, n int) string {
	if len(s) > n {
		return "...\n" + s[len(s)-n:]
	}
	return s
}

// freePorts finds n ports free on every host.
func freePorts(t *testing.T, hosts []string, n int) []int {
	t.Helper()
	var out []int
	for len(out) < n {
		l, err := net.Listen("tcp", hosts[0]+":0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		ok := true
		var ls []net.Listener
		for _, h := range hosts[1:] {
			o, err := net.Listen("tcp", net.JoinHostPort(h, strconv.Itoa(port)))
			if err != nil {
				ok = false
				break
			}
			ls = append(ls, o)
		}
		for _, o := range ls {
			o.Close()
		}
		l.Close()
		if ok && !containsInt(out, port) {
			out = append(out, port)
		}
	}
	return out
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func (c *testCluster) url(scheme string, i, port int) string {
	return fmt.Sprintf("%s://%s:%d", scheme, c.hosts[i], port)
}

func (c *testCluster) dataDir(i int) string { return filepath.Join(c.dir, c.names[i], "data") }

func (c *testCluster) clientURLs() []string {
	out := make([]string, len(c.names))
	for i := range c.names {
		out[i] = c.url("https", i, c.ports.client)
	}
	return out
}

func (c *testCluster) metricsURL(i int) string { return c.url("http", i, c.ports.metrics) }

func (c *testCluster) options(i int) Options {
	var initial []string
	for j, n := range c.names {
		initial = append(initial, n+"="+c.url("https", j, c.ports.peer))
	}
	o := Options{
		Name:               c.names[i],
		DataDir:            c.dataDir(i),
		InitialCluster:     strings.Join(initial, ","),
		ListenClientURLs:   []string{c.url("https", i, c.ports.client)},
		AdvertiseClientURL: c.url("https", i, c.ports.client),
		ListenPeerURLs:     []string{c.url("https", i, c.ports.peer)},
		ListenMetricsURLs:  []string{c.metricsURL(i)},
		StatusPort:         c.ports.status,
		ClientTLS:          c.tls,
		PeerTLS:            c.tls,
		// A loaded shared machine: elections must not fire on a hiccup.
		HeartbeatInterval:  200 * time.Millisecond,
		ElectionTimeout:    3 * time.Second,
		MaintenancePeriod:  500 * time.Millisecond,
		DefragSlot:         time.Second,
		RecoverQuorumAfter: 0,
		EtcdLogQuiet:       true,
		UnsafeNoFsync:      true,
		Logger:             slog.New(slog.NewTextHandler(c.log, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if c.tune != nil {
		c.tune(&o)
	}
	return o
}

// start runs member i (its data directory as it is).
func (c *testCluster) start(i int) {
	c.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan error, 1)}
	c.mu.Lock()
	if c.running[i] != nil {
		c.mu.Unlock()
		c.t.Fatalf("%s runs already", c.names[i])
	}
	c.running[i] = r
	c.mu.Unlock()
	o := c.options(i)
	go func() { r.done <- Run(ctx, o) }()
}

// stop stops member i, as a pod's SIGTERM does.
func (c *testCluster) stop(i int) {
	c.mu.Lock()
	r := c.running[i]
	delete(c.running, i)
	c.mu.Unlock()
	if r == nil {
		return
	}
	r.cancel()
	select {
	case err := <-r.done:
		if err != nil {
			c.t.Logf("%s stopped: %v", c.names[i], err)
		}
	case <-time.After(30 * time.Second):
		c.t.Errorf("%s did not stop within 30s", c.names[i])
	}
}

// wipe removes member i's data, as the loss of its pod's emptyDir does.
func (c *testCluster) wipe(i int) {
	c.t.Helper()
	if err := os.RemoveAll(filepath.Dir(c.dataDir(i))); err != nil {
		c.t.Fatal(err)
	}
}

// exited fails the test when a member's Run has returned.
func (c *testCluster) exited() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, r := range c.running {
		select {
		case err := <-r.done:
			r.done <- err
			return fmt.Sprintf("%s exited: %v", c.names[i], err)
		default:
		}
	}
	return ""
}

func (c *testCluster) client() *clientv3.Client {
	c.t.Helper()
	cli, err := (&runner{o: Options{ClientTLS: c.tls}}).newClient(c.clientURLs())
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { cli.Close() })
	return cli
}

// healthy is "" once the cluster lists want voting members, each started,
// each answering its status, with a leader; else what is missing.
func (c *testCluster) healthy(cli *clientv3.Client, want int) string {
	if s := c.exited(); s != "" {
		c.t.Fatal(s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ms, err := cli.MemberList(ctx)
	if err != nil {
		return "member list: " + err.Error()
	}
	if len(ms.Members) != want {
		return fmt.Sprintf("%d members, want %d", len(ms.Members), want)
	}
	for _, m := range ms.Members {
		if m.Name == "" || m.IsLearner || len(m.ClientURLs) == 0 {
			return fmt.Sprintf("member %x (%q) not a started voter (learner %v)", m.ID, m.Name, m.IsLearner)
		}
		st, err := cli.Status(ctx, m.ClientURLs[0])
		if err != nil {
			return fmt.Sprintf("member %s: %v", m.Name, err)
		}
		if st.Leader == 0 {
			return fmt.Sprintf("member %s sees no leader", m.Name)
		}
	}
	return ""
}

// memberID is the cluster's ID for member name, 0 when not listed.
func memberID(t *testing.T, cli *clientv3.Client, name string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ms, err := cli.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms.Members {
		if m.Name == name {
			return m.ID
		}
	}
	return 0
}

// eventually polls cond (which says what is still missing, "" when done)
// until timeout.
func eventually(t *testing.T, timeout time.Duration, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		if last = cond(); last == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", timeout, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
