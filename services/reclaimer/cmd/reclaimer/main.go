// Command reclaimer runs a volplane reclaimer replica: it carries out the
// reclaim policy (Retain, Recycle, Delete) of Released PersistentVolumes,
// with each reclaim journaled in etcd.
package main

import (
	"context"
	"log/slog"
	"os"
	"strings"

	"github.com/volplane/volplane/pkg/cmdutil"
	"github.com/volplane/volplane/services/reclaimer"
)

const description = `reclaimer is a replica of volplane's reclaimer: it carries out the reclaim
policy of the PersistentVolumes the binder finds Released, as Kubernetes' PersistentVolume
controller does. Retain leaves the volume alone; Delete removes the backing volume (CSI
DeleteVolume through the provisioner) and then the PersistentVolume; Recycle scrubs the
volume's data (with a recycler pod, or on this node) and makes it Available again. Each reclaim
is journaled in etcd and re-checks the claim and volume against the API server right before it
acts, so that no live claim's data is ever deleted.`

func main() {
	// reclaimer scrub DIR: the default recycler pod's command (volplane's
	// image is the recycler's, so a cluster pulls nothing else to recycle).
	if len(os.Args) > 1 && os.Args[1] == reclaimer.ScrubCommand {
		os.Exit(scrub(os.Args[2:]))
	}
	var o reclaimer.Options
	cmd := cmdutil.NewCommand(reclaimer.Service, description)
	fs := cmd.Flags("Reclaimer")
	fs.StringVar(&o.ProvisionerAddress, "provisioner-address", "", "gRPC address of the provisioner service, which deletes the CSI volumes of the drivers it serves; empty leaves every CSI volume to its own deleter")
	fs.DurationVar(&o.DriversRefreshPeriod, "drivers-refresh-period", reclaimer.DefaultDriversRefreshPeriod, "how often the provisioner's served drivers are read again")
	fs.IntVar(&o.Workers, "workers", reclaimer.DefaultWorkers, "number of reclaims carried out at once")
	fs.DurationVar(&o.RetryIntervalStart, "retry-interval-start", reclaimer.DefaultRetryIntervalStart, "first delay before a failed reclaim step is retried; doubles per failure")
	fs.DurationVar(&o.RetryIntervalMax, "retry-interval-max", reclaimer.DefaultRetryIntervalMax, "longest delay between retries of a failed reclaim step")
	fs.DurationVar(&o.TakeoverPeriod, "takeover-period", reclaimer.DefaultTakeoverPeriod, "how often the journal is scanned for reclaims whose replica stopped")
	fs.DurationVar(&o.RecordTTL, "record-ttl", reclaimer.DefaultRecordTTL, "how long a finished, retained or skipped reclaim stays visible in the API")
	fs.BoolVar(&o.Standalone, "standalone", false, "run without volplane's binder, beside kube-controller-manager's: watch PersistentVolumes and delete the Released volumes with policy Delete of the provisioner's drivers, as external-provisioner does (Recycle is left to kube-controller-manager); needs --provisioner-address")
	rec := cmd.Flags("Recycle")
	rec.StringVar((*string)(&o.RecycleMode), "recycle-mode", string(reclaimer.RecyclePod), "how Recycle scrubs a volume: pod (a recycler pod, as Kubernetes does; hostPath and NFS) or node-local (this process scrubs hostPath volumes and the local volumes of --node-name)")
	rec.StringVar(&o.NodeName, "node-name", os.Getenv("NODE_NAME"), "the node this replica runs on (required with --recycle-mode=node-local); defaults to $NODE_NAME")
	cmdutil.Func(rec, "recycle-path-prefixes", "paths", "comma-separated directories under which --recycle-mode=node-local may scrub a volume (its path, symbolic links resolved, must lie strictly below one); required with node-local, refused with pod", func(v string) error {
		o.RecyclePathPrefixes = append(o.RecyclePathPrefixes, strings.FieldsFunc(v, func(r rune) bool { return r == ',' })...)
		return nil
	})
	rec.StringVar(&o.RecyclerPodTemplate, "recycler-pod-template", "", "file with a Pod (YAML or JSON) used as the recycler pod; its volume \"vol\" gets the recycled volume's source")
	rec.StringVar(&o.RecyclerImage, "recycler-image", "", "image of the default recycler pod (default "+reclaimer.DefaultRecyclerImage+", volplane's own: its reclaimer scrubs; an image not named volplane runs Kubernetes' /bin/sh command, e.g. busybox); exclusive with --recycler-pod-template; --recycle-mode=pod only")
	rec.StringVar(&o.RecyclerNamespace, "recycler-namespace", reclaimer.DefaultRecyclerNamespace, "namespace of the recycler pods")
	rec.DurationVar(&o.RecyclerMinimumTimeout, "recycler-minimum-timeout", reclaimer.DefaultRecyclerMinimumTimeout, "least activeDeadlineSeconds of a recycler pod")
	rec.DurationVar(&o.RecyclerTimeoutIncrement, "recycler-timeout-increment", reclaimer.DefaultRecyclerTimeoutIncrement, "recycler pod deadline per GiB of the volume, when above the minimum")
	o.AddFlags(cmd, "127.0.0.1:7704", "the reclaim journal")
	logging := cmd.LogFlags()
	os.Exit(cmd.Run(logging, func(ctx context.Context, log *slog.Logger) error {
		o.Logger = log
		return reclaimer.Run(ctx, o)
	}))
}
