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

// Options configures a Driver.
type Options struct {
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
	// Logger; default slog.Default().
	Logger *slog.Logger
}

// Driver is the dev CSI driver: the Identity, Controller and Node services
// of one node whose volumes are directories under RootDir.
type Driver struct {
	name, nodeID, root string
	maxVolumesPerNode  int64
	capacity, maxSize  int64
	nodeCapacity       int64
	defaultSize        int64
	publishMode        PublishMode
	log                *slog.Logger
	faults             *Faults
	faultSpecs         []string // from Options, for the start-up log

	mu sync.Mutex // guards st and the directories under root
	st *state
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
	if o.RootDir == "" {
		errs = append(errs, errors.New("a root directory is required (--root-dir)"))
	}
	if o.Name == "" {
		o.Name = DefaultName
	}
	if err := validDriverName(o.Name); err != nil {
		errs = append(errs, err)
	}
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
	root, err := filepath.Abs(o.RootDir)
	if err != nil {
		return nil, fmt.Errorf("root directory: %w", err)
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("root directory: %w", err)
	}
	d := &Driver{
		name: o.Name, nodeID: o.NodeID, root: root,
		maxVolumesPerNode: o.MaxVolumesPerNode, capacity: o.Capacity, maxSize: o.MaxVolumeSize, nodeCapacity: o.NodeCapacity,
		defaultSize: o.DefaultVolumeSize, publishMode: o.PublishMode,
		log: o.Logger, faults: faults, faultSpecs: o.Faults,
	}
	if d.st, err = loadState(root, d.log); err != nil {
		return nil, err
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

// Register adds the driver's Identity, Controller and Node services to s,
// for callers that run their own server. The fault injector is then not in
// the path unless s was built with Faults().UnaryServerInterceptor().
func (d *Driver) Register(s *grpc.Server) {
	csi.RegisterIdentityServer(s, &identityServer{d: d})
	csi.RegisterControllerServer(s, &controllerServer{d: d})
	csi.RegisterNodeServer(s, &nodeServer{d: d})
}

// Run serves the CSI services (and gRPC health) on lis until ctx ends,
// then stops gracefully: calls in flight get up to 10s. Every call passes
// through the fault injector. Run closes lis.
func (d *Driver) Run(ctx context.Context, lis net.Listener) error {
	srv := grpcutil.NewCSIServer(d.log, grpc.ChainUnaryInterceptor(d.faults.UnaryServerInterceptor()))
	d.Register(srv.Server)
	srv.SetServing(true)
	d.log.Info("CSI driver serving", "address", lis.Addr().String(), "driver", d.name, "node", d.nodeID,
		"root", d.root, "publish", string(d.publishMode))
	if len(d.faultSpecs) > 0 {
		d.log.Warn("injecting faults", "faults", strings.Join(d.faultSpecs, ","))
	}
	return srv.Serve(ctx, lis, shutdownGrace)
}

// Run is the volplane-csi command: New, listen on o.Endpoint (a stale
// unix socket left by a crash is removed first), Driver.Run.
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
		if fi, err := os.Lstat(path); err == nil && fi.Mode().Type() == fs.ModeSocket {
			if err := os.Remove(path); err != nil {
				return fmt.Errorf("remove stale socket: %w", err)
			}
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return fmt.Errorf("socket directory: %w", err)
		}
	}
	lis, err := grpcutil.Listen(o.Endpoint)
	if err != nil {
		return err
	}
	return d.Run(ctx, lis)
}
