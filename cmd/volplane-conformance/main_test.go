package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		code int
		out  string // in stdout or stderr
	}{
		{"no service", nil, 2, "usage: volplane-conformance provisioner|reclaimer|watcher|binder"},
		{"unknown service", []string{"gateway"}, 2, "usage:"},
		{"unknown flag", []string{"watcher", "--bogus"}, 2, "volplane-conformance watcher: unknown flag: --bogus; see volplane-conformance watcher --help"},
		{"arguments", []string{"watcher", "extra"}, 2, "unexpected arguments"},
		{"no address", []string{"binder", "--insecure-plaintext"}, 2, "--address"},
		{"bad regexp", []string{"binder", "--run", "("}, 2, "--run"},
		{"list", []string{"reclaimer", "--list"}, 0, "reclaimer/reclaim-retain\n    Reclaim of a Released volume with policy Retain"},
		{"help", []string{"watcher", "--help"}, 0, "--watcher-history-writes int"},
		{"help without a service", []string{"--help"}, 0, "volplane-conformance checks that an implementation"},
		{"version", []string{"--version"}, 0, "volplane-conformance v"},
		// Nothing listens: the health check fails within its timeout.
		{"unreachable", []string{"watcher", "--address", "127.0.0.1:1", "--insecure-plaintext", "--run", "/health$", "--timeout", "300ms"}, 1,
			"--- FAIL: watcher/health"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			code := run(tc.args, &out, &out)
			if code != tc.code || !strings.Contains(out.String(), tc.out) {
				t.Fatalf("exit %d, output:\n%s\nwant exit %d and %q", code, out.String(), tc.code, tc.out)
			}
		})
	}
}
