package coord

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"google.golang.org/grpc"

	"github.com/volplane/volplane/pkg/logging"
	"github.com/volplane/volplane/pkg/metrics"
)

// DefaultTTL is the session lease TTL: how long a crashed replica's
// membership and reservations outlive it.
const DefaultTTL = 10 * time.Second

// ErrReserved means another holder has the resource.
var ErrReserved = errors.New("reserved by another holder")

// ErrSessionLost means this replica's lease expired: everything it held in
// etcd is gone, and it must stop.
var ErrSessionLost = errors.New("etcd session lost")

// Options configures a Coordinator.
type Options struct {
	// Endpoints are etcd client URLs (required).
	Endpoints []string
	// Prefix is the root of every key; default "/volplane".
	Prefix string
	// TTL is the session lease TTL; default DefaultTTL.
	TTL time.Duration
	// DialTimeout bounds the first connection; default 10s.
	DialTimeout time.Duration
	// Logger receives warnings; default slog.Default().
	Logger *slog.Logger
	// Security is the client's TLS and etcd authentication; the zero value
	// is plaintext without authentication.
	Security Security
	// AlarmPeriod is how often a Keeper asks etcd for its alarms
	// (NOSPACE, CORRUPT); default DefaultAlarmPeriod.
	AlarmPeriod time.Duration
}

// KeepAliveTime is how long the etcd client's connection to a member may
// be silent before it pings; KeepAliveTimeout how long it then waits for
// the answer before it takes the connection for dead.
const (
	KeepAliveTime    = 10 * time.Second
	KeepAliveTimeout = 5 * time.Second
)

// DefaultAlarmPeriod is how often a Keeper asks etcd for its alarms.
const DefaultAlarmPeriod = 5 * time.Second

// Security is how the etcd client checks etcd and proves itself: TLS
// (etcd's CA, and a client certificate for an etcd run with
// --client-cert-auth) and etcd's own authentication (a user and its
// password).
type Security struct {
	// CAFile holds the CA certificates, PEM, that sign etcd's serving
	// certificate (--etcd-cacert). Setting it or CertFile turns TLS on;
	// the endpoints must then be https:// URLs.
	CAFile string
	// CertFile and KeyFile are the client certificate and key presented to
	// etcd (--etcd-cert, --etcd-key); they are read again at each new
	// connection, so they rotate without a restart.
	CertFile, KeyFile string
	// Username is the etcd user (--etcd-username) for an etcd with
	// authentication enabled.
	Username string
	// PasswordFile holds Username's password (--etcd-password-file); a
	// file, never a flag, so the password shows in no process list. A
	// trailing newline is ignored.
	PasswordFile string
}

// TLS reports whether s turns TLS on.
func (s Security) TLS() bool { return s.CAFile != "" || s.CertFile != "" || s.KeyFile != "" }

// Validate reports, all at once, what in s cannot work with endpoints
// (--etcd-endpoints), each error naming the flags to fix: a client
// certificate without its key or the reverse, TLS with endpoints that are
// not https://, a user without a password file or the reverse. The files
// themselves are read when the client is made.
func (s Security) Validate(endpoints []string) error {
	var errs []error
	if (s.CertFile == "") != (s.KeyFile == "") {
		errs = append(errs, errors.New("an etcd client certificate needs both --etcd-cert and --etcd-key"))
	}
	if s.TLS() {
		for _, ep := range endpoints {
			if !strings.HasPrefix(ep, "https://") {
				errs = append(errs, fmt.Errorf("etcd TLS (--etcd-cacert, --etcd-cert) needs https:// endpoints, got %q (--etcd-endpoints)", ep))
			}
		}
	}
	switch {
	case s.Username == "" && s.PasswordFile != "":
		errs = append(errs, errors.New("--etcd-password-file needs --etcd-username"))
	case s.Username != "" && s.PasswordFile == "":
		errs = append(errs, errors.New("--etcd-username needs --etcd-password-file"))
	}
	return errors.Join(errs...)
}

// apply sets the TLS and authentication of cfg from s.
func (s Security) apply(cfg *clientv3.Config) error {
	if err := s.Validate(cfg.Endpoints); err != nil {
		return fmt.Errorf("coord: %w", err)
	}
	if s.TLS() {
		tc, err := transport.TLSInfo{TrustedCAFile: s.CAFile, CertFile: s.CertFile, KeyFile: s.KeyFile}.ClientConfig()
		if err != nil {
			return fmt.Errorf("coord: etcd TLS (--etcd-cacert, --etcd-cert, --etcd-key): %w", err)
		}
		tc.MinVersion = tls.VersionTLS12
		cfg.TLS = tc
		s.recordCertificates()
	}
	if s.Username != "" {
		b, err := os.ReadFile(s.PasswordFile)
		if err != nil {
			return fmt.Errorf("coord: etcd password (--etcd-password-file): %w", err)
		}
		cfg.Username, cfg.Password = s.Username, strings.TrimRight(string(b), "\r\n")
	}
	return nil
}

// certsRecorded holds the client certificate files whose expiry is
// already refreshed at each scrape, so that reconnecting registers no
// second refresher.
var certsRecorded sync.Map

// recordCertificates publishes the etcd client certificate's and CA's
// notAfter (volplane_certificate_expiry_timestamp_seconds, roles
// etcd-client and etcd-ca). etcd's client reads the CA once, here, and
// the client certificate at each handshake: the CA is recorded now, the
// certificate again from its file at each scrape.
func (s Security) recordCertificates() {
	if s.CAFile != "" {
		metrics.SetCertificatesFromFile(metrics.RoleEtcdCA, s.CAFile)
	}
	if s.CertFile == "" {
		return
	}
	metrics.SetCertificatesFromFile(metrics.RoleEtcdClient, s.CertFile)
	if _, loaded := certsRecorded.LoadOrStore(s.CertFile, true); !loaded {
		file := s.CertFile
		metrics.RefreshCertificatesWith(func() { metrics.SetCertificatesFromFile(metrics.RoleEtcdClient, file) })
	}
}

// Member is one live replica of a service.
type Member struct {
	ID      string
	Address string
}

// Coordinator is one replica's session with etcd.
type Coordinator struct {
	client  *clientv3.Client
	session *concurrency.Session
	prefix  string
	log     *slog.Logger
}

// New connects to etcd and opens a session (a lease kept alive in the
// background).
func New(ctx context.Context, o Options) (*Coordinator, error) {
	client, err := newClient(ctx, &o)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, o.DialTimeout)
	defer cancel()
	session, err := concurrency.NewSession(client, concurrency.WithTTL(int(o.TTL.Round(time.Second)/time.Second)), concurrency.WithContext(context.WithoutCancel(ctx)))
	if err == nil && sctx.Err() != nil {
		err = sctx.Err()
	}
	if err != nil {
		client.Close()
		return nil, fmt.Errorf("open etcd session at %s: %w", strings.Join(o.Endpoints, ","), err)
	}
	return &Coordinator{client: client, session: session, prefix: strings.TrimSuffix(o.Prefix, "/"), log: o.Logger}, nil
}

// newClient fills in o's defaults and makes an etcd client (which connects
// in the background).
func newClient(ctx context.Context, o *Options) (*clientv3.Client, error) {
	if len(o.Endpoints) == 0 {
		return nil, errors.New("coord: no etcd endpoints (--etcd-endpoints)")
	}
	if o.Prefix == "" {
		o.Prefix = "/volplane"
	}
	if o.TTL == 0 {
		o.TTL = DefaultTTL
	}
	if o.TTL < time.Second {
		return nil, fmt.Errorf("coord: lease TTL must be at least 1s, got %s", o.TTL)
	}
	if o.DialTimeout == 0 {
		o.DialTimeout = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	cfg := clientv3.Config{
		Endpoints:   o.Endpoints,
		DialTimeout: o.DialTimeout,
		// A member whose node lost its power answers nothing, and no RST
		// ever comes: without pings the connection to it looks alive for
		// good, and every request, lease keep-alive and watch on it hangs
		// (make chaos-cluster found a replica's watches and requests stuck
		// that way for minutes after the node was back). The pings find it
		// dead within KeepAliveTime+KeepAliveTimeout, and the client moves
		// to another member. etcd refuses pings more often than every 5s
		// (--grpc-keepalive-min-time).
		DialKeepAliveTime:    KeepAliveTime,
		DialKeepAliveTimeout: KeepAliveTimeout,
		Context:              context.WithoutCancel(ctx),
		DialOptions:          []grpc.DialOption{grpc.WithChainUnaryInterceptor(timeRequests)},
		// The client's own lines (logger=etcd-client) go through the
		// replica's logger; its per-retry warnings at Debug, the outage
		// being the Keeper's to report.
		Logger: logging.EtcdClient(o.Logger),
	}
	if err := o.Security.apply(&cfg); err != nil {
		return nil, err
	}
	client, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to etcd %s: %w", strings.Join(o.Endpoints, ","), err)
	}
	return client, nil
}

// Client is the underlying etcd client.
func (c *Coordinator) Client() *clientv3.Client { return c.client }

// Lease is the session's lease ID.
func (c *Coordinator) Lease() clientv3.LeaseID { return c.session.Lease() }

// Done is closed when the session's lease is lost (expired or revoked).
func (c *Coordinator) Done() <-chan struct{} { return c.session.Done() }

// Close revokes the lease, so membership and reservations go at once, and
// closes the client.
func (c *Coordinator) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _ = c.client.Revoke(ctx, c.session.Lease())
	_ = c.session.Close()
	return c.client.Close()
}

func (c *Coordinator) memberPrefix(service string) string {
	return c.prefix + "/members/" + service + "/"
}

// Register announces this replica as a member of service at addr, for as
// long as the session lives.
func (c *Coordinator) Register(ctx context.Context, service, id, addr string) error {
	if service == "" || id == "" || strings.Contains(id, "/") {
		return fmt.Errorf("coord: invalid member %q of service %q", id, service)
	}
	if _, err := c.client.Put(ctx, c.memberPrefix(service)+id, addr, clientv3.WithLease(c.session.Lease())); err != nil {
		return fmt.Errorf("register %s member %s in etcd: %w", service, id, err)
	}
	return nil
}

// Members lists the live members of service, sorted by ID.
func (c *Coordinator) Members(ctx context.Context, service string) ([]Member, error) {
	resp, err := c.client.Get(ctx, c.memberPrefix(service), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("list %s members in etcd: %w", service, err)
	}
	return c.members(service, resp.Kvs), nil
}

func (c *Coordinator) members(service string, kvs []*mvccpb.KeyValue) []Member {
	p := c.memberPrefix(service)
	ms := make([]Member, 0, len(kvs))
	for _, kv := range kvs {
		ms = append(ms, Member{ID: strings.TrimPrefix(string(kv.Key), p), Address: string(kv.Value)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].ID < ms[j].ID })
	return ms
}

// WatchMembers calls fn with the full member list of service now and after
// every change, until ctx ends or the watch fails.
func (c *Coordinator) WatchMembers(ctx context.Context, service string, fn func([]Member)) error {
	p := c.memberPrefix(service)
	for {
		resp, err := c.client.Get(ctx, p, clientv3.WithPrefix())
		if err != nil {
			return fmt.Errorf("list %s members in etcd: %w", service, err)
		}
		cur := make(map[string]string, len(resp.Kvs))
		for _, kv := range resp.Kvs {
			cur[string(kv.Key)] = string(kv.Value)
		}
		emit := func() {
			ms := make([]Member, 0, len(cur))
			for k, v := range cur {
				ms = append(ms, Member{ID: strings.TrimPrefix(k, p), Address: v})
			}
			sort.Slice(ms, func(i, j int) bool { return ms[i].ID < ms[j].ID })
			fn(ms)
		}
		emit()
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		wc := c.client.Watch(wctx, p, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
		for wr := range wc {
			if err := wr.Err(); err != nil {
				c.log.Warn("member watch broken; listing again", "service", service, "error", err)
				break
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete {
					delete(cur, string(ev.Kv.Key))
				} else {
					cur[string(ev.Kv.Key)] = string(ev.Kv.Value)
				}
			}
			emit()
		}
		cancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (c *Coordinator) reservationKey(resource string) string {
	return c.prefix + "/reservations/" + resource
}

// Reserve takes resource for holder, on this session's lease. Taking a
// resource the same holder already has succeeds; one another holder has
// fails with ErrReserved. The write is fenced on the lease: with a lost
// session it fails with ErrSessionLost.
func (c *Coordinator) Reserve(ctx context.Context, resource, holder string) error {
	errs, err := c.ReserveAll(ctx, []Reservation{{Resource: resource, Holder: holder}})
	if err != nil {
		return err
	}
	return errs[0]
}

// MaxReserveBatch is the most reservations ReserveAll takes at once, as
// MaxReleaseBatch.
const MaxReserveBatch = MaxReleaseBatch

// ReserveAll is Reserve of up to MaxReserveBatch reservations of distinct
// resources in one etcd transaction: each is taken, or refused, on its
// own, exactly as Reserve would (errs[i] is Reserve's answer for rs[i]).
// err is for the transaction as a whole (etcd unreachable, a lost
// session): then nothing was taken.
func (c *Coordinator) ReserveAll(ctx context.Context, rs []Reservation) (errs []error, err error) {
	if len(rs) > MaxReserveBatch {
		return nil, fmt.Errorf("reserve %d resources in one transaction: at most %d", len(rs), MaxReserveBatch)
	}
	select {
	case <-c.session.Done():
		return nil, ErrSessionLost
	default:
	}
	lease := c.session.Lease()
	ops := make([]clientv3.Op, len(rs))
	seen := make(map[string]bool, len(rs))
	for i, r := range rs {
		key := c.reservationKey(r.Resource)
		if seen[key] {
			// etcd refuses a key written twice in one transaction.
			return nil, fmt.Errorf("reserve %s twice in one transaction", r.Resource)
		}
		seen[key] = true
		ops[i] = clientv3.OpTxn(
			[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0)},
			[]clientv3.Op{clientv3.OpPut(key, r.Holder, clientv3.WithLease(lease))},
			[]clientv3.Op{clientv3.OpGet(key)})
	}
	if len(ops) == 0 {
		return nil, nil
	}
	resp, err := c.client.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return nil, ErrSessionLost
		}
		if len(rs) == 1 {
			return nil, fmt.Errorf("reserve %s in etcd: %w", rs[0].Resource, err)
		}
		return nil, fmt.Errorf("reserve %d resources in etcd: %w", len(rs), err)
	}
	errs = make([]error, len(rs))
	for i, r := range rs {
		sub := resp.Responses[i].GetResponseTxn()
		if sub.GetSucceeded() {
			continue
		}
		var kvs []*mvccpb.KeyValue
		if rr := sub.GetResponses(); len(rr) == 1 {
			kvs = rr[0].GetResponseRange().GetKvs()
		}
		switch {
		case len(kvs) == 1 && string(kvs[0].Value) == r.Holder:
			// The same holder (e.g. the same claim, synced again or by a
			// replica that just took over its shard) may go on.
		case len(kvs) == 1:
			errs[i] = fmt.Errorf("%s: %w %q", r.Resource, ErrReserved, string(kvs[0].Value))
		default:
			errs[i] = fmt.Errorf("%s: %w", r.Resource, ErrReserved)
		}
	}
	return errs, nil
}

// Release drops holder's reservation of resource; a reservation another
// holder has is left alone.
func (c *Coordinator) Release(ctx context.Context, resource, holder string) error {
	key := c.reservationKey(resource)
	_, err := c.client.Txn(ctx).
		If(clientv3.Compare(clientv3.Value(key), "=", holder)).
		Then(clientv3.OpDelete(key)).
		Commit()
	if err != nil {
		return fmt.Errorf("release %s in etcd: %w", resource, err)
	}
	return nil
}

// Reservation is a resource and who holds it, for ReleaseAll.
type Reservation struct{ Resource, Holder string }

// MaxReleaseBatch is the most reservations ReleaseAll takes at once: below
// etcd's default limit of 128 operations in a transaction.
const MaxReleaseBatch = 100

// ReleaseAll is Release of up to MaxReleaseBatch reservations in one etcd
// transaction: each is deleted only while its holder still has it, the
// others are left as they are. A resource given twice with two holders
// (released by one, taken and released by the next within one batch) is
// released for the second in a following transaction: etcd refuses a key
// twice in one, and either may hold it now.
func (c *Coordinator) ReleaseAll(ctx context.Context, rs []Reservation) error {
	if len(rs) > MaxReleaseBatch {
		return fmt.Errorf("release %d reservations in one transaction: at most %d", len(rs), MaxReleaseBatch)
	}
	ops := make([]clientv3.Op, 0, len(rs))
	seen := make(map[string]string, len(rs)) // key → holder
	var again []Reservation
	for _, r := range rs {
		key := c.reservationKey(r.Resource)
		if h, ok := seen[key]; ok {
			if h != r.Holder {
				again = append(again, r)
			}
			continue // etcd refuses a key twice in one transaction
		}
		seen[key] = r.Holder
		ops = append(ops, clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.Value(key), "=", r.Holder)}, []clientv3.Op{clientv3.OpDelete(key)}, nil))
	}
	if len(ops) == 0 {
		return nil
	}
	if _, err := c.client.Txn(ctx).Then(ops...).Commit(); err != nil {
		return fmt.Errorf("release %d reservations in etcd: %w", len(ops), err)
	}
	return c.ReleaseAll(ctx, again)
}

// Holder returns who has resource reserved, or "" when nobody does.
func (c *Coordinator) Holder(ctx context.Context, resource string) (string, error) {
	resp, err := c.client.Get(ctx, c.reservationKey(resource))
	if err != nil {
		return "", fmt.Errorf("read reservation %s in etcd: %w", resource, err)
	}
	if len(resp.Kvs) == 0 {
		return "", nil
	}
	return string(resp.Kvs[0].Value), nil
}

// DefaultMemberID names a replica that was given no ID: the host name (the
// pod name in Kubernetes) and a random suffix, so that a restarted replica
// never shares an ID with its predecessor's still-live lease.
func DefaultMemberID() string {
	host, _ := os.Hostname()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return host + "-" + hex.EncodeToString(b)
}

// Wait blocks until ctx ends (nil) or the session is lost (an error): run
// it next to a replica's work so that the replica stops when its lease,
// and with it its membership and reservations, is gone.
func (c *Coordinator) Wait(ctx context.Context) error {
	select {
	case <-c.Done():
		return fmt.Errorf("%w: stopping so that no exclusive work continues without its lease", ErrSessionLost)
	case <-ctx.Done():
		return nil
	}
}
