// Command volplane-csi runs volplane's development CSI driver: volumes are
// directories under --root-dir, served over CSI (Identity, Controller and
// Node, or one part with --mode) on --endpoint. `make up` runs it for the
// provisioner; in a cluster its controller part runs next to the
// provisioner and its node part in a DaemonSet that registers with the
// kubelet (--plugin-registration-dir); --fault injects failures, delays
// and hangs (see internal/devcsi).
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/cmdutil"
	"github.com/volplane/volplane/pkg/kube"
)

const description = `volplane-csi is volplane's development CSI driver: volumes are directories
under --root-dir, served over CSI (Identity, Controller and Node, or one part with --mode) on
--endpoint. make up runs it for the provisioner; in a cluster its controller part runs next to
the provisioner and its node part in a DaemonSet that registers with the kubelet
(--plugin-registration-dir). --fault injects failures, delays and hangs. It is for development
and tests, not for data you keep.`

func main() {
	var o devcsi.Options
	dir := filepath.Join(os.TempDir(), "volplane-csi")
	cmd := cmdutil.NewCommand("volplane-csi", description)
	fs := cmd.Flags("CSI driver")
	fs.StringVar(&o.Endpoint, "endpoint", "unix://"+filepath.Join(dir, "csi.sock"), "CSI gRPC listen address (unix:///path/csi.sock or host:port)")
	cmdutil.Func(fs, "socket-mode", "octal", "permission bits of the unix --endpoint's socket, in octal, e.g. 0660 so that a client of the socket directory's group may connect (default: as the umask makes it)", func(s string) error {
		m, err := strconv.ParseUint(s, 8, 32)
		if err != nil {
			return fmt.Errorf("want octal permission bits, e.g. 0660: %w", err)
		}
		o.SocketMode = os.FileMode(m)
		return nil
	})
	fs.StringVar(&o.RootDir, "root-dir", filepath.Join(dir, "root"), "directory holding the volumes, the snapshots and their state (kept across restarts)")
	fs.StringVar(&o.NodeID, "node-id", "", "this node's ID, also its topology value; defaults to the hostname")
	fs.StringVar(&o.Name, "driver-name", devcsi.DefaultName, "the CSI driver name")
	cmdutil.Func(fs, "mode", "mode", "the services to serve: all (default), controller (next to the provisioner) or node (the node plugin, which mounts)", func(s string) error {
		o.Mode = devcsi.Mode(s)
		return nil
	})
	reg := cmd.Flags("Node registration")
	reg.StringVar(&o.PluginRegistrationDir, "plugin-registration-dir", "", "register with the kubelet through its plugin registration directory (/var/lib/kubelet/plugins_registry on the node), as mounted here; needs --kubelet-registration-path")
	reg.StringVar(&o.KubeletRegistrationPath, "kubelet-registration-path", "", "the CSI socket's path as the kubelet sees it on the node, e.g. /var/lib/kubelet/plugins/<driver>/csi.sock")
	fs.StringVar(&o.HealthAddress, "health-address", "", "serve HTTP /healthz here (e.g. :9808): 200 while the CSI endpoint answers Probe and the registration socket is in place")
	fs.Int64Var(&o.MaxVolumesPerNode, "max-volumes-per-node", 0, "reported by NodeGetInfo; 0 means no limit")
	fs.Int64Var(&o.Capacity, "capacity", 0, "total bytes handed out to volumes; 0 means no limit")
	fs.Int64Var(&o.NodeCapacity, "node-capacity", 0, "bytes each topology segment (node) holds; CreateVolume beyond it is ResourceExhausted and GetCapacity reports what is left there; 0 means no limit")
	fs.BoolVar(&o.NoModifyVolume, "no-modify-volume", false, "advertise no MODIFY_VOLUME and refuse mutable_parameters, as a driver without VolumeAttributesClass support")
	cmdutil.Func(fs, "publish-mode", "mode", "bind or symlink; default: bind when this process may mount, else symlink", func(s string) error {
		o.PublishMode = devcsi.PublishMode(s)
		return nil
	})
	cmdutil.ListFlag(cmd.Flags(cmdutil.GroupDebug), &o.Faults, "fault", "inject a fault, METHOD=ACTION: delay:2s, <grpc code>[:count|*[:message]] "+
		"(e.g. unavailable:2), hang[:count] (nothing is done), hang-complete[:count] (done after the caller gives up); repeat or comma-separate")
	register := reg.String("register-kubeconfig", "", "register this node's Node and CSINode with the API server of this kubeconfig, as a kubelet would (for setups without one, e.g. docker-compose)")
	logging := cmd.LogFlags()
	os.Exit(cmd.Run(logging, func(ctx context.Context, log *slog.Logger) error {
		o.Logger = log
		if *register != "" {
			if err := registerNode(ctx, *register, o); err != nil {
				return err
			}
		}
		return devcsi.Run(ctx, o)
	}))
}

// registerNode registers the driver's node with the API server.
func registerNode(ctx context.Context, kubeconfig string, o devcsi.Options) error {
	client, _, err := kube.NewClientset(kube.ClientOptions{Kubeconfig: kubeconfig, UserAgent: "volplane-csi"})
	if err != nil {
		return err
	}
	d, err := devcsi.New(o)
	if err != nil {
		return err
	}
	return devcsi.RegisterNode(ctx, client, d.Name(), d.NodeID())
}
