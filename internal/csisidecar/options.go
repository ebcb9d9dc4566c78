package csisidecar

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"

	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"

	"github.com/volplane/volplane/pkg/cmdutil"
	"github.com/volplane/volplane/pkg/sidecar"
)

// Defaults of the sidecar's own flags.
const (
	// DefaultNamespace is volplane's namespace, where the provisioner
	// publishes its CA (--volplane-namespace).
	DefaultNamespace = "volplane-system"
	// MaxMessageSize bounds every message through the sidecar, both ways.
	MaxMessageSize = 4 << 20
)

// DefaultListen is --volplane-listen's default: every address, port
// pkg/sidecar.DefaultPort.
var DefaultListen = ":" + strconv.Itoa(sidecar.DefaultPort)

// Options are the sidecar's settings: csi-provisioner's flags and its
// own.
type Options struct {
	// Provisioner are csi-provisioner's flags that the sidecar reads.
	Provisioner ProvisionerFlags
	// Settings are the request-shaping flags carried in the registration.
	Settings sidecar.Settings

	// Listen is where the driver is served over mutual TLS
	// (--volplane-listen).
	Listen string
	// Namespace is volplane's namespace, whose ConfigMap
	// sidecar.CAConfigMap holds the CA (--volplane-namespace).
	Namespace string
	// CAFile, when set, is the CA bundle instead of the ConfigMap
	// (--volplane-ca-file); it is read again every CARefresh too.
	CAFile string
	// PodNamespace is the registration's namespace when neither
	// $POD_NAMESPACE, $NAMESPACE nor the ServiceAccount's namespace file
	// says it (--volplane-pod-namespace).
	PodNamespace string

	// PodName, when set, is the sidecar's pod instead of $POD_NAME or the
	// hostname (tests running several sidecars in one process).
	PodName string
	// NodeName is the node of a node-deployed sidecar (--node-deployment):
	// $NODE_NAME, read by Start when empty.
	NodeName string

	// Given are the flags set on the command line, by name.
	Given map[string]bool
	// Client, when set, is the API client instead of the one the flags
	// describe (tests).
	Client kubernetes.Interface
	// Logger receives the sidecar's log; nil discards it.
	Logger *slog.Logger
	// Version is what --version prints.
	Version string
}

// description opens --help.
const description = `volplane-csi-sidecar takes csi-provisioner's place in a CSI driver's own pod: change the
image of the driver's csi-provisioner container and keep its arguments. It accepts csi-provisioner
` + ProvisionerVersion + `'s command line (docs/compatibility.md says what it does with each flag), serves the
driver's Identity and Controller methods that volplane's provisioner calls on --volplane-listen,
over TLS 1.3 to volplane's provisioner certificate only, and registers the driver with a Lease
in its namespace that pins its serving certificate (docs/sidecar.md).`

// NewCommand is the sidecar's command line, parsed into o:
// csi-provisioner v6.3.0's flags (--version and --help are the General
// group's) and the sidecar's own (--volplane-*).
func NewCommand(o *Options) *cmdutil.Command {
	cmd := cmdutil.NewCommand("volplane-csi-sidecar", description)
	addProvisionerFlags(cmd.Flags("csi-provisioner "+ProvisionerVersion), &o.Provisioner, &o.Settings)
	fs := cmd.Flags("volplane")
	fs.StringVar(&o.Listen, "volplane-listen", DefaultListen, "where the driver's Identity and Controller services are served to volplane's provisioner, over mutual TLS")
	fs.StringVar(&o.Namespace, "volplane-namespace", DefaultNamespace, "volplane's namespace, whose ConfigMap "+sidecar.CAConfigMap+" holds the CA of the provisioner's client certificate")
	fs.StringVar(&o.CAFile, "volplane-ca-file", "", "a PEM file of the CA of the provisioner's client certificate, instead of the ConfigMap")
	fs.StringVar(&o.PodNamespace, "volplane-pod-namespace", "", "the registration's namespace when $POD_NAMESPACE, $NAMESPACE and the ServiceAccount's namespace file are all missing")
	return cmd
}

// Parse parses args (without the program name) into Options, as the
// command does but without printing: --help and --version are errors.
func Parse(args []string) (Options, error) {
	var o Options
	cmd := NewCommand(&o)
	fs := cmd.FlagSet()
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if err := cmd.NoArgs(); err != nil {
		return o, err
	}
	o.Finish(fs)
	return o, nil
}

// Finish completes o once fs, the command's flags, parsed: which flags
// were given, and the carried settings.
func (o *Options) Finish(fs *pflag.FlagSet) {
	o.Given = map[string]bool{}
	fs.Visit(func(f *pflag.Flag) { o.Given[f.Name] = true })
	o.carry()
	// Read here, before Validate, which refuses --node-deployment without
	// it: the command validates before Start.
	if o.Provisioner.NodeDeployment && o.NodeName == "" {
		o.NodeName = os.Getenv("NODE_NAME")
	}
}

// carry moves the parsed flags whose form differs from pkg/sidecar's
// Settings into it.
func (o *Options) carry() {
	if o.Provisioner.UUIDLength > 0 {
		o.Settings.VolumeNameUUIDLength = o.Provisioner.UUIDLength
	}
	it := o.Provisioner.ImmediateTopology
	o.Settings.ImmediateTopology = &it
	prevent := o.Provisioner.PreventVolumeModeConversion
	o.Settings.PreventVolumeModeConversion = &prevent
	o.Settings.Timeout = o.Provisioner.Timeout
	o.Settings.ControllerPublishReadOnly = o.Provisioner.PublishReadOnly
	o.Settings.NodeDeployment = o.Provisioner.NodeDeployment
	if len(o.Settings.FeatureGates) == 0 {
		o.Settings.FeatureGates = nil
	}
}

// Refusals are the errors of the flags set to values whose behaviour
// volplane lacks, or to values csi-provisioner itself refuses; each names
// its flag and what to do.
func (o Options) Refusals() []error {
	p := o.Provisioner
	var errs []error
	refuse := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if p.NodeDeployment && o.NodeName == "" {
		refuse("--node-deployment needs the NODE_NAME environment variable (the downward API's spec.nodeName), as csi-provisioner does")
	}
	if err := sidecar.CheckGates(o.Settings.FeatureGates); err != nil {
		refuse("--feature-gates is refused, as csi-provisioner %s refuses it: %v", ProvisionerVersion, err)
	}
	if n := p.UUIDLength; n != -1 && (n < 1 || n > 32) {
		refuse("--volume-name-uuid-length=%d is refused: want -1 (the whole UID) or 1 to 32 characters", n)
	}
	if p.HTTPEndpoint != "" && p.MetricsAddress != "" {
		refuse("--http-endpoint and --metrics-address are both set: only one of them can be set, as with csi-provisioner")
	}
	if p.WorkerThreads == 0 {
		refuse("--worker-threads=0 is refused: it caps the calls in flight; give at least 1")
	}
	if p.Timeout <= 0 {
		refuse("--timeout=%s is refused: every call through the sidecar needs a positive deadline", p.Timeout)
	}
	if p.LoggingFormat != "text" && p.LoggingFormat != "json" {
		refuse("--logging-format=%q is refused: the formats are text and json", p.LoggingFormat)
	}
	if p.CSIAddress == "" {
		refuse("--csi-address is empty: give the driver's socket")
	}
	if o.Listen == "" {
		refuse("--volplane-listen is empty: give the address the provisioner dials, e.g. %s", DefaultListen)
	}
	return errs
}

// NotNeeded are the log lines, one per Accepted flag given on the command
// line: "flag --X is accepted and not needed: why".
func (o Options) NotNeeded() []string {
	var lines []string
	for _, f := range Flags {
		if f.Class == Accepted && o.Given[f.Name] {
			lines = append(lines, fmt.Sprintf("flag --%s is accepted and not needed: %s", f.Name, f.Does))
		}
	}
	return lines
}

// Validate is Refusals joined.
func (o Options) Validate() error { return errors.Join(o.Refusals()...) }

// LogLevel is the slog level of -v: 0 to 3 info, 4 and more debug.
func (p ProvisionerFlags) LogLevel() slog.Level {
	if p.Verbosity >= 4 {
		return slog.LevelDebug
	}
	return slog.LevelInfo
}
