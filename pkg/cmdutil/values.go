package cmdutil

import (
	"strings"

	"github.com/spf13/pflag"
)

// NewList returns a repeatable, comma-separated flag value whose first use
// replaces the default; its type in --help is typ (e.g. "strings",
// "urls", "addresses").
func NewList(p *[]string, typ string) pflag.Value { return &listValue{p: p, typ: typ} }

type listValue struct {
	p   *[]string
	typ string
	set bool
}

func (l *listValue) String() string {
	if l.p == nil {
		return ""
	}
	return strings.Join(*l.p, ",")
}

func (l *listValue) Set(s string) error {
	if !l.set {
		*l.p, l.set = nil, true
	}
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			*l.p = append(*l.p, part)
		}
	}
	return nil
}

func (l *listValue) Type() string {
	if l.typ == "" {
		return "strings"
	}
	return l.typ
}

// ListFlag registers on fs a repeatable, comma-separated flag (type
// "strings" in --help).
func ListFlag(fs *pflag.FlagSet, list *[]string, name, usage string) {
	fs.Var(NewList(list, ""), name, usage)
}

// Func registers on fs a flag whose every use calls set, shown in --help
// with the type name typ (pflag's own Func shows "value").
func Func(fs *pflag.FlagSet, name, typ, usage string, set func(string) error) {
	fs.Var(&funcValue{set: set, typ: typ}, name, usage)
}

type funcValue struct {
	set func(string) error
	typ string
	val string
}

func (f *funcValue) Set(s string) error {
	if err := f.set(s); err != nil {
		return err
	}
	f.val = s
	return nil
}
func (f *funcValue) String() string { return f.val }
func (f *funcValue) Type() string   { return f.typ }
