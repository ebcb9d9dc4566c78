package cmdutil

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/pflag"

	"github.com/volplane/volplane/pkg/version"
)

// Command is a volplane binary's command line, in the manner of Kubernetes
// components: pflag flags (--name, --name=value) in named groups, --help
// opening with what the binary is, --version, and a bad value answered by
// a one-line error, not the whole usage.
type Command struct {
	// Name is the binary's name, e.g. "binder".
	Name string
	// Description says what the binary is, one paragraph (more are
	// allowed, separated by blank lines); --help opens with it.
	Description string
	// Usage is the synopsis after "Usage:"; default "<Name> [flags]".
	Usage string
	// Stdout and Stderr default to os.Stdout and os.Stderr (tests).
	Stdout, Stderr io.Writer

	all                   *pflag.FlagSet
	groups                []group
	showHelp, showVersion bool
}

type group struct {
	name string
	fs   *pflag.FlagSet
}

// NewCommand returns the command line of the binary name, described by
// description, with --help and --version in its General group.
func NewCommand(name, description string) *Command {
	c := &Command{Name: name, Description: description}
	fs := c.Flags(GroupGeneral)
	fs.BoolVarP(&c.showHelp, "help", "h", false, "print this help and exit")
	fs.BoolVar(&c.showVersion, "version", false, "print the version and exit")
	return c
}

// Flags returns the flag set of the named group, made on first use. Groups
// are printed in the order they were first used, except Logging, Debug
// and General, printed last.
func (c *Command) Flags(name string) *pflag.FlagSet {
	for _, g := range c.groups {
		if g.name == name {
			return g.fs
		}
	}
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	fs.SortFlags = false
	c.groups = append(c.groups, group{name: name, fs: fs})
	return fs
}

func (c *Command) stdout() io.Writer {
	if c.Stdout != nil {
		return c.Stdout
	}
	return os.Stdout
}

func (c *Command) stderr() io.Writer {
	if c.Stderr != nil {
		return c.Stderr
	}
	return os.Stderr
}

// ordered is the groups in the order they are printed.
func (c *Command) ordered() []group {
	last := []string{GroupLogging, GroupDebug, GroupGeneral}
	var out []group
	for _, g := range c.groups {
		if !contains(last, g.name) {
			out = append(out, g)
		}
	}
	for _, name := range last {
		for _, g := range c.groups {
			if g.name == name {
				out = append(out, g)
			}
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// FlagSet is every flag of every group, in one set (after Parse; before,
// it is made on the call).
func (c *Command) FlagSet() *pflag.FlagSet {
	if c.all == nil {
		c.all = pflag.NewFlagSet(c.Name, pflag.ContinueOnError)
		c.all.SortFlags = false
		c.all.SetOutput(io.Discard)
		c.all.Usage = func() {}
		for _, g := range c.ordered() {
			c.all.AddFlagSet(g.fs)
		}
	}
	return c.all
}

// Parse parses args (the command line without the program name). After
// --help or --version it has printed them and returns (0, true); after a
// bad flag or value it has printed a one-line error and returns (2,
// true); else (0, false) and the flags hold their values.
//
// A long flag given with one dash, as Go's flag package accepted
// (-workers=4, -help), is taken as with two, so that command lines
// written for the earlier binaries keep working.
func (c *Command) Parse(args []string) (code int, done bool) {
	fs := c.FlagSet()
	if err := fs.Parse(c.doubleDash(args)); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			c.PrintHelp(c.stdout())
			return 0, true
		}
		return c.usageError(err), true
	}
	switch {
	case c.showHelp:
		c.PrintHelp(c.stdout())
		return 0, true
	case c.showVersion:
		fmt.Fprintf(c.stdout(), "%s %s\n", c.Name, version.Get())
		return 0, true
	}
	return 0, false
}

// usageError prints err in one line, with where to read more, and returns
// the exit code of bad usage.
func (c *Command) usageError(err error) int {
	fmt.Fprintf(c.stderr(), "%s: %v; see %s --help\n", c.Name, err, c.Name)
	return 2
}

// UsageError is usageError for a main's own checks of its arguments.
func (c *Command) UsageError(err error) int { return c.usageError(err) }

// doubleDash rewrites a long flag given with one dash (-name, -name=value)
// to two; it leaves alone shorthands, values (the argument after a flag
// that takes one) and everything after "--".
func (c *Command) doubleDash(args []string) []string {
	fs := c.FlagSet()
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(out, args[i:]...)
		}
		if len(a) < 2 || a[0] != '-' {
			out = append(out, a)
			continue
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		f := fs.Lookup(name)
		if !strings.HasPrefix(a, "--") && f != nil && (len(name) > 1 || fs.ShorthandLookup(name) == nil) {
			a = "-" + a
		}
		out = append(out, a)
		if strings.HasPrefix(a, "--") && f != nil && !hasValue && f.NoOptDefVal == "" && i+1 < len(args) {
			i++
			out = append(out, args[i]) // the flag's value, whatever it looks like
		}
	}
	return out
}

// PrintHelp writes the help: the description, the synopsis, then each
// group's flags.
func (c *Command) PrintHelp(w io.Writer) {
	if d := strings.TrimSpace(c.Description); d != "" {
		fmt.Fprintf(w, "%s\n\n", wrapText(d, helpColumns))
	}
	usage := c.Usage
	if usage == "" {
		usage = c.Name + " [flags]"
	}
	fmt.Fprintf(w, "Usage:\n  %s\n", usage)
	for _, g := range c.ordered() {
		if !g.fs.HasAvailableFlags() {
			continue
		}
		fmt.Fprintf(w, "\n%s flags:\n\n%s", capitalize(g.name), g.fs.FlagUsagesWrapped(helpColumns))
	}
}

// helpColumns is the width --help wraps to.
const helpColumns = 100

func capitalize(s string) string {
	if s == "" || s == GroupEtcd {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// wrapText wraps each paragraph of s (paragraphs are separated by blank
// lines; lines that start with a space are kept as they are) to cols.
func wrapText(s string, cols int) string {
	var out []string
	for _, para := range strings.Split(s, "\n\n") {
		if strings.HasPrefix(para, " ") || strings.HasPrefix(para, "\t") {
			out = append(out, para)
			continue
		}
		var lines []string
		line := ""
		for _, word := range strings.Fields(para) {
			if line != "" && len(line)+1+len(word) > cols {
				lines = append(lines, line)
				line = ""
			}
			if line != "" {
				line += " "
			}
			line += word
		}
		if line != "" {
			lines = append(lines, line)
		}
		out = append(out, strings.Join(lines, "\n"))
	}
	return strings.Join(out, "\n\n")
}
