package kubectlplugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// Streams are where a run reads (match -f -) and writes.
type Streams struct {
	In          io.Reader
	Out, ErrOut io.Writer
}

// options are the parsed flags of one run.
type options struct {
	// kubeconfig, as kubectl takes it
	kubeconfigPath, context, cluster, user, namespace string
	allNamespaces                                     bool
	// the gateway
	gatewayURL, gatewayService, caFile string
	timeout                            time.Duration
	// output and paging
	output   string
	pageSize int32
	// filters
	phase, class, driver, claimNamespace, kind, state string
	// match
	file string
}

// command is one subcommand.
type command struct {
	name, usage, short string
	// flags it takes besides the common ones.
	flags []string
	run   func(ctx context.Context, r *runner, args []string) error
}

// common flags every command takes.
var common = []string{"kubeconfig", "context", "cluster", "user", "namespace", "gateway", "gateway-service",
	"certificate-authority", "request-timeout", "output", "help"}

// ErrUsage is wrapped by errors in the command line.
var ErrUsage = errors.New("usage")

func flagSet(o *options) *pflag.FlagSet {
	fs := pflag.NewFlagSet("kubectl-volplane", pflag.ContinueOnError)
	fs.SetInterspersed(true)
	fs.StringVar(&o.kubeconfigPath, "kubeconfig", "", "path to the kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)")
	fs.StringVar(&o.context, "context", "", "the kubeconfig context to use (default: the current context)")
	fs.StringVar(&o.cluster, "cluster", "", "the kubeconfig cluster to use")
	fs.StringVar(&o.user, "user", "", "the kubeconfig user whose credential is sent to the gateway")
	fs.StringVarP(&o.namespace, "namespace", "n", "", "namespace (default: the context's)")
	fs.BoolVarP(&o.allNamespaces, "all-namespaces", "A", false, "claims: list claims of every namespace")
	fs.StringVar(&o.gatewayURL, "gateway", "", "the gateway's URL, e.g. https://volplane.example.com (default: found by the Service named by --gateway-service)")
	fs.StringVar(&o.gatewayService, "gateway-service", DefaultGatewayService, "NAMESPACE/NAME of the gateway's Service, read for its "+AnnotationGatewayURL+" and "+AnnotationGatewayCA+" annotations or load-balancer address")
	fs.StringVar(&o.caFile, "certificate-authority", "", "PEM file of the CA of the gateway's serving certificate (not the API server's; default: the Service's "+AnnotationGatewayCA+" annotation, else the system's roots)")
	fs.DurationVar(&o.timeout, "request-timeout", 30*time.Second, "timeout of each request")
	fs.StringVarP(&o.output, "output", "o", "", "output format: json, yaml or wide (default: a table)")
	fs.Int32Var(&o.pageSize, "page-size", 0, "items per request while paging through a list (0: the gateway's default, 500)")
	fs.StringVar(&o.phase, "phase", "", "only claims or volumes in this phase (e.g. Pending, Bound, Available, Released)")
	fs.StringVar(&o.class, "class", "", "only claims or volumes of this StorageClass")
	fs.StringVar(&o.driver, "driver", "", "only objects of this CSI driver (provisioner name)")
	fs.StringVar(&o.claimNamespace, "claim-namespace", "", "only volumes, operations or reclaims of claims in this namespace")
	fs.StringVar(&o.kind, "kind", "", "operations: provision or delete; orphans: volume or pv")
	fs.StringVar(&o.state, "state", "", "reclaims: only this state (pending, running, retained, succeeded, failed, skipped, cancelled)")
	fs.StringVarP(&o.file, "filename", "f", "", "match: the PersistentVolumeClaim (YAML or JSON file; - reads standard input)")
	fs.BoolP("help", "h", false, "help")
	return fs
}

func commands() []*command {
	return []*command{
		{name: "claims", usage: "claims [-n NS | -A] [--phase P] [--class C] [--driver D]", short: "list claims as the binder sees them", flags: []string{"all-namespaces", "phase", "class", "driver", "page-size"}, run: runClaims},
		{name: "volumes", usage: "volumes [--phase P] [--class C] [--driver D] [--claim-namespace NS]", short: "list volumes as the binder sees them", flags: []string{"phase", "class", "driver", "claim-namespace", "page-size"}, run: runVolumes},
		{name: "drivers", usage: "drivers", short: "list the CSI drivers the provisioner serves", flags: []string{"page-size"}, run: runDrivers},
		{name: "operations", usage: "operations [--kind provision|delete] [--driver D] [--claim-namespace NS]", short: "list the provisioner's journaled operations in flight", flags: []string{"kind", "driver", "claim-namespace", "page-size"}, run: runOperations},
		{name: "reclaims", usage: "reclaims [--state S] [--driver D] [--claim-namespace NS]", short: "list reclaims of released volumes", flags: []string{"state", "driver", "claim-namespace", "page-size"}, run: runReclaims},
		{name: "orphans", usage: "orphans [--driver D] [--kind volume|pv]", short: "report backing volumes without a PersistentVolume, and PersistentVolumes without their volume", flags: []string{"driver", "kind", "page-size"}, run: runOrphans},
		{name: "explain", usage: "explain pvc NAME [-n NS]", short: "explain why a claim is Pending (or how it was bound)", flags: []string{"page-size"}, run: runExplain},
		{name: "match", usage: "match -f claim.yaml [-n NS]", short: "what would happen to this claim if it were created now (nothing is written)", flags: []string{"filename"}, run: runMatch},
	}
}

// Run runs kubectl-volplane with args (without the program name). Errors
// are for the user: main prints them and exits non-zero.
func Run(ctx context.Context, args []string, s Streams) error {
	var o options
	fs := flagSet(&o)
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		//lint:ignore ST1005 kubectl's usage hint, printed as kubectl prints it
		return fmt.Errorf("%w: %v\nSee 'kubectl volplane --help'.", ErrUsage, err)
	}
	cmds := commands()
	if help, _ := fs.GetBool("help"); help {
		usage(s.Out, fs, cmds)
		return nil
	}
	if fs.NArg() == 0 {
		usage(s.ErrOut, fs, cmds)
		return fmt.Errorf("%w: a command is required", ErrUsage)
	}
	name := fs.Arg(0)
	i := slices.IndexFunc(cmds, func(c *command) bool { return c.name == name })
	if i < 0 {
		//lint:ignore ST1005 kubectl's usage hint, printed as kubectl prints it
		return fmt.Errorf("%w: unknown command %q\nSee 'kubectl volplane --help'.", ErrUsage, name)
	}
	cmd := cmds[i]
	var bad []string
	fs.Visit(func(f *pflag.Flag) {
		if !slices.Contains(common, f.Name) && !slices.Contains(cmd.flags, f.Name) {
			bad = append(bad, "--"+f.Name)
		}
	})
	if len(bad) > 0 {
		return fmt.Errorf("%w: %s does not take %s\nUsage: kubectl volplane %s", ErrUsage, name, strings.Join(bad, ", "), cmd.usage)
	}
	switch o.output {
	case "", "json", "yaml", "wide":
	default:
		return fmt.Errorf("%w: --output %q: use json, yaml or wide", ErrUsage, o.output)
	}
	if o.pageSize < 0 {
		return fmt.Errorf("%w: --page-size must not be negative", ErrUsage)
	}
	o.timeout = timeoutOrDefault(o.timeout)
	cfg, ns, err := o.kubeconfig()
	if err != nil {
		return err
	}
	gw, err := o.connect(ctx, cfg)
	if err != nil {
		return err
	}
	return cmd.run(ctx, &runner{o: &o, gw: gw, namespace: ns, s: s}, fs.Args()[1:])
}

// runner is what a command runs with.
type runner struct {
	o  *options
	gw *gateway
	// namespace is -n, else the context's.
	namespace string
	s         Streams
}

func usage(w io.Writer, fs *pflag.FlagSet, cmds []*command) {
	fmt.Fprintf(w, "kubectl volplane: volplane's view of claims, volumes, drivers and operations, through its REST gateway.\n\nCommands:\n")
	for _, c := range cmds {
		fmt.Fprintf(w, "  %-12s %s\n", c.name, c.short)
	}
	fmt.Fprintf(w, "\nUsage:\n")
	for _, c := range cmds {
		fmt.Fprintf(w, "  kubectl volplane %s\n", c.usage)
	}
	fmt.Fprintf(w, "\nFlags:\n%s", fs.FlagUsages())
}
