package devcsi

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/volplane/volplane/pkg/grpcutil"
)

const (
	// DefaultName is the driver's CSI name unless Options.Name says
	// otherwise.
	DefaultName = "hostpath.csi.volplane.io"
	// TopologyKey is the topology segment key naming the node a volume is
	// on; NodeGetInfo reports {TopologyKey: node ID}.
	TopologyKey = "topology.hostpath.csi.volplane.io/node"
	// DefaultNodeID is the node ID when none is given and the hostname is
	// unknown.
	DefaultNodeID = "volplane-dev-node"
	// DefaultVolumeSize is the capacity of a volume whose request names
	// none.
	DefaultVolumeSize = 1 << 30
	// Version is reported by GetPluginInfo.
	Version = "0.1.0"
	// shutdownGrace is how long Run lets calls in flight finish.
	shutdownGrace = 10 * time.Second
)

// PublishMode is how NodePublishVolume makes a volume appear at its target
// path.
type PublishMode string

const (
	// PublishAuto bind-mounts when this process may mount (root or
	// CAP_SYS_ADMIN), as New finds out by trying once, and otherwise
	// creates symbolic links.
	PublishAuto PublishMode = ""
	// PublishBind bind-mounts the volume's directory on the target
	// directory, read-only when asked: what a real driver does.
	PublishBind PublishMode = "bind"
	// PublishSymlink makes the target path a symbolic link to the
	// volume's directory. Nothing is mounted, so readonly and mount flags
	// are recorded but not enforced; it is for machines where this
	// process may not mount.
	PublishSymlink PublishMode = "symlink"
)

// Mode is which CSI services a process serves.
type Mode string

const (
	// ModeAll serves Identity, Controller and Node: one process does
	// everything (make up, docker-compose, the tests).
	ModeAll Mode = "all"
	// ModeController serves Identity and Controller: the part next to the
	// provisioner. It mounts nothing.
	ModeController Mode = "controller"
	// ModeNode serves Identity and Node: the part on each node, which the
	// kubelet calls to stage and publish volumes (as root, to mount).
	ModeNode Mode = "node"
)

// Options configures a Driver.
type Options struct {
	// Mode is which services this process serves; default ModeAll.
	// Processes of any modes may share RootDir.
	Mode Mode
	// Name is the CSI driver name; default DefaultName.
	Name string
	// NodeID is this node's ID; default the hostname, else DefaultNodeID.
	NodeID string
	// RootDir holds the state (one JSON file per object under state/) and
	// the volumes' (volumes/<id>/) and snapshots' (snapshots/<id>/)
	// directories; it is created if missing. Required.
	RootDir string
	// Endpoint is where Run listens: unix:///path/csi.sock or host:port.
	// Only Run uses it; Driver.Run takes a listener.
	Endpoint string
	// SocketMode, when not 0, is the permission bits Run gives a unix
	// Endpoint's socket once it listens (connecting needs write
	// permission). A driver running as root next to a client of another
	// user, in a socket directory whose group is the client's (an emptyDir
	// with the pod's fsGroup is set-group-ID), needs 0660; 0 leaves the
	// socket as the umask made it (0755 under the usual 022: root alone
	// may connect). At most 0777; only for unix endpoints.
	SocketMode fs.FileMode
	// MaxVolumesPerNode is reported by NodeGetInfo; 0 means no limit.
	MaxVolumesPerNode int64
	// Capacity is the total bytes the driver hands out: CreateVolume and
	// ControllerExpandVolume fail with ResourceExhausted beyond it and
	// GetCapacity reports what is left. 0 means no limit (GetCapacity then
	// reports the root file system's free space). Sizes are bookkeeping:
	// a volume is a directory and is not held to its capacity.
	Capacity int64
	// NodeCapacity is the bytes each topology segment (node) holds:
	// CreateVolume and ControllerExpandVolume fail with ResourceExhausted
	// when the volume's node has not enough left, and GetCapacity for a
	// segment reports what is left on its node (never more than Capacity
	// leaves, when that is set too). 0 means no limit per node.
	// SetNodeCapacity changes it for one node.
	NodeCapacity int64
	// MaxVolumeSize is the largest volume CreateVolume makes (OutOfRange
	// above it); 0 means no limit.
	MaxVolumeSize int64
	// DefaultVolumeSize is the capacity of a volume whose request gives
	// none; default DefaultVolumeSize.
	DefaultVolumeSize int64
	// PublishMode is how volumes are published; default PublishAuto.
	PublishMode PublishMode
	// Faults are fault specifications in Faults.Parse's syntax, applied
	// at start (the --fault flag).
	Faults []string
	// PluginRegistrationDir is the kubelet's plugin registration directory
	// (/var/lib/kubelet/plugins_registry on the node) as this process sees
	// it. Run then serves the kubelet's plugin registration API there, on
	// <dir>/<Name>-reg.sock, as node-driver-registrar does, and stops with
	// an error when the kubelet reports that the registration failed.
	// Only Run uses it; it needs the Node service (ModeNode or ModeAll).
	PluginRegistrationDir string
	// KubeletRegistrationPath is the path of the CSI socket as the kubelet
	// sees it (e.g. /var/lib/kubelet/plugins/<Name>/csi.sock), which the
	// registration gives the kubelet; required with PluginRegistrationDir.
	KubeletRegistrationPath string
	// HealthAddress is where Run serves HTTP (host:port): /healthz answers
	// 200 while the CSI endpoint answers Probe (and the registration
	// socket, if any, is in place), 503 otherwise, as the livenessprobe
	// sidecar does. Empty: none.
	HealthAddress string
	// NoModifyVolume: the driver advertises no MODIFY_VOLUME, refuses
	// CreateVolume's mutable_parameters and has no ControllerModifyVolume,
	// as a driver without VolumeAttributesClass support (the
	// --no-modify-volume flag).
	NoModifyVolume bool
	// Logger; default slog.Default().
	Logger *slog.Logger
}

// Driver is the dev CSI driver: the Identity, Controller and Node services
// of one node whose volumes are directories under RootDir.
type Driver struct {
	mode               Mode
	name, nodeID, root string
	maxVolumesPerNode  int64
	capacity, maxSize  int64
	nodeCapacity       int64
	defaultSize        int64
	publishMode        PublishMode
	noModifyVolume     bool
	log                *slog.Logger
	faults             *Faults
	faultSpecs         []string // from Options, for the start-up log

	// mu, with the root's lock (acquire), guards st, gen and the
	// directories under root.
	mu    sync.Mutex
	st    *state
	lockf *os.File // <root>/state/lock
	gen   uint64   // the root's generation st reflects
	// nodeCapacities overrides nodeCapacity per node (SetNodeCapacity).
	nodeCapacities map[string]int64
}

// New validates the options, loads the state under RootDir (a restarted
// driver keeps its volumes, snapshots and publications) and finds out how
// it will publish volumes.
func New(o Options) (*Driver, error) {
	return newDriver(o, nil)
}

// newDriver is New, reporting errs (the caller's own checks) with the
// options' errors, all at once.
func newDriver(o Options, errs []error) (*Driver, error) {
	errs = append(errs, o.checkServing()...)
	errs = append(errs, o.checkLimits()...)
	faults := &Faults{}
	for _, spec := range o.Faults {
		if err := faults.Parse(spec); err != nil {
			errs = append(errs, fmt.Errorf("%w (--fault)", err))
		}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return open(o, faults)
}

// checkServing checks, and defaults, what the driver is and how it is
// reached: its root, name, mode, socket and kubelet registration.
func (o *Options) checkServing() []error {
	var errs []error
	if o.RootDir == "" {
		errs = append(errs, errors.New("a root directory is required (--root-dir)"))
	}
	if o.Name == "" {
		o.Name = DefaultName
	}
	switch o.Mode {
	case "":
		o.Mode = ModeAll
	case ModeAll, ModeController, ModeNode:
	default:
		errs = append(errs, fmt.Errorf("mode %q: want all, controller or node (--mode)", o.Mode))
	}
	switch {
	case o.SocketMode&^fs.ModePerm != 0:
		errs = append(errs, fmt.Errorf("socket mode %#o: only permission bits (at most 0777) (--socket-mode)", uint32(o.SocketMode)))
	case o.SocketMode != 0 && !strings.HasPrefix(o.Endpoint, "unix://"):
		errs = append(errs, fmt.Errorf("socket mode %#o is for a unix:// endpoint, not %q (--socket-mode)", uint32(o.SocketMode), o.Endpoint))
	}
	switch {
	case (o.PluginRegistrationDir == "") != (o.KubeletRegistrationPath == ""):
		errs = append(errs, errors.New("kubelet plugin registration needs both --plugin-registration-dir and --kubelet-registration-path"))
	case o.PluginRegistrationDir != "" && o.Mode == ModeController:
		errs = append(errs, errors.New("kubelet plugin registration is for a node plugin: --mode node or all, not controller"))
	case o.KubeletRegistrationPath != "" && !filepath.IsAbs(strings.TrimPrefix(o.KubeletRegistrationPath, "unix://")):
		errs = append(errs, fmt.Errorf("--kubelet-registration-path %q is not an absolute path", o.KubeletRegistrationPath))
	}
	if err := validDriverName(o.Name); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// checkLimits checks, and defaults, the node's identity, the sizes and
// counts the driver enforces, and how it publishes volumes.
func (o *Options) checkLimits() []error {
	var errs []error
	if o.NodeID == "" {
		if h, err := os.Hostname(); err == nil && h != "" {
			o.NodeID = h
		} else {
			o.NodeID = DefaultNodeID
		}
	}
	if len(o.NodeID) > 256 {
		errs = append(errs, fmt.Errorf("node ID %q is longer than 256 bytes (--node-id)", o.NodeID))
	}
	for _, v := range []struct {
		n    int64
		flag string
	}{
		{o.MaxVolumesPerNode, "--max-volumes-per-node"}, {o.Capacity, "--capacity"}, {o.NodeCapacity, "--node-capacity"},
		{o.MaxVolumeSize, "max volume size"}, {o.DefaultVolumeSize, "default volume size"},
	} {
		if v.n < 0 {
			errs = append(errs, fmt.Errorf("%s must not be negative (0 means no limit), got %d", v.flag, v.n))
		}
	}
	if o.DefaultVolumeSize == 0 {
		o.DefaultVolumeSize = DefaultVolumeSize
	}
	if o.MaxVolumeSize > 0 && o.DefaultVolumeSize > o.MaxVolumeSize {
		o.DefaultVolumeSize = o.MaxVolumeSize
	}
	switch o.PublishMode {
	case PublishAuto, PublishBind, PublishSymlink:
	default:
		errs = append(errs, fmt.Errorf("publish mode %q: want bind, symlink or empty for automatic (--publish-mode)", o.PublishMode))
	}
	return errs
}

// open makes the driver of checked options: its root and lock, its
// state, and how it publishes volumes.
func open(o Options, faults *Faults) (*Driver, error) {
	root, err := filepath.Abs(o.RootDir)
	if err != nil {
		return nil, fmt.Errorf("root directory: %w", err)
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("root directory: %w", err)
	}
	lockf, err := openLock(root)
	if err != nil {
		return nil, err
	}
	d := &Driver{
		mode: o.Mode, name: o.Name, nodeID: o.NodeID, root: root,
		maxVolumesPerNode: o.MaxVolumesPerNode, capacity: o.Capacity, maxSize: o.MaxVolumeSize, nodeCapacity: o.NodeCapacity,
		defaultSize: o.DefaultVolumeSize, publishMode: o.PublishMode, noModifyVolume: o.NoModifyVolume,
		log: o.Logger, faults: faults, faultSpecs: o.Faults, lockf: lockf,
	}
	if err := d.start(); err != nil {
		lockf.Close()
		return nil, err
	}
	if d.publishMode == PublishAuto && !d.servesNode() {
		d.publishMode = PublishBind // never used: this process publishes nothing
	}
	if d.publishMode == PublishAuto {
		d.publishMode = PublishSymlink
		if err := probeBindMount(root); err == nil {
			d.publishMode = PublishBind
		} else {
			d.log.Info("bind mounts are not possible here; volumes are published as symbolic links (readonly is not enforced)", "error", err)
		}
	}
	return d, nil
}

// start reads the state and tidies the root under its exclusive lock;
// a node plugin also forgets the stagings and publications of its node
// that are no longer in place (a reboot drops mounts).
func (d *Driver) start() error {
	release, err := d.acquire(true)
	if err != nil {
		return err
	}
	defer release()
	if err := d.st.prepareRoot(d.root, d.log); err != nil {
		return err
	}
	if d.servesNode() {
		d.dropStale()
	}
	return nil
}

// servesNode and servesController say which services this process serves.
func (d *Driver) servesNode() bool       { return d.mode != ModeController }
func (d *Driver) servesController() bool { return d.mode != ModeNode }

// probeBindMount tries one bind mount inside root.
func probeBindMount(root string) error {
	dir, err := os.MkdirTemp(root, "probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	if err := os.Mkdir(src, 0o755); err != nil {
		return err
	}
	if err := os.Mkdir(dst, 0o755); err != nil {
		return err
	}
	if err := bindMount(src, dst, false); err != nil {
		return err
	}
	return unmount(dst)
}

// validDriverName checks the CSI rules: at most 63 characters, alphanumeric,
// '-', '.' and '_' inside, beginning and ending with an alphanumeric.
func validDriverName(n string) error {
	alnum := func(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' }
	ok := len(n) <= 63 && alnum(n[0]) && alnum(n[len(n)-1])
	for i := 0; ok && i < len(n); i++ {
		ok = alnum(n[i]) || strings.IndexByte("-._", n[i]) >= 0
	}
	if !ok {
		return fmt.Errorf("driver name %q: want at most 63 characters, letters, digits, '-', '.' and '_', beginning and ending with a letter or digit (--driver-name)", n)
	}
	return nil
}

// Name is the driver's CSI name.
func (d *Driver) Name() string { return d.name }

// NodeID is the node this driver serves.
func (d *Driver) NodeID() string { return d.nodeID }

// PublishMode is how this driver publishes volumes (bind or symlink, never
// auto).
func (d *Driver) PublishMode() PublishMode { return d.publishMode }

// Faults is the driver's fault injector; program it at any time.
func (d *Driver) Faults() *Faults { return d.faults }

// VolumePath is the directory holding a volume's content.
func (d *Driver) VolumePath(volumeID string) string {
	return filepath.Join(d.root, volumesDir, volumeID)
}

// Mode is which services this driver serves.
func (d *Driver) Mode() Mode { return d.mode }

// Register adds the driver's Identity service and, as its mode says, its
// Controller and Node services to s, for callers that run their own
// server. The fault injector is then not in the path unless s was built
// with Faults().UnaryServerInterceptor().
func (d *Driver) Register(s *grpc.Server) {
	csi.RegisterIdentityServer(s, &identityServer{d: d})
	if d.servesController() {
		csi.RegisterControllerServer(s, &controllerServer{d: d})
	}
	if d.servesNode() {
		csi.RegisterNodeServer(s, &nodeServer{d: d})
	}
}

// Run serves the CSI services (and gRPC health) on lis until ctx ends,
// then stops gracefully: calls in flight get up to 10s. Every call passes
// through the fault injector. Run closes lis.
func (d *Driver) Run(ctx context.Context, lis net.Listener) error {
	srv := grpcutil.NewCSIServer(d.log, grpc.ChainUnaryInterceptor(d.faults.UnaryServerInterceptor()))
	d.Register(srv.Server)
	srv.SetServing(true)
	attrs := []any{"address", lis.Addr().String(), "driver", d.name, "mode", string(d.mode), "node", d.nodeID, "root", d.root}
	if d.servesNode() {
		attrs = append(attrs, "publish", string(d.publishMode))
	}
	d.log.Info("CSI driver serving", attrs...)
	if len(d.faultSpecs) > 0 {
		d.log.Warn("injecting faults", "faults", strings.Join(d.faultSpecs, ","))
	}
	return srv.Serve(ctx, lis, shutdownGrace)
}

// Run is the volplane-csi command: New, listen on o.Endpoint (a stale
// unix socket left by a crash is removed first), Driver.Run, and with
// them the kubelet plugin registration (o.PluginRegistrationDir) and the
// health endpoint (o.HealthAddress). It returns when ctx ends or when one
// of them fails (the kubelet refused the registration, say), so that the
// process exits and its pod restarts.
func Run(ctx context.Context, o Options) error {
	var errs []error
	if o.Endpoint == "" {
		errs = append(errs, errors.New("an endpoint is required (--endpoint unix:///path/csi.sock or host:port)"))
	}
	d, err := newDriver(o, errs)
	if err != nil {
		return err
	}
	if path, ok := strings.CutPrefix(o.Endpoint, "unix://"); ok {
		if err := removeStaleSocket(path); err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return fmt.Errorf("socket directory: %w", err)
		}
	}
	lis, err := grpcutil.Listen(o.Endpoint)
	if err != nil {
		return err
	}
	if path, ok := strings.CutPrefix(o.Endpoint, "unix://"); ok && o.SocketMode != 0 {
		if err := os.Chmod(path, o.SocketMode); err != nil {
			lis.Close()
			return fmt.Errorf("socket mode (--socket-mode): %w", err)
		}
	}
	var health net.Listener
	if o.HealthAddress != "" {
		if health, err = net.Listen("tcp", o.HealthAddress); err != nil {
			lis.Close()
			return fmt.Errorf("health endpoint: %w", err)
		}
	}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return d.Run(ctx, lis) })
	regSocket := ""
	if o.PluginRegistrationDir != "" {
		r := &Registrar{
			Driver: d.name, Endpoint: o.KubeletRegistrationPath, Dir: o.PluginRegistrationDir, Logger: d.log,
		}
		regSocket = r.SocketPath()
		g.Go(func() error { return r.Run(ctx) })
	}
	if health != nil {
		g.Go(func() error { return serveHealth(ctx, health, o.Endpoint, regSocket, d.log) })
	}
	return g.Wait()
}

// removeStaleSocket removes the unix socket a crashed process left at
// path; anything else there is an error.
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("socket %s: %w", path, err)
	case fi.Mode().Type() != fs.ModeSocket:
		return fmt.Errorf("socket %s: something other than a socket is there", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove stale socket: %w", err)
	}
	return nil
}
