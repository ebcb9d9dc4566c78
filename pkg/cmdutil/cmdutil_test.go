package cmdutil

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/volplane/volplane/pkg/version"
)

func TestListValueReplacesTheDefaultThenAppends(t *testing.T) {
	list := []string{"http://127.0.0.1:2379"}
	v := NewList(&list, "")
	for _, s := range []string{"http://a:1, http://b:2", "http://c:3", " ,"} {
		if err := v.Set(s); err != nil {
			t.Fatal(err)
		}
	}
	if got := v.String(); got != "http://a:1,http://b:2,http://c:3" {
		t.Fatalf("got %q", got)
	}
	if v.Type() != "strings" {
		t.Fatalf("type %q", v.Type())
	}
}

// testCommand is a command like a service's: a group of its own, the
// shared groups, and a custom flag type.
func testCommand() (*Command, *opts, *bytes.Buffer, *bytes.Buffer) {
	var o opts
	c := NewCommand("binder", "Binder runs the binding state machine of Kubernetes' PersistentVolume controller.")
	fs := c.Flags("Binder")
	fs.IntVar(&o.workers, "workers", 8, "number of workers")
	fs.DurationVar(&o.resync, "resync-period", time.Minute, "resync period")
	fs.StringVar(&o.name, "name", "", "a name")
	fs.BoolVar(&o.on, "on", false, "a switch")
	o.watchers = []string{"127.0.0.1:7701"}
	fs.Var(NewList(&o.watchers, "addresses"), "watcher-address", "watchers")
	Func(fs, "mode", "mode", "all, controller or node", func(s string) error { o.mode = s; return nil })
	c.KubeFlags(&o.kubeconfig, &o.qps, &o.burst)
	o.log = c.LogFlags()
	var out, errOut bytes.Buffer
	c.Stdout, c.Stderr = &out, &errOut
	return c, &o, &out, &errOut
}

type opts struct {
	workers    int
	resync     time.Duration
	name, mode string
	on         bool
	watchers   []string
	kubeconfig string
	qps        float32
	burst      int
	log        *Logging
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want func(*opts) bool
	}{
		{"defaults", nil, func(o *opts) bool {
			return o.workers == 8 && o.resync == time.Minute && o.log.Format == "text" && len(o.watchers) == 1
		}},
		{"double dash", []string{"--workers=3", "--resync-period", "2s", "--kube-api-qps=-1", "--on"}, func(o *opts) bool {
			return o.workers == 3 && o.resync == 2*time.Second && o.qps == -1 && o.on
		}},
		{"single dash as Go's flag package took it", []string{"-workers=3", "-resync-period", "2s", "-on", "-log-format=json"}, func(o *opts) bool {
			return o.workers == 3 && o.resync == 2*time.Second && o.on && o.log.Format == "json"
		}},
		{"a value that looks like a flag is a value", []string{"--name", "-workers", "--kube-api-qps", "-5"}, func(o *opts) bool {
			return o.name == "-workers" && o.workers == 8 && o.qps == -5
		}},
		{"a list replaces its default, then appends", []string{"--watcher-address=a:1,b:2", "-watcher-address", "c:3"}, func(o *opts) bool {
			return strings.Join(o.watchers, " ") == "a:1 b:2 c:3"
		}},
		{"a custom type", []string{"--mode=node"}, func(o *opts) bool { return o.mode == "node" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, o, _, errOut := testCommand()
			if code, done := c.Parse(tc.args); done {
				t.Fatalf("Parse(%q) = %d, done: %s", tc.args, code, errOut)
			}
			if !tc.want(o) {
				t.Fatalf("Parse(%q) gave %+v", tc.args, *o)
			}
		})
	}
}

// A bad value or an unknown flag is one line naming the flag and where to
// read more, exit code 2: not the whole usage.
func TestParseErrorIsShort(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--workers=x"}, `binder: invalid argument "x" for "--workers" flag: strconv.ParseInt: parsing "x": invalid syntax; see binder --help`},
		{[]string{"-workers", "x"}, `binder: invalid argument "x" for "--workers" flag`},
		{[]string{"--resync-period=soon"}, `binder: invalid argument "soon" for "--resync-period" flag: time: invalid duration "soon"; see binder --help`},
		{[]string{"--no-such-flag"}, `binder: unknown flag: --no-such-flag; see binder --help`},
		{[]string{"-bogus"}, `binder: unknown shorthand flag: 'b' in -bogus; see binder --help`},
		{[]string{"--workers"}, `binder: flag needs an argument: --workers; see binder --help`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			c, _, out, errOut := testCommand()
			code, done := c.Parse(tc.args)
			if !done || code != 2 {
				t.Fatalf("Parse = %d, %v; want 2, done", code, done)
			}
			if got := errOut.String(); !strings.HasPrefix(got, tc.want) || strings.Count(got, "\n") != 1 {
				t.Fatalf("stderr %q, want one line starting %q", got, tc.want)
			}
			if out.Len() != 0 {
				t.Fatalf("stdout %q", out)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"-help"}, {"--workers=3", "--help"}} {
		c, _, out, errOut := testCommand()
		code, done := c.Parse(args)
		if !done || code != 0 || errOut.Len() != 0 {
			t.Fatalf("%q: %d, %v, stderr %q", args, code, done, errOut)
		}
		help := out.String()
		if !strings.HasPrefix(help, "Binder runs the binding state machine") {
			t.Fatalf("%q: help does not open with the description:\n%s", args, help)
		}
		order := []string{"Usage:\n  binder [flags]", "Binder flags:", "--workers int", "--resync-period duration", "--watcher-address addresses", "--mode mode",
			"Kubernetes client flags:", "--kube-api-qps float32", "Logging flags:", "--log-format string", "General flags:", "-h, --help", "--version"}
		at := 0
		for _, s := range order {
			i := strings.Index(help[at:], s)
			if i < 0 {
				t.Fatalf("%q: help lacks %q after offset %d:\n%s", args, s, at, help)
			}
			at += i
		}
		if strings.Contains(help, " value ") {
			t.Fatalf("a flag's type shows as value:\n%s", help)
		}
	}
}

func TestVersion(t *testing.T) {
	c, _, out, _ := testCommand()
	if code, done := c.Parse([]string{"--version"}); !done || code != 0 {
		t.Fatalf("--version: %d, %v", code, done)
	}
	if want := "binder " + version.Get().String() + "\n"; out.String() != want {
		t.Fatalf("--version printed %q, want %q", out, want)
	}
}

func TestNoArgs(t *testing.T) {
	c, _, _, _ := testCommand()
	if _, done := c.Parse([]string{"--workers=2", "extra"}); done {
		t.Fatal("done")
	}
	if err := c.NoArgs(); err == nil || !strings.Contains(err.Error(), `"extra"`) {
		t.Fatalf("NoArgs: %v", err)
	}
	c, _, _, _ = testCommand()
	c.Parse([]string{"--", "-x"})
	if got := c.Args(); len(got) != 1 || got[0] != "-x" {
		t.Fatalf("after --: %q", got)
	}
}
