// Command volplane-etcd-backup snapshots volplane's etcd into a directory
// and keeps the newest few (once, as a CronJob runs it, or every
// --interval), or, with --restore, writes a snapshot's keys back into a
// running cluster where they are missing. See internal/etcdbackup and
// docs/etcd.md.
package main

import (
	"context"
	"flag"
	"log/slog"
	"os"

	"github.com/volplane/volplane/internal/etcdbackup"
	"github.com/volplane/volplane/pkg/cmdutil"
)

func main() {
	var (
		o       etcdbackup.Options
		restore etcdbackup.RestoreOptions
	)
	o.Endpoints = nil
	cmdutil.ListFlag(&o.Endpoints, "etcd-endpoints", "etcd client URLs, comma separated: a snapshot is taken from the first that answers")
	flag.StringVar(&o.CAFile, "etcd-cacert", "", "CA certificates (PEM) that sign etcd's serving certificate")
	flag.StringVar(&o.CertFile, "etcd-cert", "", "client certificate (PEM) presented to etcd")
	flag.StringVar(&o.KeyFile, "etcd-key", "", "private key (PEM) of --etcd-cert")
	flag.StringVar(&o.Dir, "dir", "", "directory the snapshots are written to, volplane-etcd-<UTC time>.db (a volume the operator chooses)")
	flag.IntVar(&o.Keep, "keep", etcdbackup.DefaultKeep, "how many snapshots to keep, the newest")
	flag.DurationVar(&o.Interval, "interval", 0, "take a snapshot every interval (0: one, then exit, as a CronJob runs it)")
	flag.StringVar(&restore.Snapshot, "restore", "", "instead of a snapshot, write this snapshot's keys into the cluster where it has none")
	flag.StringVar(&restore.Prefix, "prefix", "/volplane/", "with --restore: restore only the keys under this prefix")
	logging := cmdutil.LogFlags()
	flag.Parse()
	os.Exit(cmdutil.Run("volplane-etcd-backup", logging, func(ctx context.Context, log *slog.Logger) error {
		o.Logger = log
		if restore.Snapshot == "" {
			return etcdbackup.Run(ctx, o)
		}
		restore.Client, restore.Logger = o.Client, log
		_, err := etcdbackup.Restore(ctx, restore)
		return err
	}))
}
