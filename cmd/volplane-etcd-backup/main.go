// Command volplane-etcd-backup backs volplane's etcd up: an export of its
// keys into a Secret (--secret, what the manifests run by default) and/or
// snapshots into a directory, keeping the newest few (once, as a CronJob
// runs it, or every --interval). With --restore or --restore-secret it
// writes a snapshot's or an export's keys back into a running cluster
// where they are missing. See internal/etcdbackup and docs/etcd.md.
package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/volplane/volplane/internal/etcdbackup"
	"github.com/volplane/volplane/pkg/cmdutil"
	"github.com/volplane/volplane/pkg/kube"
)

const description = `volplane-etcd-backup backs volplane's etcd up: an export of its keys into a
Secret (--secret) and/or snapshots into a directory (--dir), keeping the newest few; once, as
a CronJob runs it, or every --interval. With --restore (a snapshot file) or --restore-secret
(a Secret's export) it writes the keys back into a running cluster where they are missing.
See docs/etcd.md.`

func main() {
	var (
		o       etcdbackup.Options
		restore etcdbackup.RestoreOptions
		kc      kube.ClientOptions
		secret  string
		from    string
		ns      string
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
	b.StringVar(&secret, "secret", "", "Secret an export of volplane's keys is written to (the newest and the one before; it must exist)")
	b.StringVar(&ns, "secret-namespace", "", "namespace of --secret and --restore-secret; empty: $POD_NAMESPACE, else volplane-system")
	b.DurationVar(&o.Interval, "interval", 0, "back up every interval (0: once, then exit, as a CronJob runs it)")
	b.StringVar(&restore.Snapshot, "restore", "", "instead of a backup, write this snapshot file's keys into the cluster where it has none")
	b.StringVar(&from, "restore-secret", "", "instead of a backup, write the newest export of this Secret into the cluster where it has none")
	b.BoolVar(&restore.Previous, "restore-previous", false, "with --restore-secret: the export before the newest")
	b.StringVar(&restore.Prefix, "prefix", "/volplane/", "with --restore or --restore-secret: restore only the keys under this prefix")
	cmd.Flags(cmdutil.GroupKube).StringVar(&kc.Kubeconfig, "kubeconfig", "", "path to a kubeconfig, for --secret and --restore-secret; empty: the files $KUBECONFIG lists, else ~/.kube/config, else the in-cluster configuration")
	logging := cmd.LogFlags()
	os.Exit(cmd.Run(logging, func(ctx context.Context, log *slog.Logger) error {
		o.Logger = log
		if secret != "" || from != "" {
			kc.UserAgent = "volplane-etcd-backup"
			cli, _, err := kube.NewClientset(kc)
			if err != nil {
				return err
			}
			if ns == "" {
				ns = os.Getenv("POD_NAMESPACE")
			}
			if ns == "" {
				ns = "volplane-system"
			}
			o.Secret = etcdbackup.SecretTarget{Client: cli, Namespace: ns, Name: secret}
			restore.Secret = etcdbackup.SecretTarget{Client: cli, Namespace: ns, Name: from}
		}
		if restore.Snapshot == "" && from == "" {
			return etcdbackup.Run(ctx, o)
		}
		restore.Client, restore.Logger = o.Client, log
		_, err := etcdbackup.Restore(ctx, restore)
		return err
	}))
}
