// Command volplane-etcd-member is the etcd image's entrypoint: one member
// of volplane's own etcd cluster, etcd embedded, on a data directory that
// may vanish (a pod's emptyDir). Before starting etcd it bootstraps a new
// cluster only when every member is empty, and a member whose data is lost
// replaces its former self (MemberRemove, then MemberAdd as a learner,
// promoted once in sync); while etcd runs it defragments its own database
// in its turn, recovers from the NOSPACE alarm (compact, defragment,
// disarm) and serves /metrics, /livez and /readyz in plaintext for
// Prometheus and the kubelet. See internal/etcdmember and docs/etcd.md.
package main

import (
	"context"
	"log/slog"
	"os"
	"strings"

	"github.com/volplane/volplane/internal/etcdmember"
	"github.com/volplane/volplane/pkg/cmdutil"
)

// GroupEtcdTuning holds etcd's own settings.
const GroupEtcdTuning = "etcd server"

const description = `volplane-etcd-member is the entrypoint of volplane's etcd image: one member
of volplane's own etcd cluster, etcd embedded, on a data directory that may vanish (a pod's
emptyDir). It bootstraps a new cluster only when every member is empty, and a member whose data
is lost replaces its former self (removed, added back as a learner, promoted once in sync).
While etcd runs it defragments its database in its turn, recovers from the NOSPACE alarm and
serves /metrics, /livez and /readyz in plaintext for Prometheus and the kubelet. See
docs/etcd.md.`

func main() {
	var o etcdmember.Options
	var clientURL string
	cmd := cmdutil.NewCommand("volplane-etcd-member", description)
	fs := cmd.Flags("Member")
	fs.StringVar(&o.Name, "name", "", "this member's name in --initial-cluster (the pod name; required)")
	fs.StringVar(&o.DataDir, "data-dir", "", "the member's data directory, on the pod's emptyDir (required)")
	fs.StringVar(&o.InitialCluster, "initial-cluster", "", "every member as name=peerURL, comma separated, the same on every member (required)")
	fs.StringVar(&o.InitialClusterToken, "initial-cluster-token", etcdmember.DefaultClusterToken, "etcd's --initial-cluster-token")
	cmdutil.ListFlag(fs, &o.ListenClientURLs, "listen-client-urls", "URLs etcd serves its clients on (comma separated)")
	fs.StringVar(&clientURL, "advertise-client-urls", "", "this member's client URL as clients reach it; its scheme and port are every member's (required)")
	cmdutil.ListFlag(fs, &o.ListenPeerURLs, "listen-peer-urls", "URLs etcd serves the other members on (comma separated)")
	cmdutil.ListFlag(fs, &o.ListenMetricsURLs, "listen-metrics-urls", "http:// URLs serving /metrics, /livez, /readyz and /health in plaintext, for Prometheus and the kubelet")
	fs.IntVar(&o.StatusPort, "status-port", etcdmember.DefaultStatusPort, "port of the status endpoint members ask each other before starting etcd (peer TLS)")
	fs = cmd.Flags(cmdutil.GroupTLS)
	fs.StringVar(&o.ClientTLS.CAFile, "trusted-ca-file", "", "CA of the client certificates etcd requires")
	fs.StringVar(&o.ClientTLS.CertFile, "cert-file", "", "etcd's serving certificate for clients")
	fs.StringVar(&o.ClientTLS.KeyFile, "key-file", "", "key of --cert-file")
	fs.StringVar(&o.PeerTLS.CAFile, "peer-trusted-ca-file", "", "CA of the members' certificates")
	fs.StringVar(&o.PeerTLS.CertFile, "peer-cert-file", "", "this member's certificate for the other members (server and client)")
	fs.StringVar(&o.PeerTLS.KeyFile, "peer-key-file", "", "key of --peer-cert-file")
	fs = cmd.Flags(GroupEtcdTuning)
	fs.Int64Var(&o.QuotaBackendBytes, "quota-backend-bytes", etcdmember.DefaultQuotaBackendBytes, "etcd's database quota: past it etcd raises the NOSPACE alarm and refuses writes")
	fs.StringVar(&o.AutoCompactionMode, "auto-compaction-mode", "periodic", "etcd's --auto-compaction-mode: periodic or revision")
	fs.StringVar(&o.AutoCompactionRetention, "auto-compaction-retention", etcdmember.DefaultAutoCompactionRetention, "etcd's --auto-compaction-retention")
	fs.UintVar(&o.BootstrapDefragThresholdMegabytes, "bootstrap-defrag-threshold-megabytes", 0, "etcd's: defragment at start when that many MiB would be freed (0: never)")
	fs.Uint64Var(&o.SnapshotCount, "snapshot-count", 0, "etcd's --snapshot-count (0: etcd's default)")
	fs.DurationVar(&o.HeartbeatInterval, "heartbeat-interval", 0, "etcd's heartbeat interval (0: etcd's default, 100ms)")
	fs.DurationVar(&o.ElectionTimeout, "election-timeout", 0, "etcd's election timeout (0: etcd's default, 1s)")
	fs = cmd.Flags("Maintenance")
	fs.DurationVar(&o.MaintenancePeriod, "maintenance-period", etcdmember.DefaultMaintenancePeriod, "how often the member looks at its database size and etcd's alarms")
	fs.DurationVar(&o.DefragSlot, "defrag-slot", etcdmember.DefaultDefragSlot, "length of each member's turn to defragment (turns follow the members' names)")
	fs.Int64Var(&o.DefragMinFreeBytes, "defrag-min-free-bytes", etcdmember.DefaultDefragMinFreeBytes, "defragment only when at least that many bytes are free")
	fs.Float64Var(&o.DefragFreeRatio, "defrag-free-ratio", etcdmember.DefaultDefragFreeRatio, "defragment only when at least that fraction of the database is free")
	fs.DurationVar(&o.RecoverQuorumAfter, "recover-quorum-after", etcdmember.DefaultRecoverQuorumAfter, "without a leader that long while every other member's data is gone, start again as a cluster of this member (0: never)")
	fs = cmd.Flags(cmdutil.GroupLogging)
	fs.StringVar(&o.EtcdLogLevel, "etcd-log-level", "warn", "etcd's own log level: debug, info, warn or error; its lines (logger=etcd) are written as --log-format says, when --log-level lets them through too")
	logging := cmd.LogFlags()
	os.Exit(cmd.Run(logging, func(ctx context.Context, log *slog.Logger) error {
		o.AdvertiseClientURL = strings.TrimSpace(clientURL)
		o.Logger = log
		return etcdmember.Run(ctx, o)
	}))
}
