package devenv

import (
	"fmt"
	"net/url"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Etcd is an etcd server embedded in this process.
type Etcd struct {
	// Endpoints are the client URLs, e.g. http://127.0.0.1:2379 (https://
	// with TLS).
	Endpoints []string
	e         *embed.Etcd
	cfg       *embed.Config
}

// EtcdTLS makes an embedded etcd serve its clients over TLS and require a
// client certificate signed by CAFile, as a production etcd run with
// --client-cert-auth does.
type EtcdTLS struct {
	// CAFile signs the client certificates etcd accepts.
	CAFile string
	// CertFile and KeyFile are etcd's serving certificate and key (for
	// 127.0.0.1).
	CertFile, KeyFile string
}

// EtcdOptions are the settings of an embedded etcd beyond its directory.
type EtcdOptions struct {
	// TLS, when set, serves clients over mutual TLS.
	TLS *EtcdTLS
	// QuotaBackendBytes is etcd's --quota-backend-bytes (0: etcd's
	// default, 2 GiB): a test sets it tiny to trip the NOSPACE alarm.
	QuotaBackendBytes int64
}

// StartEtcd starts an embedded etcd with its data in dir, on free loopback
// ports, without TLS, and waits until it is ready.
func StartEtcd(dir string) (*Etcd, error) { return StartEtcdWith(dir, EtcdOptions{}) }

// StartEtcdTLS is StartEtcd serving clients over mutual TLS when tls is
// not nil.
func StartEtcdTLS(dir string, tls *EtcdTLS) (*Etcd, error) {
	return StartEtcdWith(dir, EtcdOptions{TLS: tls})
}

// StartEtcdWith is StartEtcd with o's settings.
func StartEtcdWith(dir string, o EtcdOptions) (*Etcd, error) {
	tls := o.TLS
	clientURL, err := freeURL()
	if err != nil {
		return nil, err
	}
	if tls != nil {
		clientURL.Scheme = "https"
	}
	peerURL, err := freeURL()
	if err != nil {
		return nil, err
	}
	cfg := embed.NewConfig()
	cfg.Dir = dir
	cfg.Name = "volplane-dev"
	cfg.ListenClientUrls = []url.URL{*clientURL}
	cfg.AdvertiseClientUrls = []url.URL{*clientURL}
	cfg.ListenPeerUrls = []url.URL{*peerURL}
	cfg.AdvertisePeerUrls = []url.URL{*peerURL}
	cfg.InitialCluster = cfg.Name + "=" + peerURL.String()
	cfg.LogLevel = "error"
	// Shutdown logs "server closed" errors at error level; they are noise.
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	// A development and test server: losing the last writes on a machine
	// crash is acceptable, fsync latency is not.
	cfg.UnsafeNoFsync = true
	cfg.QuotaBackendBytes = o.QuotaBackendBytes
	if tls != nil {
		cfg.ClientTLSInfo = transport.TLSInfo{CertFile: tls.CertFile, KeyFile: tls.KeyFile, TrustedCAFile: tls.CAFile, ClientCertAuth: true}
	}
	e, err := startEmbedded(cfg)
	if err != nil {
		return nil, err
	}
	return &Etcd{Endpoints: []string{clientURL.String()}, e: e, cfg: cfg}, nil
}

func startEmbedded(cfg *embed.Config) (*embed.Etcd, error) {
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("embedded etcd: %w", err)
	case <-time.After(60 * time.Second):
		e.Close()
		return nil, fmt.Errorf("embedded etcd was not ready within 60s")
	}
	return e, nil
}

// Restart starts a stopped server again on its data directory and ports,
// as an etcd restarted after an outage: the same endpoints, the same data.
func (e *Etcd) Restart() error {
	n, err := startEmbedded(e.cfg)
	if err != nil {
		return err
	}
	e.e = n
	return nil
}

// Stop stops the server; stopping a stopped server does nothing.
func (e *Etcd) Stop() {
	if e.e != nil {
		e.e.Close()
		e.e = nil
	}
}

func freeURL() (*url.URL, error) {
	addr, err := FreeAddr()
	if err != nil {
		return nil, err
	}
	return &url.URL{Scheme: "http", Host: addr}, nil
}
