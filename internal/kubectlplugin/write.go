package kubectlplugin

import (
	"bufio"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/spf13/cobra"
)

// The operator's commands. Each is one route of the gateway, which
// authorizes it by RBAC (volplane-operator); a refusal is shown with the
// gateway's message and the role to ask for. A command that deletes asks
// first (y/N on a terminal) unless --yes; without a terminal it needs
// --yes. There is no route to cancel a reclaim, so there is no command.

// ErrNotConfirmed is what a deletion that was not confirmed returns
// (errors.Is).
var ErrNotConfirmed = errors.New("not confirmed")

// notConfirmed is a deletion not confirmed, said in full.
type notConfirmed struct{ msg string }

func (e notConfirmed) Error() string        { return e.msg }
func (e notConfirmed) Is(target error) bool { return target == ErrNotConfirmed }

// confirm asks "question [y/N]: " on the terminal, and refuses without
// one. yes (--yes) answers for the user.
func (r *runner) confirm(yes bool, what, question string) error {
	if yes {
		return nil
	}
	if !r.s.Terminal {
		return usageError{notConfirmed{fmt.Sprintf("refusing to delete %s without confirmation: standard input is not a terminal to ask at; pass --yes to delete", what)}}
	}
	fmt.Fprintf(r.s.ErrOut, "%s [y/N]: ", question)
	answer, err := bufio.NewReader(r.s.In).ReadString('\n')
	if err != nil && answer == "" {
		fmt.Fprintln(r.s.ErrOut)
	}
	switch strings.ToLower(strings.TrimSpace(answer)) {
	case "y", "yes":
		return nil
	}
	return notConfirmed{fmt.Sprintf("nothing deleted: %s was not confirmed", what)}
}

// addYes adds --yes (-y) to a command that deletes.
func addYes(cmd *cobra.Command, yes *bool) {
	cmd.Flags().BoolVarP(yes, "yes", "y", false, "delete without asking (needed when standard input is not a terminal)")
}

func (o *options) syncCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "sync (pvc|pv) NAME",
		GroupID: groupWrite,
		Short:   "Sync a claim or a volume now",
		Long: `Queue a claim (pvc, in -n's namespace) or a volume (pv) for an immediate sync
by the binder, instead of waiting for an event or the resync: the binder
then binds, provisions, or releases it as its state machine says (see
'kubectl volplane explain pvc NAME' for what it will decide). Nothing else
is changed.

Routes: POST /v1/namespaces/{namespace}/claims/{name}:sync (update
claims/sync), POST /v1/volumes/{name}:sync (update volumes/sync).`,
		Example: `  kubectl volplane sync pvc data -n team
  kubectl volplane sync pv pvc-0b5e4a7e-6f6c-4a8e-9d57-5c1c8e1f0a3d
  # Every Pending claim of a namespace
  kubectl volplane claims --phase Pending -o name | xargs -n1 kubectl volplane sync`,
		Args: func(cmd *cobra.Command, args []string) error {
			kind, name, ok := parseRef(args)
			switch {
			case !ok:
				return usagef("sync needs a claim or a volume: %s", cmd.UseLine())
			case kind != "pvc" && kind != "pv":
				return usagef("sync syncs claims (pvc) and volumes (pv), not %q; %s", kind, cmd.UseLine())
			}
			return checkName(name, map[string]string{"pvc": "claim", "pv": "volume"}[kind])
		},
		ValidArgsFunction: o.completeSyncArgs,
	}
	out := newOutput(cmd, "queued for sync", false, false)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if err := out.validate(); err != nil {
			return err
		}
		kind, name, _ := parseRef(args)
		r, err := o.runner(cmd.Context())
		if err != nil {
			return err
		}
		path, k := "/v1/volumes/"+url.PathEscape(name)+":sync", kindVolume
		if kind == "pvc" {
			path, k = "/v1/namespaces/"+url.PathEscape(r.namespace)+"/claims/"+url.PathEscape(name)+":sync", kindClaim
		}
		ans, err := r.gw.do(cmd.Context(), http.MethodPost, path, nil, nil)
		if err != nil {
			return err
		}
		if out.format() == "" || out.format() == "name" {
			return out.printNames(r.s.Out, k, name)
		}
		return out.printAnswer(r.s.Out, ans)
	}
	return cmd
}

func (o *options) reclaimRetryCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "retry VOLUME",
		Short: "Retry a failed reclaim now",
		Long: `Retry the FAILED reclaim of a volume now instead of at the end of its
backoff (the reclaimer retries failed reclaims by itself; this only makes it
sooner, so it asks nothing). A reclaim in any other state is refused (409).
Prints the reclaim after the call.

Route: POST /v1/reclaims/{volume}:retry (update reclaims/retry).`,
		Example: `  kubectl volplane reclaim retry pvc-0b5e4a7e-6f6c-4a8e-9d57-5c1c8e1f0a3d
  kubectl volplane reclaims --state failed -o name | xargs -n1 kubectl volplane reclaim retry`,
		Args:              volumeArg("retry"),
		ValidArgsFunction: o.completeReclaims("STATE_FAILED"),
	}
	out := newOutput(cmd, "reclaim retried", true, false)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		name := volumeName(args)
		return o.reclaimCall(cmd, out, "/v1/reclaims/"+url.PathEscape(name)+":retry", nil, name)
	}
	return cmd
}

func (o *options) reclaimStartCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "start VOLUME",
		Short: "Start (or join) the reclaim of a released volume",
		Long: `Start the reclaim of a Released or Failed volume now: its reclaim policy is
carried out (Retain: nothing; Recycle: its data scrubbed; Delete: its backing
volume and the PersistentVolume deleted). The binder starts the same reclaim
by itself when a volume is released, and on every sync while it stays
Released or Failed; this only makes it sooner, so it asks nothing. A volume
in another phase is refused (409). Prints the reclaim after the call.

Route: POST /v1/reclaims (create reclaims).`,
		Example:           `  kubectl volplane reclaim start pv-static-1`,
		Args:              volumeArg("start"),
		ValidArgsFunction: o.completeVolumes("Released", "Failed"),
	}
	out := newOutput(cmd, "reclaim started", true, false)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		name := volumeName(args)
		return o.reclaimCall(cmd, out, "/v1/reclaims", map[string]any{"volumeName": name}, name)
	}
	return cmd
}

// reclaimCall posts a reclaim route and prints the reclaim it answers.
func (o *options) reclaimCall(cmd *cobra.Command, out *output, path string, body any, name string) error {
	if err := out.validate(); err != nil {
		return err
	}
	r, err := o.runner(cmd.Context())
	if err != nil {
		return err
	}
	ans, err := r.gw.do(cmd.Context(), http.MethodPost, path, nil, body)
	if err != nil {
		return err
	}
	switch {
	case out.human():
		if err := out.printNames(r.s.Out, kindVolume, name); err != nil {
			return err
		}
		if rc := ans.obj("reclaim"); rc != nil {
			fmt.Fprintln(r.s.Out)
			return out.printTable(r.s.Out, []any{rc}, reclaimColumns)
		}
		return nil
	case out.format() == "name":
		return out.printNames(r.s.Out, kindVolume, name)
	}
	return out.printAnswer(r.s.Out, ans)
}

// volumeArg checks a command's VOLUME (also pv/VOLUME, as -o name
// writes it).
func volumeArg(what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != 1 {
			return usagef("%s needs one volume: %s", what, cmd.UseLine())
		}
		if kind, _, ok := parseRef(args); ok && kind != "pv" {
			return usagef("%s takes a volume (pv), not %q; %s", what, kind, cmd.UseLine())
		}
		return checkName(volumeName(args), "volume")
	}
}

// volumeName is VOLUME, or the name of pv/VOLUME.
func volumeName(args []string) string {
	if _, name, ok := parseRef(args); ok {
		return name
	}
	return args[0]
}

func (o *options) deleteBackingCommand() *cobra.Command {
	var yes bool
	cmd := &cobra.Command{
		Use:   "delete-backing VOLUME [--yes]",
		Short: "Delete the backing volume of a released volume (asks first)",
		Long: `Delete the backing volume (CSI DeleteVolume) of a provisioned
PersistentVolume, as its reclaim policy Delete would; the PersistentVolume
object itself stays. The provisioner refuses (409) a volume that is not
Released or Failed, whose policy is not Delete, or that a live claim still
points at. The data is lost for good: the command asks first (y/N) unless
--yes, and without a terminal it needs --yes.

A driver that is still deleting when the call returns (or that refused)
makes the command fail with its message: run it again later.

Route: POST /v1/volumes/{volume}:deleteBacking (delete volumes/backing).`,
		Example: `  kubectl volplane volumes delete-backing pvc-0b5e4a7e-6f6c-4a8e-9d57-5c1c8e1f0a3d
  kubectl volplane volumes delete-backing pvc-0b5e4a7e-6f6c-4a8e-9d57-5c1c8e1f0a3d --yes`,
		Args:              volumeArg("delete-backing"),
		ValidArgsFunction: o.completeVolumes("Released", "Failed"),
	}
	out := newOutput(cmd, "backing volume deleted", false, false)
	addYes(cmd, &yes)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if err := out.validate(); err != nil {
			return err
		}
		name := volumeName(args)
		r, err := o.runner(cmd.Context())
		if err != nil {
			return err
		}
		what := "the backing volume of persistentvolume/" + name
		if err := r.confirm(yes, what, r.deleteBackingQuestion(cmd, name)); err != nil {
			return err
		}
		ans, err := r.gw.do(cmd.Context(), http.MethodPost, "/v1/volumes/"+url.PathEscape(name)+":deleteBacking", nil, nil)
		if err != nil {
			return err
		}
		outcome := ans.str("outcome")
		if !out.human() && out.format() != "name" {
			if err := out.printAnswer(r.s.Out, ans); err != nil {
				return err
			}
		}
		switch outcome {
		case "OUTCOME_FINISHED":
		case "OUTCOME_IN_BACKGROUND":
			return fmt.Errorf("%s is not deleted yet: the driver may still be deleting it (%s); run the command again later", what, oneLine(ans.str("message")))
		default:
			return fmt.Errorf("%s was not deleted (%s): %s", what, enumWords(outcome, "OUTCOME_"), oneLine(ans.str("message")))
		}
		if out.human() || out.format() == "name" {
			return out.printNames(r.s.Out, kindVolume, name)
		}
		return nil
	}
	return cmd
}

// deleteBackingQuestion asks about a volume, with what the binder knows
// of it (when it can be read: the PersistentVolume may be gone while its
// deletion is journaled).
func (r *runner) deleteBackingQuestion(cmd *cobra.Command, name string) string {
	q := "Delete the backing volume of persistentvolume/" + name
	if !r.s.Terminal {
		return q + "?"
	}
	ans, err := r.gw.do(cmd.Context(), http.MethodGet, "/v1/volumes/"+url.PathEscape(name), nil, nil)
	if v := ans.obj("volume"); err == nil && v != nil {
		var about []string
		for _, s := range []string{v.str("phase"), size(v.int("capacityBytes")), v.str("reclaimPolicy"), v.str("provisionedBy")} {
			if s != "" {
				about = append(about, s)
			}
		}
		if c := v.obj("claimRef"); c != nil && c.str("name") != "" {
			about = append(about, "claim "+ref(c.str("namespace"), c.str("name")))
		}
		if len(about) > 0 {
			q += " (" + strings.Join(about, ", ") + ")"
		}
	}
	return oneLine(q) + "? Its data is lost for good."
}

func (o *options) orphanDeleteCommand() *cobra.Command {
	var yes bool
	var driver, volumeID string
	cmd := &cobra.Command{
		Use:   "delete --driver DRIVER --volume-id ID [--yes]",
		Short: "Delete an orphaned backing volume (asks first)",
		Long: `Delete one backing volume that 'kubectl volplane orphans' reports: the
provisioner checks again, right before it calls the driver's DeleteVolume,
that the volume still has neither a PersistentVolume nor a journal record,
and refuses (409) otherwise. The data is lost for good: the command asks
first (y/N) unless --yes, and without a terminal it needs --yes.

Route: POST /v1/orphans:delete (delete orphans).`,
		Example: `  kubectl volplane orphans --kind volume
  kubectl volplane orphans delete --driver hostpath.csi.volplane.io --volume-id 5f1c2b8e-...`,
		Args: noArgs,
	}
	out := newOutput(cmd, "", false, false)
	addYes(cmd, &yes)
	cmd.Flags().StringVar(&driver, "driver", "", "the driver's CSI name (required)")
	cmd.Flags().StringVar(&volumeID, "volume-id", "", "the backing volume's ID, as orphans lists it (required)")
	o.completeDrivers(cmd, "driver")
	_ = cmd.RegisterFlagCompletionFunc("volume-id", o.completeOrphanIDs)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := firstErr(out.validate(), noNames(out, "a backing volume")); err != nil {
			return err
		}
		if driver == "" || volumeID == "" {
			return usagef("orphans delete needs --driver and --volume-id (see 'kubectl volplane orphans --kind volume')")
		}
		r, err := o.runner(cmd.Context())
		if err != nil {
			return err
		}
		what := fmt.Sprintf("backing volume %q of driver %s", volumeID, driver)
		if err := r.confirm(yes, what, oneLine("Delete orphaned "+what+"?")+" Its data is lost for good."); err != nil {
			return err
		}
		ans, err := r.gw.do(cmd.Context(), http.MethodPost, "/v1/orphans:delete", nil, map[string]any{"driverName": driver, "volumeId": volumeID})
		if err != nil {
			return err
		}
		if out.human() {
			_, err := fmt.Fprintf(r.s.Out, "%s deleted\n", oneLine(what))
			return err
		}
		return out.printAnswer(r.s.Out, ans)
	}
	return cmd
}
