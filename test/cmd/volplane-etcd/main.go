// Command volplane-etcd runs one etcd member as its own process, from the
// etcd server module volplane already builds against: `make chaos` and the
// crash tests run it so that etcd can be killed with SIGKILL and started
// again on its data directory, alone or as one of three members. It is a
// development tool, not a production etcd: peers talk plaintext and
// writes are not fsynced.
package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/volplane/volplane/pkg/cmdutil"
	"github.com/volplane/volplane/test/harness/devenv"
)

const description = `volplane-etcd runs one etcd member as its own process, from the etcd server
module volplane already builds against: make chaos and the crash tests run it so that etcd can
be killed with SIGKILL and started again on its data directory, alone or as one of three
members. It is a development tool, not a production etcd: peers talk plaintext and writes are
not fsynced (volplane-etcd-member is the production one).`

func main() {
	var o devenv.EtcdServerOptions
	var tls devenv.EtcdTLS
	cmd := cmdutil.NewCommand("volplane-etcd", description)
	fs := cmd.Flags("Member")
	fs.StringVar(&o.Name, "name", "default", "this member's name in --initial-cluster")
	fs.StringVar(&o.DataDir, "data-dir", "", "the member's data directory; a restart on it rejoins with its data (required)")
	fs.StringVar(&o.ClientURL, "listen-client-url", "", "client URL, https:// with --cert-file (required)")
	fs.StringVar(&o.PeerURL, "listen-peer-url", "", "peer URL, plaintext on loopback (required)")
	fs.StringVar(&o.InitialCluster, "initial-cluster", "", "every member as name=peerURL, comma separated; default a single member")
	fs = cmd.Flags(cmdutil.GroupTLS)
	fs.StringVar(&tls.CAFile, "trusted-ca-file", "", "CA that signs the client certificates etcd requires")
	fs.StringVar(&tls.CertFile, "cert-file", "", "serving certificate for clients")
	fs.StringVar(&tls.KeyFile, "key-file", "", "private key of --cert-file")
	logging := cmd.LogFlags()
	os.Exit(cmd.Run(logging, func(ctx context.Context, _ *slog.Logger) error {
		if tls != (devenv.EtcdTLS{}) {
			o.TLS = &tls
		}
		return devenv.RunEtcdServer(ctx, o)
	}))
}
