package watchclient

import (
	"context"
	"fmt"
	"strings"

	"github.com/volplane/volplane/pkg/grpcutil"
)

// Addresses splits a --watcher-address value: one address or several,
// comma-separated; blanks are dropped.
func Addresses(s string) []string {
	var out []string
	for _, a := range strings.Split(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// DialFailover dials every watcher address with tls and runs RunFailover
// over them until ctx ends, which is not an error.
func DialFailover(ctx context.Context, addrs []string, tls grpcutil.TLSFiles, o Options, h Handler) error {
	watchers := make([]Watcher, 0, len(addrs))
	for _, a := range addrs {
		cc, err := grpcutil.Dial(a, tls)
		if err != nil {
			return fmt.Errorf("watcher %s: %w", a, err)
		}
		defer cc.Close()
		watchers = append(watchers, Watcher{Name: a, Conn: cc})
	}
	err := RunFailover(ctx, watchers, o, h)
	if ctx.Err() != nil {
		return nil
	}
	return err
}
