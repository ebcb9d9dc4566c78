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
	"flag"
	"log/slog"
	"os"
	"strings"

	"github.com/volplane/volplane/internal/etcdmember"
	"github.com/volplane/volplane/pkg/cmdutil"
)

func main() {
	var o etcdmember.Options
	var clientURL string
	flag.StringVar(&o.Name, "name", "", "this member's name in --initial-cluster (the pod name; required)")
	flag.StringVar(&o.DataDir, "data-dir", "", "the member's data directory, on the pod's emptyDir (required)")
	flag.StringVar(&o.InitialCluster, "initial-cluster", "", "every member as name=peerURL, comma separated, the same on every member (required)")
	flag.StringVar(&o.InitialClusterToken, "initial-cluster-token", etcdmember.DefaultClusterToken, "etcd's --initial-cluster-token")
	cmdutil.ListFlag(&o.ListenClientURLs, "listen-client-urls", "URLs etcd serves its clients on (comma separated)")
	flag.StringVar(&clientURL, "advertise-client-urls", "", "this member's client URL as clients reach it; its scheme and port are every member's (required)")
	cmdutil.ListFlag(&o.ListenPeerURLs, "listen-peer-urls", "URLs etcd serves the other members on (comma separated)")
	cmdutil.ListFlag(&o.ListenMetricsURLs, "listen-metrics-urls", "http:// URLs serving /metrics, /livez, /readyz and /health in plaintext, for Prometheus and the kubelet")
	flag.IntVar(&o.StatusPort, "status-port", etcdmember.DefaultStatusPort, "port of the status endpoint members ask each other before starting etcd (peer TLS)")
	flag.StringVar(&o.ClientTLS.CAFile, "trusted-ca-file", "", "CA of the client certificates etcd requires")
	flag.StringVar(&o.ClientTLS.CertFile, "cert-file", "", "etcd's serving certificate for clients")
	flag.StringVar(&o.ClientTLS.KeyFile, "key-file", "", "key of --cert-file")
	flag.StringVar(&o.PeerTLS.CAFile, "peer-trusted-ca-file", "", "CA of the members' certificates")
	flag.StringVar(&o.PeerTLS.CertFile, "peer-cert-file", "", "this member's certificate for the other members (server and client)")
	flag.StringVar(&o.PeerTLS.KeyFile, "peer-key-file", "", "key of --peer-cert-file")
	flag.Int64Var(&o.QuotaBackendBytes, "quota-backend-bytes", etcdmember.DefaultQuotaBackendBytes, "etcd's database quota: past it etcd raises the NOSPACE alarm and refuses writes")
	flag.StringVar(&o.AutoCompactionMode, "auto-compaction-mode", "periodic", "etcd's --auto-compaction-mode: periodic or revision")
	flag.StringVar(&o.AutoCompactionRetention, "auto-compaction-retention", etcdmember.DefaultAutoCompactionRetention, "etcd's --auto-compaction-retention")
	flag.UintVar(&o.BootstrapDefragThresholdMegabytes, "bootstrap-defrag-threshold-megabytes", 0, "etcd's: defragment at start when that many MiB would be freed (0: never)")
	flag.Uint64Var(&o.SnapshotCount, "snapshot-count", 0, "etcd's --snapshot-count (0: etcd's default)")
	flag.DurationVar(&o.HeartbeatInterval, "heartbeat-interval", 0, "etcd's heartbeat interval (0: etcd's default, 100ms)")
	flag.DurationVar(&o.ElectionTimeout, "election-timeout", 0, "etcd's election timeout (0: etcd's default, 1s)")
	flag.DurationVar(&o.MaintenancePeriod, "maintenance-period", etcdmember.DefaultMaintenancePeriod, "how often the member looks at its database size and etcd's alarms")
	flag.DurationVar(&o.DefragSlot, "defrag-slot", etcdmember.DefaultDefragSlot, "length of each member's turn to defragment (turns follow the members' names)")
	flag.Int64Var(&o.DefragMinFreeBytes, "defrag-min-free-bytes", etcdmember.DefaultDefragMinFreeBytes, "defragment only when at least that many bytes are free")
	flag.Float64Var(&o.DefragFreeRatio, "defrag-free-ratio", etcdmember.DefaultDefragFreeRatio, "defragment only when at least that fraction of the database is free")
	flag.DurationVar(&o.RecoverQuorumAfter, "recover-quorum-after", etcdmember.DefaultRecoverQuorumAfter, "without a leader that long while every other member's data is gone, start again as a cluster of this member (0: never)")
	flag.StringVar(&o.EtcdLogLevel, "etcd-log-level", "warn", "etcd's own log level (its log is JSON on stderr)")
	logging := cmdutil.LogFlags()
	flag.Parse()
	o.AdvertiseClientURL = strings.TrimSpace(clientURL)
	os.Exit(cmdutil.Run("volplane-etcd-member", logging, func(ctx context.Context, log *slog.Logger) error {
		o.Logger = log
		return etcdmember.Run(ctx, o)
	}))
}
