// Command reclaimer runs a volplane reclaimer replica: it carries out the
// reclaim policy (Retain, Recycle, Delete) of Released PersistentVolumes,
// with each reclaim journaled in etcd.
package main

import (
	"context"
	"flag"
	"log/slog"
	"os"
	"strings"

	"github.com/volplane/volplane/pkg/cmdutil"
	"github.com/volplane/volplane/services/reclaimer"
)

func main() {
	var o reclaimer.Options
	o.AddFlags("127.0.0.1:7704", "the reclaim journal")
	flag.StringVar(&o.ProvisionerAddress, "provisioner-address", "", "gRPC address of the provisioner service, which deletes the CSI volumes of the drivers it serves; empty leaves every CSI volume to its own deleter")
	flag.DurationVar(&o.DriversRefreshPeriod, "drivers-refresh-period", reclaimer.DefaultDriversRefreshPeriod, "how often the provisioner's served drivers are read again")
	flag.StringVar((*string)(&o.RecycleMode), "recycle-mode", string(reclaimer.RecyclePod), "how Recycle scrubs a volume: pod (a recycler pod, as Kubernetes does; hostPath and NFS) or node-local (this process scrubs hostPath volumes and the local volumes of --node-name)")
	flag.StringVar(&o.NodeName, "node-name", os.Getenv("NODE_NAME"), "the node this replica runs on (required with --recycle-mode=node-local); defaults to $NODE_NAME")
	flag.Func("recycle-path-prefixes", "comma-separated directories under which --recycle-mode=node-local may scrub a volume (its path, symbolic links resolved, must lie strictly below one); required with node-local, refused with pod", func(v string) error {
		o.RecyclePathPrefixes = append(o.RecyclePathPrefixes, strings.FieldsFunc(v, func(r rune) bool { return r == ',' })...)
		return nil
	})
	flag.StringVar(&o.RecyclerPodTemplate, "recycler-pod-template", "", "file with a Pod (YAML or JSON) used as the recycler pod; its volume \"vol\" gets the recycled volume's source")
	flag.StringVar(&o.RecyclerImage, "recycler-image", "", "image of the default recycler pod (default "+reclaimer.DefaultRecyclerImage+"); exclusive with --recycler-pod-template; --recycle-mode=pod only")
	flag.StringVar(&o.RecyclerNamespace, "recycler-namespace", reclaimer.DefaultRecyclerNamespace, "namespace of the recycler pods")
	flag.DurationVar(&o.RecyclerMinimumTimeout, "recycler-minimum-timeout", reclaimer.DefaultRecyclerMinimumTimeout, "least activeDeadlineSeconds of a recycler pod")
	flag.DurationVar(&o.RecyclerTimeoutIncrement, "recycler-timeout-increment", reclaimer.DefaultRecyclerTimeoutIncrement, "recycler pod deadline per GiB of the volume, when above the minimum")
	flag.IntVar(&o.Workers, "workers", reclaimer.DefaultWorkers, "number of reclaims carried out at once")
	flag.DurationVar(&o.RetryIntervalStart, "retry-interval-start", reclaimer.DefaultRetryIntervalStart, "first delay before a failed reclaim step is retried; doubles per failure")
	flag.DurationVar(&o.RetryIntervalMax, "retry-interval-max", reclaimer.DefaultRetryIntervalMax, "longest delay between retries of a failed reclaim step")
	flag.DurationVar(&o.TakeoverPeriod, "takeover-period", reclaimer.DefaultTakeoverPeriod, "how often the journal is scanned for reclaims whose replica stopped")
	flag.DurationVar(&o.RecordTTL, "record-ttl", reclaimer.DefaultRecordTTL, "how long a finished, retained or skipped reclaim stays visible in the API")
	logging := cmdutil.LogFlags()
	flag.Parse()
	os.Exit(cmdutil.Run(reclaimer.Service, logging, func(ctx context.Context, log *slog.Logger) error {
		o.Logger = log
		return reclaimer.Run(ctx, o)
	}))
}
