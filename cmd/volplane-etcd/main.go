// Command volplane-etcd runs one etcd member as its own process, from the
// etcd server module volplane already builds against: `make chaos` and the
// crash tests run it so that etcd can be killed with SIGKILL and started
// again on its data directory, alone or as one of three members. It is a
// development tool, not a production etcd: peers talk plaintext and
// writes are not fsynced.
package main

import (
	"context"
	"flag"
	"log/slog"
	"os"

	"github.com/volplane/volplane/internal/devenv"
	"github.com/volplane/volplane/pkg/cmdutil"
)

func main() {
	var o devenv.EtcdServerOptions
	var tls devenv.EtcdTLS
	flag.StringVar(&o.Name, "name", "default", "this member's name in --initial-cluster")
	flag.StringVar(&o.DataDir, "data-dir", "", "the member's data directory; a restart on it rejoins with its data (required)")
	flag.StringVar(&o.ClientURL, "listen-client-url", "", "client URL, https:// with --cert-file (required)")
	flag.StringVar(&o.PeerURL, "listen-peer-url", "", "peer URL, plaintext on loopback (required)")
	flag.StringVar(&o.InitialCluster, "initial-cluster", "", "every member as name=peerURL, comma separated; default a single member")
	flag.StringVar(&tls.CAFile, "trusted-ca-file", "", "CA that signs the client certificates etcd requires")
	flag.StringVar(&tls.CertFile, "cert-file", "", "serving certificate for clients")
	flag.StringVar(&tls.KeyFile, "key-file", "", "private key of --cert-file")
	logging := cmdutil.LogFlags()
	flag.Parse()
	if tls != (devenv.EtcdTLS{}) {
		o.TLS = &tls
	}
	os.Exit(cmdutil.Run("volplane-etcd", logging, func(ctx context.Context, _ *slog.Logger) error {
		return devenv.RunEtcdServer(ctx, o)
	}))
}
