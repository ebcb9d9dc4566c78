package kubectlplugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	"github.com/volplane/volplane/pkg/version"
)

// Streams are where a run reads (match -f -, a prompt's answer) and
// writes.
type Streams struct {
	In          io.Reader
	Out, ErrOut io.Writer
	// Terminal says a person types at In: a command that deletes asks
	// there (y/N) unless --yes. Without a terminal it needs --yes.
	Terminal bool
}

// ErrUsage is what errors in the command line are (errors.Is).
var ErrUsage = errors.New("usage")

// IsUsage reports whether err is a mistake in the command line.
func IsUsage(err error) bool { return errors.Is(err, ErrUsage) }

// usageError is a mistake in the command line: errors.Is(err, ErrUsage),
// printed without a prefix.
type usageError struct{ err error }

func (e usageError) Error() string        { return e.err.Error() }
func (e usageError) Unwrap() error        { return e.err }
func (e usageError) Is(target error) bool { return target == ErrUsage }

// usagef is a usage error (fmt.Errorf's format, %w included).
func usagef(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }

// CompletionExecutable is the name kubectl looks for on the PATH to
// complete `kubectl volplane ...`: it runs it with the words after
// `volplane`. kubectl-volplane run under that name (make build links it)
// answers as `kubectl-volplane __complete`.
const CompletionExecutable = "kubectl_complete-volplane"

// defaultRequestTimeout bounds each request to the gateway and the API
// server unless --request-timeout says otherwise.
const defaultRequestTimeout = 30 * time.Second

// Args are the arguments Run gets for a process started as argv0 with
// args: those of `__complete` when argv0 is CompletionExecutable.
func Args(argv0 string, args []string) []string {
	if strings.TrimSuffix(filepath.Base(argv0), ".exe") == CompletionExecutable {
		return append([]string{cobra.ShellCompRequestCmd}, args...)
	}
	return args
}

// options are the flags every command takes: the kubeconfig's, as
// kubectl takes them (cli-runtime's ConfigFlags), and the gateway's.
type options struct {
	config *genericclioptions.ConfigFlags
	// the gateway
	gatewayURL, gatewayService, caFile string
	timeout                            time.Duration
	s                                  Streams
}

// configFlags are kubectl's flags less four: --certificate-authority is
// the gateway's CA here (the kubeconfig names the API server's), the
// --request-timeout is this plugin's own (a duration, applied to the
// gateway too), and there is no discovery cache (--cache-dir) nor basic
// authentication (--username, --password) to configure.
func configFlags() *genericclioptions.ConfigFlags {
	f := genericclioptions.NewConfigFlags(false)
	f.CAFile, f.Timeout, f.CacheDir, f.Username, f.Password = nil, nil, nil, nil, nil
	return f
}

func (o *options) addFlags(fs *pflag.FlagSet) {
	o.config.AddFlags(fs)
	for name, usage := range map[string]string{
		"as":                       "refused: the volplane gateway does not support impersonation (use a context whose user is that identity)",
		"as-group":                 "refused, as --as",
		"as-uid":                   "refused, as --as",
		"as-user-extra":            "refused, as --as",
		"token":                    "bearer token for the API server, and for the gateway",
		"client-certificate":       "client certificate file for the API server, and for the gateway",
		"client-key":               "client key file of --client-certificate",
		"server":                   "the API server's address (read to find the gateway and to complete names)",
		"tls-server-name":          "server name to check the API server's certificate against (not the gateway's)",
		"insecure-skip-tls-verify": "do not check the API server's certificate (never the gateway's)",
	} {
		if f := fs.Lookup(name); f != nil {
			f.Usage = usage
		}
	}
	fs.StringVar(&o.gatewayURL, "gateway", "", "the gateway's URL, e.g. https://volplane.example.com (default: found by the Service named by --gateway-service)")
	fs.StringVar(&o.gatewayService, "gateway-service", DefaultGatewayService, "NAMESPACE/NAME of the gateway's Service, read for its "+AnnotationGatewayURL+" and "+AnnotationGatewayCA+" annotations or load-balancer address")
	fs.StringVar(&o.caFile, "certificate-authority", "", "PEM file of the CA of the gateway's serving certificate (not the API server's, which the kubeconfig names; default: the Service's "+AnnotationGatewayCA+" annotation, else the system's roots)")
	fs.DurationVar(&o.timeout, "request-timeout", defaultRequestTimeout, "timeout of each request to the gateway and the API server (0: 30s)")
}

// Run runs kubectl-volplane with args (without the program name). Errors
// are for the user: main prints them and exits non-zero.
func Run(ctx context.Context, args []string, s Streams) error {
	root := NewCommand(s)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err != nil && !IsUsage(err) && strings.HasPrefix(err.Error(), "unknown command ") {
		// cobra's, from its command lookup
		return usagef("%w\nSee 'kubectl volplane --help'.", err)
	}
	return err
}

const rootLong = `kubectl volplane shows volplane's view of claims, volumes, drivers,
provisioning operations, reclaims and orphaned backing volumes, explains why
a claim is where it is, and acts on them, through volplane's REST gateway.

Acting: sync pvc|pv NAME, reclaim retry|start VOLUME, volumes delete-backing
VOLUME, orphans delete --driver D --volume-id ID. The two that delete ask
first (y/N) unless --yes.

It sends the gateway the credential the kubeconfig's user sends the API
server (a token, a client certificate); the gateway authorizes it by RBAC:
volplane-viewer reads, volplane-operator also acts.`

// NewCommand is the kubectl-volplane command tree.
func NewCommand(s Streams) *cobra.Command {
	o := &options{config: configFlags(), s: s}
	root := &cobra.Command{
		Use:   "kubectl-volplane",
		Short: "volplane's view of claims, volumes and drivers, and its operator's actions",
		Long:  rootLong,
		Example: `  # Claims of the current namespace, as the binder sees them
  kubectl volplane claims
  # Why is a claim Pending?
  kubectl volplane explain pvc data
  # Sync a claim now (volplane-operator)
  kubectl volplane sync pvc data`,
		Annotations:       map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl volplane"},
		SilenceErrors:     true,
		SilenceUsage:      true,
		ValidArgsFunction: cobra.NoFileCompletions,
		// --version answers as every volplane binary does.
		Version: version.Get().String(),
	}
	root.SetVersionTemplate("kubectl-volplane {{.Version}}\n")
	root.SetIn(s.In)
	root.SetOut(s.Out)
	root.SetErr(s.ErrOut)
	root.SetFlagErrorFunc(flagError)
	root.AddGroup(&cobra.Group{ID: groupRead, Title: "Read (volplane-viewer):"},
		&cobra.Group{ID: groupWrite, Title: "Act (volplane-operator):"},
		&cobra.Group{ID: groupOther, Title: "Other:"})
	root.SetHelpCommandGroupID(groupOther)
	root.SetCompletionCommandGroupID(groupOther)
	o.addFlags(root.PersistentFlags())
	o.registerGlobalCompletions(root)
	root.AddCommand(
		o.claimsCommand(), o.volumesCommand(), o.driversCommand(), o.operationsCommand(),
		o.reclaimsCommand(), o.orphansCommand(), o.explainCommand(), o.timelineCommand(), o.matchCommand(),
		o.syncCommand(),
	)
	disableFlagsInUseLine(root)
	return root
}

func disableFlagsInUseLine(c *cobra.Command) {
	c.DisableFlagsInUseLine = true
	for _, sub := range c.Commands() {
		disableFlagsInUseLine(sub)
	}
}

// Command groups of the help.
const (
	groupRead  = "read"
	groupWrite = "write"
	groupOther = "other"
)

var unknownFlag = regexp.MustCompile(`^unknown (?:shorthand )?flag: (?:--([^ =]+)|'(.)' in )`)

// flagError makes pflag's errors usage errors, and says so when a flag
// belongs to another command.
func flagError(cmd *cobra.Command, err error) error {
	if m := unknownFlag.FindStringSubmatch(err.Error()); m != nil {
		name := "--" + m[1]
		if m[1] == "" {
			name = "-" + m[2]
		}
		if elsewhere(cmd.Root(), cmd, m[1], m[2]) {
			return usagef("%s does not take %s\nSee '%s --help'.", cmd.Name(), name, cmd.CommandPath())
		}
	}
	return usagef("%v\nSee '%s --help'.", err, cmd.CommandPath())
}

// elsewhere: a command of the tree under c other than not takes the flag
// (its name, or its shorthand when name is "").
func elsewhere(c, not *cobra.Command, name, shorthand string) bool {
	if c != not {
		f := c.Flags().Lookup(name)
		if name == "" {
			f = c.Flags().ShorthandLookup(shorthand)
		}
		if f != nil {
			return true
		}
	}
	for _, sub := range c.Commands() {
		if elsewhere(sub, not, name, shorthand) {
			return true
		}
	}
	return false
}

// usageErr is a usage error naming the command's usage line.
func usageErr(cmd *cobra.Command, format string, a ...any) error {
	return usagef("%s\nUsage: %s", fmt.Errorf(format, a...), cmd.UseLine())
}

// noArgs refuses arguments to a command that takes none.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageErr(cmd, "%s takes no arguments, got %q", cmd.Name(), args)
	}
	return nil
}

// runner is what a command runs with.
type runner struct {
	o  *options
	gw *gateway
	// namespace is -n, else the context's; explicitNamespace: -n was given.
	namespace         string
	explicitNamespace bool
	s                 Streams
}

// runner loads the kubeconfig, refuses impersonation and finds the
// gateway.
func (o *options) runner(ctx context.Context) (*runner, error) {
	o.timeout = timeoutOrDefault(o.timeout)
	cfg, ns, err := o.kubeconfig()
	if err != nil {
		return nil, err
	}
	gw, err := o.connect(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &runner{o: o, gw: gw, namespace: ns, explicitNamespace: *o.config.Namespace != "", s: o.s}, nil
}
