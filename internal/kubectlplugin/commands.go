package kubectlplugin

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// listSpec says how a list is shown.
type listSpec struct {
	// field is the answer's list, e.g. "claims".
	field string
	cols  []column
	// none is said (on standard error) for an empty table.
	none string
	// -o name prints kind/name(item).
	kind schema.GroupVersionKind
	name func(*object) string
}

// printList writes a list (every page merged) as -o asks: a table (an
// empty one is a line on standard error, as kubectl says "No resources
// found"), kind/name lines, or the answer through cli-runtime's printers.
func (r *runner) printList(out *output, l *object, spec listSpec) error {
	items := l.list(spec.field)
	switch {
	case out.human():
		if len(items) == 0 {
			fmt.Fprintln(r.s.ErrOut, spec.none)
			return nil
		}
		return out.printTable(r.s.Out, items, spec.cols)
	case out.format() == "name":
		names := make([]string, 0, len(items))
		for _, it := range items {
			if o, _ := it.(*object); o != nil && spec.name(o) != "" {
				names = append(names, spec.name(o))
			}
		}
		return out.printNames(r.s.Out, spec.kind, names...)
	}
	return out.printAnswer(r.s.Out, l)
}

// listFlags are the flags every list takes besides its filters.
type listFlags struct {
	pageSize int32
}

func (f *listFlags) add(cmd *cobra.Command) {
	cmd.Flags().Int32Var(&f.pageSize, "page-size", 0, "items per request while paging through the list (0: the gateway's default, 500)")
}

func (f *listFlags) validate() error {
	if f.pageSize < 0 {
		return usagef("--page-size must not be negative")
	}
	return nil
}

func setIf(q url.Values, k, v string) {
	if v != "" {
		q.Set(k, v)
	}
}

// claimPhases, volumePhases are the phases --phase completes.
var (
	claimPhases  = []string{"Pending", "Bound", "Lost"}
	volumePhases = []string{"Pending", "Available", "Bound", "Released", "Failed"}
)

func (o *options) claimsCommand() *cobra.Command {
	var lf listFlags
	var phase, class, driver string
	var all bool
	cmd := &cobra.Command{
		Use:     "claims [-n NAMESPACE | -A] [--phase PHASE] [--class CLASS] [--driver DRIVER]",
		Aliases: []string{"claim"},
		GroupID: groupRead,
		Short:   "List claims as the binder sees them",
		Long: `List the PersistentVolumeClaims of a namespace (-n, else the context's), or of
every namespace (-A), as volplane's binder sees them: phase, volume, capacity,
class; -o wide adds the request, volume mode, provisioner and selected node.

Route: GET /v1/namespaces/{namespace}/claims, GET /v1/claims (-A).`,
		Example: `  # Pending claims of every namespace
  kubectl volplane claims -A --phase Pending
  # Names only, to feed kubectl
  kubectl volplane claims --phase Pending -o name | xargs kubectl describe
  # The volume of each claim, without the table
  kubectl volplane claims -o jsonpath='{range .claims[*]}{.name}{"\t"}{.volumeName}{"\n"}{end}'`,
		Args: noArgs,
	}
	out := newOutput(cmd, "", true, false)
	lf.add(cmd)
	cmd.Flags().BoolVarP(&all, "all-namespaces", "A", false, "list the claims of every namespace")
	cmd.Flags().StringVar(&phase, "phase", "", "only claims in this phase: "+strings.Join(claimPhases, ", "))
	cmd.Flags().StringVar(&class, "class", "", "only claims of this StorageClass")
	cmd.Flags().StringVar(&driver, "driver", "", "only claims of this provisioner (CSI driver): their class's, or the storage-provisioner annotation's")
	o.completeStatic(cmd, "phase", claimPhases)
	o.completeClasses(cmd)
	o.completeDrivers(cmd, "driver")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := firstErr(out.validate(), lf.validate()); err != nil {
			return err
		}
		r, err := o.runner(cmd.Context())
		if err != nil {
			return err
		}
		q := url.Values{}
		setIf(q, "phase", phase)
		setIf(q, "storageClassName", class)
		setIf(q, "driver", driver)
		path := "/v1/namespaces/" + url.PathEscape(r.namespace) + "/claims"
		none := fmt.Sprintf("No claims found in %s namespace.", r.namespace)
		if all {
			path, none = "/v1/claims", "No claims found."
		}
		l, err := r.gw.list(cmd.Context(), path, q, listOptions{field: "claims", pageSize: lf.pageSize})
		if err != nil {
			return err
		}
		cols := []column{
			{header: "NAME", cell: func(o *object) string { return o.str("name") }},
			{header: "STATUS", cell: func(o *object) string { return o.str("phase") }},
			{header: "VOLUME", cell: func(o *object) string { return o.str("volumeName") }},
			{header: "CAPACITY", cell: func(o *object) string { return size(o.int("capacityBytes")) }},
			{header: "ACCESS MODES", cell: func(o *object) string { return modes(o.strs("accessModes")) }},
			{header: "STORAGECLASS", cell: func(o *object) string { return o.str("storageClassName") }},
			{header: "AGE", cell: func(o *object) string { return age(o.time("createTime")) }},
			{header: "REQUEST", wide: true, cell: func(o *object) string { return size(o.int("requestedBytes")) }},
			{header: "VOLUMEMODE", wide: true, cell: func(o *object) string { return o.str("volumeMode") }},
			{header: "PROVISIONER", wide: true, cell: func(o *object) string { return o.str("storageProvisioner") }},
			{header: "SELECTED NODE", wide: true, cell: func(o *object) string { return o.str("selectedNode") }},
		}
		if all {
			cols = append([]column{{header: "NAMESPACE", cell: func(o *object) string { return o.str("namespace") }}}, cols...)
		}
		return r.printList(out, l, listSpec{field: "claims", cols: cols, none: none, kind: kindClaim, name: func(o *object) string { return o.str("name") }})
	}
	return cmd
}

func (o *options) volumesCommand() *cobra.Command {
	var lf listFlags
	var phase, class, driver, claimNamespace string
	cmd := &cobra.Command{
		Use:     "volumes [--phase PHASE] [--class CLASS] [--driver DRIVER] [--claim-namespace NAMESPACE]",
		Aliases: []string{"volume"},
		GroupID: groupRead,
		Short:   "List volumes as the binder sees them",
		Long: `List the PersistentVolumes as volplane's binder sees them: capacity, access
modes, reclaim policy, phase, claim, class; -o wide adds the volume mode, the
provisioner that made it and the phase's message.

Route: GET /v1/volumes.`,
		Example: `  # Released volumes of a driver
  kubectl volplane volumes --phase Released --driver hostpath.csi.volplane.io
  # Volumes whose claims are in namespace team, as YAML
  kubectl volplane volumes --claim-namespace team -o yaml`,
		Args: noArgs,
	}
	out := newOutput(cmd, "", true, false)
	lf.add(cmd)
	cmd.Flags().StringVar(&phase, "phase", "", "only volumes in this phase: "+strings.Join(volumePhases, ", "))
	cmd.Flags().StringVar(&class, "class", "", "only volumes of this StorageClass")
	cmd.Flags().StringVar(&driver, "driver", "", "only volumes of this CSI driver (spec.csi.driver, else the provisioned-by annotation)")
	cmd.Flags().StringVar(&claimNamespace, "claim-namespace", "", "only volumes whose claimRef is in this namespace")
	o.completeStatic(cmd, "phase", volumePhases)
	o.completeClasses(cmd)
	o.completeDrivers(cmd, "driver")
	o.completeNamespaces(cmd, "claim-namespace")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := firstErr(out.validate(), lf.validate()); err != nil {
			return err
		}
		r, err := o.runner(cmd.Context())
		if err != nil {
			return err
		}
		q := url.Values{}
		setIf(q, "phase", phase)
		setIf(q, "storageClassName", class)
		setIf(q, "driver", driver)
		setIf(q, "claimNamespace", claimNamespace)
		l, err := r.gw.list(cmd.Context(), "/v1/volumes", q, listOptions{field: "volumes", pageSize: lf.pageSize})
		if err != nil {
			return err
		}
		return r.printList(out, l, listSpec{field: "volumes", none: "No volumes found.", kind: kindVolume, name: func(o *object) string { return o.str("name") }, cols: []column{
			{header: "NAME", cell: func(o *object) string { return o.str("name") }},
			{header: "CAPACITY", cell: func(o *object) string { return size(o.int("capacityBytes")) }},
			{header: "ACCESS MODES", cell: func(o *object) string { return modes(o.strs("accessModes")) }},
			{header: "RECLAIM POLICY", cell: func(o *object) string { return o.str("reclaimPolicy") }},
			{header: "STATUS", cell: func(o *object) string { return o.str("phase") }},
			{header: "CLAIM", cell: func(o *object) string { return ref(o.obj("claimRef").str("namespace"), o.obj("claimRef").str("name")) }},
			{header: "STORAGECLASS", cell: func(o *object) string { return o.str("storageClassName") }},
			{header: "AGE", cell: func(o *object) string { return age(o.time("createTime")) }},
			{header: "VOLUMEMODE", wide: true, cell: func(o *object) string { return o.str("volumeMode") }},
			{header: "PROVISIONED BY", wide: true, cell: func(o *object) string { return o.str("provisionedBy") }},
			{header: "MESSAGE", wide: true, cell: func(o *object) string { return o.str("message") }},
		}})
	}
	cmd.AddCommand(o.deleteBackingCommand())
	return cmd
}

func (o *options) driversCommand() *cobra.Command {
	var lf listFlags
	cmd := &cobra.Command{
		Use:     "drivers",
		Aliases: []string{"driver"},
		GroupID: groupRead,
		Short:   "List the CSI drivers the provisioner serves",
		Long: `List the CSI drivers volplane's provisioner serves: the provisioner name a
StorageClass names, the driver, its version, whether it answers its probes;
-o wide adds its controller capabilities.

Route: GET /v1/drivers.`,
		Example: `  kubectl volplane drivers -o wide
  # Drivers that are not ready
  kubectl volplane drivers -o jsonpath='{range .drivers[?(@.ready==false)]}{.provisionerName}{"\n"}{end}'`,
		Args: noArgs,
	}
	out := newOutput(cmd, "", true, false)
	lf.add(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := firstErr(out.validate(), lf.validate()); err != nil {
			return err
		}
		r, err := o.runner(cmd.Context())
		if err != nil {
			return err
		}
		l, err := r.gw.list(cmd.Context(), "/v1/drivers", nil, listOptions{field: "drivers", pageSize: lf.pageSize})
		if err != nil {
			return err
		}
		return r.printList(out, l, listSpec{field: "drivers", none: "No drivers found.", kind: kindCSIDriver, name: func(o *object) string { return o.str("driverName") }, cols: []column{
			{header: "NAME", cell: func(o *object) string { return o.str("provisionerName") }},
			{header: "DRIVER", cell: func(o *object) string { return o.str("driverName") }},
			{header: "VERSION", cell: func(o *object) string { return o.str("vendorVersion") }},
			{header: "READY", cell: func(o *object) string { return o.str("ready") }},
			{header: "ENDPOINT", cell: func(o *object) string { return o.str("endpoint") }},
			{header: "MESSAGE", cell: func(o *object) string { return o.str("message") }},
			{header: "CAPABILITIES", wide: true, cell: func(o *object) string { return strings.Join(o.strs("capabilities"), ",") }},
		}})
	}
	return cmd
}

// operationKinds are what operations --kind takes.
var operationKinds = []string{"provision", "delete"}

func (o *options) operationsCommand() *cobra.Command {
	var lf listFlags
	var kind, driver, claimNamespace string
	cmd := &cobra.Command{
		Use:     "operations [--kind provision|delete] [--driver DRIVER] [--claim-namespace NAMESPACE]",
		Aliases: []string{"operation"},
		GroupID: groupRead,
		Short:   "List the provisioner's journaled operations in flight",
		Long: `List the provisioner's operations still in flight (journaled in etcd): a
volume being created or deleted, its attempts, the replica holding it, and
the driver's last error. -o name prints the PersistentVolume each makes or
deletes.

Route: GET /v1/provisioner/operations.`,
		Example: `  # Provisionings of namespace team that keep failing
  kubectl volplane operations --kind provision --claim-namespace team`,
		Args: noArgs,
	}
	out := newOutput(cmd, "", true, false)
	lf.add(cmd)
	cmd.Flags().StringVar(&kind, "kind", "", "only operations of this kind: provision or delete")
	cmd.Flags().StringVar(&driver, "driver", "", "only operations of this driver")
	cmd.Flags().StringVar(&claimNamespace, "claim-namespace", "", "only operations of claims in this namespace")
	o.completeStatic(cmd, "kind", operationKinds)
	o.completeDrivers(cmd, "driver")
	o.completeNamespaces(cmd, "claim-namespace")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := firstErr(out.validate(), lf.validate()); err != nil {
			return err
		}
		r, err := o.runner(cmd.Context())
		if err != nil {
			return err
		}
		q := url.Values{}
		setIf(q, "kind", kind)
		setIf(q, "driver", driver)
		setIf(q, "claimNamespace", claimNamespace)
		l, err := r.gw.list(cmd.Context(), "/v1/provisioner/operations", q, listOptions{field: "operations", pageSize: lf.pageSize})
		if err != nil {
			return err
		}
		return r.printList(out, l, listSpec{field: "operations", none: "No operations in flight.", kind: kindVolume, name: func(o *object) string { return o.str("volumeName") }, cols: []column{
			{header: "KIND", cell: func(o *object) string { return o.str("kind") }},
			{header: "VOLUME", cell: func(o *object) string { return o.str("volumeName") }},
			{header: "CLAIM", cell: func(o *object) string { return ref(o.str("claimNamespace"), o.str("claimName")) }},
			{header: "DRIVER", cell: func(o *object) string { return o.str("provisioner") }},
			{header: "ATTEMPTS", cell: func(o *object) string { return o.str("attempts") }},
			{header: "OWNER", cell: func(o *object) string { return o.str("owner") }},
			{header: "AGE", cell: func(o *object) string { return age(o.time("startTime")) }},
			{header: "LAST ERROR", cell: func(o *object) string { return o.str("lastError") }},
		}})
	}
	return cmd
}

// states are the reclaim states --state takes.
var states = []string{"pending", "running", "retained", "succeeded", "failed", "skipped", "cancelled"}

// stateQuery is --state as the gateway takes it (STATE_FAILED).
func stateQuery(state string) (string, error) {
	s := strings.ToLower(strings.TrimPrefix(strings.ToUpper(state), "STATE_"))
	if s == "" {
		return "", nil
	}
	if !slices.Contains(states, s) {
		return "", usagef("--state %q: use one of %s", state, strings.Join(states, ", "))
	}
	return "STATE_" + strings.ToUpper(s), nil
}

func (o *options) reclaimsCommand() *cobra.Command {
	var lf listFlags
	var state, driver, claimNamespace string
	cmd := &cobra.Command{
		Use:     "reclaims [--state STATE] [--driver DRIVER] [--claim-namespace NAMESPACE]",
		Aliases: []string{"reclaim"},
		GroupID: groupRead,
		Short:   "List reclaims of released volumes; retry or start one",
		Long: `List the reclaims of released volumes (their policy carried out: Retain,
Recycle, Delete): state, method, attempts, message. -o name prints each
reclaim's PersistentVolume, which 'reclaim retry' takes.

Route: GET /v1/reclaims. The subcommands act (volplane-operator).`,
		Example: `  # Failed reclaims
  kubectl volplane reclaims --state failed
  # Retry every failed reclaim now
  kubectl volplane reclaims --state failed -o name | xargs -n1 kubectl volplane reclaim retry`,
		Args: noArgs,
	}
	out := newOutput(cmd, "", true, false)
	lf.add(cmd)
	cmd.Flags().StringVar(&state, "state", "", "only reclaims in this state: "+strings.Join(states, ", "))
	cmd.Flags().StringVar(&driver, "driver", "", "only reclaims of volumes of this CSI driver")
	cmd.Flags().StringVar(&claimNamespace, "claim-namespace", "", "only reclaims of claims that were in this namespace")
	o.completeStatic(cmd, "state", states)
	o.completeDrivers(cmd, "driver")
	o.completeNamespaces(cmd, "claim-namespace")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		st, err := stateQuery(state)
		if err = firstErr(out.validate(), lf.validate(), err); err != nil {
			return err
		}
		r, err := o.runner(cmd.Context())
		if err != nil {
			return err
		}
		q := url.Values{}
		setIf(q, "state", st)
		setIf(q, "driver", driver)
		setIf(q, "claimNamespace", claimNamespace)
		l, err := r.gw.list(cmd.Context(), "/v1/reclaims", q, listOptions{field: "reclaims", pageSize: lf.pageSize})
		if err != nil {
			return err
		}
		return r.printList(out, l, listSpec{field: "reclaims", none: "No reclaims found.", kind: kindVolume, name: func(o *object) string { return o.str("volumeName") }, cols: reclaimColumns})
	}
	cmd.AddCommand(o.reclaimRetryCommand(), o.reclaimStartCommand())
	return cmd
}

// reclaimColumns are the reclaims table's (also printed by retry and
// start).
var reclaimColumns = []column{
	{header: "VOLUME", cell: func(o *object) string { return o.str("volumeName") }},
	{header: "POLICY", cell: func(o *object) string { return o.str("policy") }},
	{header: "STATE", cell: func(o *object) string { return trimEnum(o.str("state"), "STATE_") }},
	{header: "METHOD", cell: func(o *object) string { return trimEnum(o.str("method"), "METHOD_") }},
	{header: "CLAIM", cell: func(o *object) string { return ref(o.str("claimNamespace"), o.str("claimName")) }},
	{header: "ATTEMPTS", cell: func(o *object) string { return o.str("attempts") }},
	{header: "AGE", cell: func(o *object) string { return age(o.time("createTime")) }},
	{header: "MESSAGE", cell: func(o *object) string { return o.str("message") }},
	{header: "OWNER", wide: true, cell: func(o *object) string { return o.str("owner") }},
	{header: "DRIVER", wide: true, cell: func(o *object) string { return o.str("driver") }},
	{header: "UPDATED", wide: true, cell: func(o *object) string { return age(o.time("updateTime")) }},
}

// orphanKind is --kind as the gateway takes it.
func orphanKind(kind string) (string, error) {
	switch strings.ToLower(kind) {
	case "":
		return "", nil
	case "volume", "volumes":
		return "ORPHAN_KIND_VOLUME", nil
	case "pv", "pvs", "persistentvolume", "persistent-volume":
		return "ORPHAN_KIND_PERSISTENT_VOLUME", nil
	}
	return "", usagef("--kind %q: use volume (backing volumes without a PersistentVolume) or pv (PersistentVolumes without their volume)", kind)
}

func (o *options) orphansCommand() *cobra.Command {
	var lf listFlags
	var driver, kind string
	cmd := &cobra.Command{
		Use:     "orphans [--driver DRIVER] [--kind volume|pv]",
		Aliases: []string{"orphan"},
		GroupID: groupRead,
		Short:   "Report orphaned backing volumes; delete one",
		Long: `Report, per driver that can list its volumes, the backing volumes that have
neither a PersistentVolume nor a journal record (kind Volume), and the
PersistentVolumes whose backing volume the driver no longer lists (kind
PersistentVolume). Drivers that could not be checked are warned about.
A backing volume has no Kubernetes name: -o name is refused, use -o jsonpath.

Route: GET /v1/orphans. 'orphans delete' deletes one (volplane-operator).`,
		Example: `  kubectl volplane orphans --kind volume
  # Driver and volume ID of each, as 'orphans delete' takes them
  kubectl volplane orphans --kind volume -o jsonpath='{range .orphans[*]}{.driverName} {.volumeId}{"\n"}{end}'`,
		Args: noArgs,
	}
	out := newOutput(cmd, "", true, false)
	lf.add(cmd)
	cmd.Flags().StringVar(&driver, "driver", "", "only this driver (its CSI name)")
	cmd.Flags().StringVar(&kind, "kind", "", "only this kind: volume (backing volumes without a PersistentVolume) or pv (PersistentVolumes without their volume)")
	o.completeStatic(cmd, "kind", []string{"volume", "pv"})
	o.completeDrivers(cmd, "driver")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		k, err := orphanKind(kind)
		if err = firstErr(out.validate(), lf.validate(), err, noNames(out, "an orphan")); err != nil {
			return err
		}
		r, err := o.runner(cmd.Context())
		if err != nil {
			return err
		}
		q := url.Values{}
		setIf(q, "driverName", driver)
		setIf(q, "kind", k)
		l, err := r.gw.list(cmd.Context(), "/v1/orphans", q, listOptions{field: "orphans", pageSize: lf.pageSize, keep: []string{"drivers"}})
		if err != nil {
			return err
		}
		if out.human() {
			// Say which drivers could not be checked: an empty report of a
			// driver that cannot list its volumes is no good news.
			for _, d := range l.list("drivers") {
				if o, _ := d.(*object); o != nil && !o.bool("checked") {
					fmt.Fprintf(r.s.ErrOut, "Warning: driver %s was not checked: %s\n", o.str("driverName"), oneLine(o.str("message")))
				}
			}
		}
		return r.printList(out, l, listSpec{field: "orphans", none: "No orphans found.", cols: []column{
			{header: "DRIVER", cell: func(o *object) string { return o.str("driverName") }},
			{header: "KIND", cell: func(o *object) string {
				if o.str("kind") == "ORPHAN_KIND_PERSISTENT_VOLUME" {
					return "PersistentVolume"
				}
				return "Volume"
			}},
			{header: "VOLUME ID", cell: func(o *object) string { return o.str("volumeId") }},
			{header: "PERSISTENTVOLUME", cell: func(o *object) string { return o.str("persistentVolumeName") }},
			{header: "SIZE", cell: func(o *object) string { return size(o.int("capacityBytes")) }},
			{header: "AGE", cell: func(o *object) string { return age(o.time("createTime")) }},
			{header: "UNCERTAIN", cell: func(o *object) string { return o.str("uncertain") }},
		}})
	}
	cmd.AddCommand(o.orphanDeleteCommand())
	return cmd
}

// noNames refuses -o name for what has no Kubernetes name.
func noNames(out *output, what string) error {
	if out.format() == "name" {
		return usagef("-o name: %s has no Kubernetes name (a backing volume is a driver and a volume ID): use -o json or -o jsonpath", what)
	}
	return nil
}

// ref is "namespace/name", "" when there is no name.
func ref(ns, name string) string {
	if name == "" {
		return ""
	}
	return ns + "/" + name
}

func (o *options) explainCommand() *cobra.Command {
	var lf listFlags
	cmd := &cobra.Command{
		Use:     "explain pvc NAME [-n NAMESPACE]",
		GroupID: groupRead,
		Short:   "Explain why a claim is Pending, or how it was bound",
		Long: `Explain a claim as kubectl describe describes an object: the binder's decision
and its reason first, then the claim, then every volume the binder considers
for it (in the order it ranks them, each with the first rule that rejects
it), then, for a claim that waits for a volume to be provisioned, what the
provisioner is doing: the class, the driver, the operation in flight and its
last error. Nothing that is unset is shown. -o wide adds columns and fields;
-o json|yaml shows the whole answer, every page of candidates merged.

Route: GET /v1/namespaces/{namespace}/claims/{name}:explain.`,
		Example: `  kubectl volplane explain pvc data -n team
  kubectl volplane explain pvc/data -o yaml
  # Only the decision
  kubectl volplane explain pvc data -o jsonpath='{.decision}'`,
		Args:              claimArgs("explain"),
		ValidArgsFunction: o.completeClaimArgs,
	}
	out := newOutput(cmd, "", false, true)
	cmd.Flags().Int32Var(&lf.pageSize, "page-size", 0, "candidates per request while paging through them (0: the gateway's default, 100)")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if err := firstErr(out.validate(), lf.validate()); err != nil {
			return err
		}
		_, name, _ := parseRef(args)
		r, err := o.runner(cmd.Context())
		if err != nil {
			return err
		}
		ans, err := r.explain(cmd, name, lf.pageSize)
		if err != nil {
			return err
		}
		return r.printVerdict(out, ans, false)
	}
	return cmd
}

// explain asks the gateway why a claim is (or is not) bound:
// GET /v1/namespaces/{ns}/claims/{name}:explain, its candidate list paged
// through when the answer carries a nextPageToken.
func (r *runner) explain(cmd *cobra.Command, name string, pageSize int32) (*object, error) {
	ctx := cmd.Context()
	path := "/v1/namespaces/" + url.PathEscape(r.namespace) + "/claims/" + url.PathEscape(name) + ":explain"
	q := url.Values{}
	if pageSize > 0 {
		q.Set("pageSize", strconv.Itoa(int(pageSize)))
	}
	ans, err := r.gw.do(ctx, http.MethodGet, path, q, nil)
	if err != nil {
		return nil, err
	}
	for next := ans.str("nextPageToken"); next != ""; {
		q.Set("pageToken", next)
		more, err := r.gw.do(ctx, http.MethodGet, path, q, nil)
		if err != nil {
			return nil, err
		}
		mergePages(ans, more)
		if n := more.str("nextPageToken"); n != next {
			next = n
		} else {
			next = ""
		}
	}
	ans.del("nextPageToken")
	return ans, nil
}

// mergePages appends the lists of a later page to the first page's (the
// answer's own lists, e.g. candidates: the lists inside its objects, such
// as the claim's access modes, are the same on every page).
func mergePages(into, page *object) {
	for _, k := range page.keys {
		if v, ok := page.m[k].([]any); ok {
			if old, ok := into.m[k].([]any); ok {
				into.m[k] = append(old, v...)
			}
		}
	}
}

// kinds a reference takes: "pvc NAME", "pvc/NAME".
var (
	claimKinds  = []string{"pvc", "pvcs", "persistentvolumeclaim", "persistentvolumeclaims", "claim", "claims"}
	volumeKinds = []string{"pv", "pvs", "persistentvolume", "persistentvolumes", "volume", "volumes"}
)

// parseRef takes "KIND NAME" or "KIND/NAME" and returns the kind ("pvc"
// or "pv") and name; ok false when args are neither.
func parseRef(args []string) (kind, name string, ok bool) {
	switch len(args) {
	case 1:
		if kind, name, ok = strings.Cut(args[0], "/"); !ok {
			return "", "", false
		}
	case 2:
		kind, name = args[0], args[1]
	default:
		return "", "", false
	}
	switch k := strings.ToLower(kind); {
	case slices.Contains(claimKinds, k):
		return "pvc", name, true
	case slices.Contains(volumeKinds, k):
		return "pv", name, true
	}
	return kind, name, true
}

// claimArgs checks a command's "pvc NAME" (what the command is, for the
// messages).
func claimArgs(what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		kind, name, ok := parseRef(args)
		switch {
		case !ok:
			return usagef("%s needs a claim: %s", what, cmd.UseLine())
		case kind != "pvc":
			return usagef("%s explains claims (pvc), not %q; %s", what, kind, cmd.UseLine())
		}
		return checkName(name, "claim")
	}
}

// checkName refuses a name Kubernetes would refuse, before the gateway
// does.
func checkName(name, what string) error {
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return usagef("%q is not a %s name: %s", name, what, strings.Join(errs, "; "))
	}
	return nil
}

// printVerdict writes an explain or match answer: described, as -o name
// the claim, else through cli-runtime's printers.
func (r *runner) printVerdict(out *output, ans *object, match bool) error {
	switch {
	case out.human():
		return describeVerdict(r.s.Out, ans, out.format() == "wide", match)
	case out.format() == "name":
		return out.printNames(r.s.Out, kindClaim, ans.obj("claim").str("name"))
	}
	return out.printAnswer(r.s.Out, ans)
}

func (o *options) matchCommand() *cobra.Command {
	var file string
	cmd := &cobra.Command{
		Use:     "match -f FILE [-n NAMESPACE]",
		GroupID: groupRead,
		Short:   "Show what would happen to a claim if it were created now (nothing is written)",
		Long: `Show what volplane would do with a PersistentVolumeClaim if it were created
now, laid out as explain lays it out: the decision and its reason, the claim
as the API server would store it (after defaults and admission), the
candidate volumes, and for a claim that would be provisioned the CreateVolume
request the provisioner would send (driver, capacity, capabilities,
parameters, topology). The claim is tried as a server-side dry run: nothing
is written anywhere.

Route: POST /v1/claims:match (a viewer's right: it writes nothing).`,
		Example: `  kubectl volplane match -f claim.yaml -n team
  kubectl get pvc data -o yaml | kubectl volplane match -f -`,
		Args: noArgs,
	}
	out := newOutput(cmd, "", false, true)
	cmd.Flags().StringVarP(&file, "filename", "f", "", "the PersistentVolumeClaim (YAML or JSON file; - reads standard input)")
	_ = cmd.MarkFlagFilename("filename", "yaml", "yml", "json")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := out.validate(); err != nil {
			return err
		}
		if file == "" {
			return usagef("match needs -f FILE, a PersistentVolumeClaim in YAML or JSON (- for standard input)")
		}
		r, err := o.runner(cmd.Context())
		if err != nil {
			return err
		}
		claim, err := r.readClaim(file)
		if err != nil {
			return err
		}
		ans, err := r.gw.do(cmd.Context(), http.MethodPost, "/v1/claims:match", nil, claim)
		if err != nil {
			return err
		}
		if c := ans.obj("claim"); c != nil && c.str("name") == "" {
			// The dry run names the claim; an answer that does not still
			// has the file's name for -o name.
			meta, _ := claim["metadata"].(map[string]any)
			name, _ := meta["name"].(string)
			c.set("name", name)
		}
		return r.printVerdict(out, ans, true)
	}
	return cmd
}

// readClaim reads a PersistentVolumeClaim from a YAML or JSON file, in
// the -n (or context's) namespace unless it names its own.
func (r *runner) readClaim(file string) (map[string]any, error) {
	var data []byte
	var err error
	if file == "-" {
		data, err = io.ReadAll(io.LimitReader(r.s.In, 1<<20))
	} else {
		data, err = os.ReadFile(file)
	}
	if err != nil {
		return nil, fmt.Errorf("read the claim: %w", err)
	}
	var claim map[string]any
	if err := yaml.Unmarshal(data, &claim); err != nil {
		return nil, fmt.Errorf("%s is not a YAML or JSON object: %w", file, err)
	}
	if claim == nil {
		return nil, fmt.Errorf("%s holds no object", file)
	}
	if k, _ := claim["kind"].(string); k != "" && k != "PersistentVolumeClaim" {
		return nil, fmt.Errorf("%s holds a %s, not a PersistentVolumeClaim", file, k)
	}
	claim["kind"], claim["apiVersion"] = "PersistentVolumeClaim", "v1"
	meta, _ := claim["metadata"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
		claim["metadata"] = meta
	}
	if ns, _ := meta["namespace"].(string); ns == "" {
		meta["namespace"] = r.namespace
	} else if r.explicitNamespace && ns != r.namespace {
		return nil, fmt.Errorf("the claim's namespace %q does not match -n %q", ns, r.namespace)
	}
	return claim, nil
}

// firstErr is the first of errs that is not nil.
func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
