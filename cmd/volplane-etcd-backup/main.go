// Command volplane-etcd-backup snapshots volplane's etcd into a directory
// and keeps the newest few (once, as a CronJob runs it, or every
// --interval), or, with --restore, writes a snapshot's keys back into a
// running cluster where they are missing. See internal/etcdbackup and
// docs/etcd.md.
package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/volplane/volplane/internal/etcdbackup"
	"github.com/volplane/volplane/pkg/cmdutil"
)

const description = `volplane-etcd-backup snapshots volplane's etcd into a directory and keeps
the newest few: once, as a CronJob runs it, or every --interval. With --restore it writes a
snapshot's keys back into a running cluster where they are missing. See docs/etcd.md.`

func main() {
	var (
		o       etcdbackup.Options
		restore etcdbackup.RestoreOptions
	)
	cmd := cmdutil.NewCommand("volplane-etcd-backup", description)
	b := cmd.Flags("Backup")
	fs := cmd.Flags(cmdutil.GroupEtcd)
	o.Endpoints = nil
	cmdutil.ListFlag(fs, &o.Endpoints, "etcd-endpoints", "etcd client URLs, comma separated: a snapshot is taken from the first that answers")
	fs.StringVar(&o.CAFile, "etcd-cacert", "", "CA certificates (PEM) that sign etcd's serving certificate")
	fs.StringVar(&o.CertFile, "etcd-cert", "", "client certificate (PEM) presented to etcd")
	fs.StringVar(&o.KeyFile, "etcd-key", "", "private key (PEM) of --etcd-cert")
	b.StringVar(&o.Dir, "dir", "", "directory the snapshots are written to, volplane-etcd-<UTC time>.db (a volume the operator chooses)")
	b.IntVar(&o.Keep, "keep", etcdbackup.DefaultKeep, "how many snapshots to keep, the newest")
	b.DurationVar(&o.Interval, "interval", 0, "take a snapshot every interval (0: one, then exit, as a CronJob runs it)")
	b.StringVar(&restore.Snapshot, "restore", "", "instead of a snapshot, write this snapshot's keys into the cluster where it has none")
	b.StringVar(&restore.Prefix, "prefix", "/volplane/", "with --restore: restore only the keys under this prefix")
	logging := cmd.LogFlags()
	os.Exit(cmd.Run(logging, func(ctx context.Context, log *slog.Logger) error {
		o.Logger = log
		if restore.Snapshot == "" {
			return etcdbackup.Run(ctx, o)
		}
		restore.Client, restore.Logger = o.Client, log
		_, err := etcdbackup.Restore(ctx, restore)
		return err
	}))
}
