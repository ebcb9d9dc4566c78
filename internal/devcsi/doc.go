// Package devcsi is volplane's development CSI driver: a CSI v1.12 plugin
// (Identity, Controller and Node services in one process, or one part per
// process: Options.Mode) whose volumes are directories on the machine
// running it. `make up` runs it as volplane-csi and tests start it
// in-process; in a cluster its controller part runs next to the
// provisioner and its node part as a DaemonSet that registers with the
// kubelet (Registrar) and mounts volumes into pods. The Go module proxy
// serves no upstream test driver, so volplane ships this one. It passes
// csi-sanity (see sanity_test.go).
//
// # Volumes
//
// The driver's name is DefaultName ("hostpath.csi.volplane.io") unless
// Options.Name says otherwise. A volume is <root>/volumes/<id>/ and a
// snapshot a copy of one in <root>/snapshots/<id>/; cloning a volume or
// restoring a snapshot copies the directory. IDs derive from names
// ("vol-" or "snap-" and 32 hex digits of a SHA-256), so one name always
// gets one ID. What exists is recorded one JSON file per object under
// <root>/state/ (volumes/, snapshots/, publications/, stagings/), the
// changed object written atomically (a temporary file renamed) under the
// root's lock, so a restarted driver keeps its volumes, snapshots, stagings and
// publications (an older <root>/state.json is converted at start);
// directories the state does not know (an interrupted copy or delete) are
// removed at start.
//
// Several processes may share a root (the controller part of each
// provisioner replica and the node plugin, through a hostPath): every
// call takes <root>/state/lock with flock(2), exclusive to change the
// state, and reads the state again from disk when the lock file's
// generation shows that another process changed it (store.go). A process
// alone on its root never rereads, so a call costs the same with ten
// volumes or ten thousand.
//
// Capacity is bookkeeping: a volume records the bytes asked for (default
// 1 GiB) and is not held to them. Options.Capacity caps the total handed
// out (ResourceExhausted beyond it) and Options.MaxVolumeSize one volume
// (OutOfRange). Only access type mount is served (block is
// InvalidArgument); every access mode is accepted.
//
// # Topology
//
// The topology key is TopologyKey ("topology.hostpath.csi.volplane.io/node")
// and NodeGetInfo reports {TopologyKey: node ID}. CreateVolume puts a volume
// on the node named by the first preferred segment carrying that key, else
// the first requisite one, else on the driver's own node, and returns it
// as accessible_topology. Any node name is accepted, so one driver can play
// a cluster of nodes for tests; the content is always under this driver's
// root directory.
//
// A volume is on one node, the one its topology names; its volume context
// says which (NodeKey), and a node plugin refuses to stage a volume of
// another node (FailedPrecondition naming it): storage is node-local, as
// the upstream csi-hostpath driver's.
//
// # Staging and publishing
//
// NodeStageVolume bind-mounts the volume's directory on the staging path
// (read-only for a reader-only access mode), NodePublishVolume the staging
// path (or the volume's directory when no staging path is given) on the
// target path, which it creates, read-only when asked, when the process may
// mount, as it does when run as root on Linux: New tries one bind mount
// inside the root directory to find out. Otherwise (PublishSymlink) staging
// is a record and the target path becomes a symbolic link to the volume's
// directory; readonly is recorded but not enforced. NodeUnpublishVolume
// unmounts and removes the target path, NodeUnstageVolume unmounts the
// staging path and leaves it to the CO that made it. There is no
// ControllerPublish. Mount flags and fs_type are ignored: there is no file
// system to make.
//
// # Kubelet registration and health
//
// Run with Options.PluginRegistrationDir serves the kubelet's plugin
// registration API on <dir>/<name>-reg.sock, as node-driver-registrar
// does, and returns an error when the kubelet reports a failed
// registration (so the process exits and its pod restarts); with
// Options.HealthAddress it serves /healthz, which checks that a new
// connection to the CSI endpoint gets a ready Probe (Checker).
//
// # Fault injection
//
// Every call passes through Driver.Faults, which tests program at run time
// (delay every call, fail the next N with a code, hang until released or
// until the caller gives up, with or without the work being done anyway)
// and which counts calls per method. The --fault flag of volplane-csi
// takes the same faults in Faults.Parse's syntax:
//
//	--fault CreateVolume=delay:2s
//	--fault CreateVolume=unavailable:2          (the next 2 calls)
//	--fault CreateVolume=resource_exhausted:*:disk full
//	--fault CreateVolume=hang                   (every call, nothing done)
//	--fault CreateVolume=hang-complete:1        (the next call; the volume is created after the caller gives up)
package devcsi
