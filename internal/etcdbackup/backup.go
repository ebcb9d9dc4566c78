// Package etcdbackup backs volplane's etcd up and restores it
// (cmd/volplane-etcd-backup): Save takes a snapshot through etcd's
// Snapshot API into a directory and keeps the newest few; Restore writes
// the keys a snapshot holds into a running cluster (a new one, after the
// loss of every member), each only where the cluster has no such key,
// leased keys on new leases of their old TTL. docs/etcd.md says why the
// restore is by keys rather than by data directories, and the steps.
package etcdbackup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/snapshot"
	"go.uber.org/zap"
)

// DefaultKeep is how many snapshots Save keeps.
const DefaultKeep = 7

// filePrefix and fileSuffix name the snapshots Save writes (and prunes):
// volplane-etcd-<UTC time>.db, which sort by time.
const (
	filePrefix = "volplane-etcd-"
	fileSuffix = ".db"
)

// Client is how to reach etcd.
type Client struct {
	// Endpoints are etcd's client URLs (--etcd-endpoints).
	Endpoints []string
	// CAFile, CertFile and KeyFile are the client TLS (--etcd-cacert,
	// --etcd-cert, --etcd-key); all empty is plaintext.
	CAFile, CertFile, KeyFile string
}

func (c Client) config(endpoints []string) (clientv3.Config, error) {
	cfg := clientv3.Config{Endpoints: endpoints, DialTimeout: 10 * time.Second, Logger: zap.NewNop()}
	if c.CAFile != "" || c.CertFile != "" || c.KeyFile != "" {
		tc, err := transport.TLSInfo{TrustedCAFile: c.CAFile, CertFile: c.CertFile, KeyFile: c.KeyFile}.ClientConfig()
		if err != nil {
			return cfg, fmt.Errorf("etcd client TLS: %w", err)
		}
		cfg.TLS = tc
	}
	return cfg, nil
}

// Options configure Save and Run.
type Options struct {
	Client
	// Dir receives the snapshots (--dir): a volume the operator chooses.
	Dir string
	// Secret receives an export of volplane's keys (--secret): no
	// volume, so nothing that volplane must bind first.
	Secret SecretTarget
	// Keep is how many snapshots to keep, newest first (--keep); default
	// DefaultKeep.
	Keep int
	// Interval between snapshots for Run (--interval); 0 takes one and
	// returns (a CronJob's run).
	Interval time.Duration
	Logger   *slog.Logger
}

func (o *Options) defaults() error {
	if len(o.Endpoints) == 0 {
		return errors.New("no etcd endpoints (--etcd-endpoints)")
	}
	if o.Dir == "" && o.Secret.Name == "" {
		return errors.New("nowhere to back up to: give a directory for snapshots (--dir), a Secret for an export of the keys (--secret), or both")
	}
	if o.Keep <= 0 {
		o.Keep = DefaultKeep
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return nil
}

// Run takes a snapshot now and then every Interval until ctx ends (once
// when Interval is 0). A failed snapshot is an error only when Interval
// is 0; a loop logs it and tries again at the next turn.
func Run(ctx context.Context, o Options) error {
	if err := o.defaults(); err != nil {
		return err
	}
	for {
		err := saveOnce(ctx, o)
		if o.Interval <= 0 {
			return err
		}
		if err != nil {
			o.Logger.Error("etcd snapshot failed; trying again at the next turn", "error", err, "next_in", o.Interval.String())
		}
		select {
		case <-time.After(o.Interval):
		case <-ctx.Done():
			return nil
		}
	}
}

// saveOnce takes a snapshot into Dir and an export into the Secret, each
// when configured; both are tried when one fails.
func saveOnce(ctx context.Context, o Options) error {
	var errs []error
	if o.Dir != "" {
		if _, err := Save(ctx, o); err != nil {
			errs = append(errs, err)
		}
	}
	if o.Secret.Name != "" {
		if err := SaveExport(ctx, o); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// SaveExport reads volplane's keys (ExportKeys, "/volplane/") and writes
// them into the Secret.
func SaveExport(ctx context.Context, o Options) error {
	cfg, err := o.config(o.Endpoints)
	if err != nil {
		return err
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return fmt.Errorf("connect to etcd %s: %w", strings.Join(o.Endpoints, ","), err)
	}
	defer cli.Close()
	began := time.Now()
	ectx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	e, err := ExportKeys(ectx, cli, "/volplane/")
	if err != nil {
		return err
	}
	n, err := saveExport(ectx, o.Secret, e)
	if err != nil {
		return err
	}
	o.Logger.Info("etcd keys exported", "secret", o.Secret.Namespace+"/"+o.Secret.Name, "revision", e.Revision,
		"keys", len(e.Keys), "leases", len(e.TTLs), "bytes", n, "took", time.Since(began).Round(time.Millisecond).String())
	return nil
}

// Save takes one snapshot from the first endpoint that gives one, writes
// it to Dir (never under its final name until it is complete and its
// checksum checked), then removes all but the Keep newest.
func Save(ctx context.Context, o Options) (string, error) {
	if err := o.defaults(); err != nil {
		return "", err
	}
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return "", err
	}
	path := filepath.Join(o.Dir, filePrefix+time.Now().UTC().Format("20060102T150405.000Z")+fileSuffix)
	var errs []error
	for _, ep := range o.Endpoints {
		cfg, err := o.config([]string{ep})
		if err != nil {
			return "", err
		}
		// A member that does not answer at once is skipped: the Snapshot
		// stream would wait for it.
		if err := answers(ctx, cfg, ep); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", ep, err))
			continue
		}
		began := time.Now()
		sctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
		version, err := snapshot.SaveWithVersion(sctx, zap.NewNop(), cfg, path)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", ep, err))
			continue
		}
		st, _ := os.Stat(path)
		var size int64
		if st != nil {
			size = st.Size()
		}
		o.Logger.Info("etcd snapshot saved", "path", path, "endpoint", ep, "etcd_version", version, "bytes", size, "took", time.Since(began).Round(time.Millisecond).String())
		if err := prune(o.Dir, o.Keep, o.Logger); err != nil {
			o.Logger.Warn("cannot remove old snapshots", "dir", o.Dir, "error", err)
		}
		return path, nil
	}
	return "", fmt.Errorf("no etcd member gave a snapshot: %w", errors.Join(errs...))
}

// answers checks that endpoint ep answers a Status within 10s.
func answers(ctx context.Context, cfg clientv3.Config, ep string) error {
	cli, err := clientv3.New(cfg)
	if err != nil {
		return err
	}
	defer cli.Close()
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = cli.Status(sctx, ep)
	return err
}

// Snapshots lists the snapshots in dir, oldest first.
func Snapshots(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if n := e.Name(); !e.IsDir() && strings.HasPrefix(n, filePrefix) && strings.HasSuffix(n, fileSuffix) {
			out = append(out, filepath.Join(dir, n))
		}
	}
	sort.Strings(out)
	return out, nil
}

func prune(dir string, keep int, log *slog.Logger) error {
	all, err := Snapshots(dir)
	if err != nil {
		return err
	}
	for len(all) > keep {
		if err := os.Remove(all[0]); err != nil {
			return err
		}
		log.Info("old etcd snapshot removed", "path", all[0])
		all = all[1:]
	}
	return nil
}
