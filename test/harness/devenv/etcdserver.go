package devenv

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// EtcdServerOptions configures an etcd member run as its own process
// (test/cmd/volplane-etcd), so that a test can kill it with SIGKILL and start
// it again on the same data directory.
type EtcdServerOptions struct {
	// Name is the member's name in InitialCluster.
	Name string
	// DataDir holds the member's data; a member restarted on it rejoins
	// with its data.
	DataDir string
	// ClientURL serves clients (https:// with TLS).
	ClientURL string
	// PeerURL serves the other members (plaintext, loopback only).
	PeerURL string
	// InitialCluster lists every member as name=peerURL, comma separated;
	// default Name=PeerURL (a single member).
	InitialCluster string
	// TLS, when set, serves clients over TLS and requires a client
	// certificate signed by its CA.
	TLS *EtcdTLS
}

// Args is the volplane-etcd command line of o.
func (o EtcdServerOptions) Args() []string {
	a := []string{"--name", o.Name, "--data-dir", o.DataDir, "--listen-client-url", o.ClientURL,
		"--listen-peer-url", o.PeerURL, "--initial-cluster", o.InitialCluster}
	if o.TLS != nil {
		a = append(a, "--trusted-ca-file", o.TLS.CAFile, "--cert-file", o.TLS.CertFile, "--key-file", o.TLS.KeyFile)
	}
	return a
}

func (o EtcdServerOptions) validate() error {
	var errs []error
	if o.Name == "" {
		errs = append(errs, errors.New("a member name is required (--name)"))
	}
	if o.DataDir == "" {
		errs = append(errs, errors.New("a data directory is required (--data-dir)"))
	}
	if o.ClientURL == "" || o.PeerURL == "" {
		errs = append(errs, errors.New("client and peer URLs are required (--listen-client-url, --listen-peer-url)"))
	}
	if o.TLS != nil && (o.TLS.CAFile == "" || o.TLS.CertFile == "" || o.TLS.KeyFile == "") {
		errs = append(errs, errors.New("client TLS needs --trusted-ca-file, --cert-file and --key-file together"))
	}
	return errors.Join(errs...)
}

// RunEtcdServer runs one etcd member until ctx ends or the server fails.
// The member's data directory decides whether it starts a new cluster or
// rejoins the one it belongs to.
func RunEtcdServer(ctx context.Context, o EtcdServerOptions) error {
	if o.InitialCluster == "" {
		o.InitialCluster = o.Name + "=" + o.PeerURL
	}
	if err := o.validate(); err != nil {
		return err
	}
	client, err := url.Parse(o.ClientURL)
	if err != nil {
		return fmt.Errorf("--listen-client-url: %w", err)
	}
	peer, err := url.Parse(o.PeerURL)
	if err != nil {
		return fmt.Errorf("--listen-peer-url: %w", err)
	}
	cfg := embed.NewConfig()
	cfg.Name = o.Name
	cfg.Dir = o.DataDir
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*client}, []url.URL{*client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*peer}, []url.URL{*peer}
	cfg.InitialCluster = o.InitialCluster
	cfg.InitialClusterToken = "volplane-dev"
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	// Loopback members on a shared machine: elections must not fire on a
	// scheduling hiccup.
	cfg.TickMs, cfg.ElectionMs = 100, 1000
	// A SIGKILL loses nothing written (the page cache survives the
	// process); only a machine crash would, which the tests never make.
	cfg.UnsafeNoFsync = true
	if o.TLS != nil {
		cfg.ClientTLSInfo = transport.TLSInfo{CertFile: o.TLS.CertFile, KeyFile: o.TLS.KeyFile, TrustedCAFile: o.TLS.CAFile, ClientCertAuth: true}
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("start etcd member %s: %w", o.Name, err)
	}
	defer e.Close()
	single := !strings.Contains(o.InitialCluster, ",")
	ready := time.After(60 * time.Second)
	if !single {
		// A member of a cluster is ready once a quorum is; the others may
		// not be up yet, so do not give up on it.
		ready = nil
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		return fmt.Errorf("etcd member %s: %w", o.Name, err)
	case <-ready:
		return fmt.Errorf("etcd member %s was not ready within 60s", o.Name)
	case <-ctx.Done():
		return nil
	}
	select {
	case err := <-e.Err():
		return fmt.Errorf("etcd member %s: %w", o.Name, err)
	case <-ctx.Done():
		return nil
	}
}
