package etcdmember

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
)

// statusPath is where a member's status endpoint answers.
const statusPath = "/volplane/etcd-member"

// status is a member's answer: its state and, once it runs etcd, the
// membership it knows (so that a member deciding how to start learns it
// even from a cluster that has no leader yet).
type status struct {
	Name    string    `json:"name"`
	State   peerState `json:"state"`
	ID      string    `json:"id,omitempty"`
	Members []member  `json:"members,omitempty"`
	// Defragmenting: the member is defragmenting its database now; no
	// other member begins to meanwhile.
	Defragmenting bool `json:"defragmenting,omitempty"`
}

// statusBoard holds this member's status for its endpoint.
type statusBoard struct {
	mu            sync.Mutex
	state         peerState
	id            uint64
	members       func() []member // set while etcd runs
	defragmenting bool
}

func (b *statusBoard) setDefragmenting(on bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.defragmenting = on
}

func (b *statusBoard) set(state peerState, id uint64, members func() []member) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.state, b.id, b.members = state, id, members
}

func (b *statusBoard) get(name string) status {
	b.mu.Lock()
	state, id, members, defrag := b.state, b.id, b.members, b.defragmenting
	b.mu.Unlock()
	s := status{Name: name, State: state, Defragmenting: defrag}
	if id != 0 {
		s.ID = strconv.FormatUint(id, 16)
	}
	if members != nil {
		s.Members = members()
	}
	return s
}

// serveStatus serves this member's status on StatusPort, on the host of
// its first peer listener, until ctx ends, over the peer TLS (requiring a
// peer certificate) when there is one.
func (r *runner) serveStatus(ctx context.Context) error {
	mux := http.NewServeMux()
	mux.HandleFunc(statusPath, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(r.board.get(r.o.Name))
	})
	// On the host the peer listener binds (0.0.0.0 in a pod).
	lis, err := net.Listen("tcp", net.JoinHostPort(r.p.listenPr[0].Hostname(), strconv.Itoa(r.o.StatusPort)))
	if err != nil {
		return fmt.Errorf("status endpoint: %w", err)
	}
	if r.o.PeerTLS.set() {
		info := transport.TLSInfo{CertFile: r.o.PeerTLS.CertFile, KeyFile: r.o.PeerTLS.KeyFile, TrustedCAFile: r.o.PeerTLS.CAFile, ClientCertAuth: true}
		cfg, err := info.ServerConfig()
		if err != nil {
			lis.Close()
			return fmt.Errorf("status endpoint TLS: %w", err)
		}
		lis = tls.NewListener(lis, cfg)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("status endpoint: %w", err)
	}
	return nil
}

// statusClient asks the other members for their status.
type statusClient struct {
	hc *http.Client
}

func newStatusClient(o *Options) (*statusClient, error) {
	tr := &http.Transport{DisableKeepAlives: true}
	if o.PeerTLS.set() {
		info := transport.TLSInfo{CertFile: o.PeerTLS.CertFile, KeyFile: o.PeerTLS.KeyFile, TrustedCAFile: o.PeerTLS.CAFile}
		cfg, err := info.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("status client TLS: %w", err)
		}
		tr.TLSClientConfig = cfg
	}
	return &statusClient{hc: &http.Client{Transport: tr, Timeout: 3 * time.Second}}, nil
}

// get asks one member; an error means its state is unknown.
func (c *statusClient) get(ctx context.Context, url string) (status, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return status{}, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return status{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return status{}, fmt.Errorf("%s: %s", url, resp.Status)
	}
	var s status
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		return status{}, fmt.Errorf("%s: %w", url, err)
	}
	return s, nil
}

// peerStates asks every other member for its status, at once.
func (r *runner) peerStates(ctx context.Context) map[string]status {
	others := r.p.others()
	out := make(map[string]status, len(others))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, pr := range others {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := r.status.get(ctx, r.p.statusURL(pr, r.o.StatusPort))
			if err != nil || s.Name != pr.Name {
				s = status{Name: pr.Name} // unknown
			}
			mu.Lock()
			out[pr.Name] = s
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

func states(ss map[string]status) map[string]peerState {
	out := make(map[string]peerState, len(ss))
	for n, s := range ss {
		out[n] = s.State
	}
	return out
}
