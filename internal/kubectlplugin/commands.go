package kubectlplugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// printList writes a list (every page merged) as the output format asks:
// the API's JSON or YAML ({"<field>": [...]}), or a table; an empty table
// is a line on standard error, as kubectl says "No resources found".
func (r *runner) printList(l *object, field string, cols []column, none string) error {
	switch r.o.output {
	case "json", "yaml":
		return printData(r.s.Out, r.o.output, l)
	}
	items := l.list(field)
	if len(items) == 0 {
		fmt.Fprintln(r.s.ErrOut, none)
		return nil
	}
	return printTable(r.s.Out, items, cols, r.o.output == "wide")
}

// noArgs refuses arguments to a command that takes none.
func noArgs(name string, args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("%w: %s takes no arguments, got %q", ErrUsage, name, args)
	}
	return nil
}

func setIf(q url.Values, k, v string) {
	if v != "" {
		q.Set(k, v)
	}
}

func runClaims(ctx context.Context, r *runner, args []string) error {
	if err := noArgs("claims", args); err != nil {
		return err
	}
	q := url.Values{}
	setIf(q, "phase", r.o.phase)
	setIf(q, "storageClassName", r.o.class)
	setIf(q, "driver", r.o.driver)
	path := "/v1/namespaces/" + url.PathEscape(r.namespace) + "/claims"
	none := fmt.Sprintf("No claims found in %s namespace.", r.namespace)
	if r.o.allNamespaces {
		path, none = "/v1/claims", "No claims found."
	}
	l, err := r.gw.list(ctx, path, q, listOptions{field: "claims", pageSize: r.o.pageSize})
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
	if r.o.allNamespaces {
		cols = append([]column{{header: "NAMESPACE", cell: func(o *object) string { return o.str("namespace") }}}, cols...)
	}
	return r.printList(l, "claims", cols, none)
}

func runVolumes(ctx context.Context, r *runner, args []string) error {
	if err := noArgs("volumes", args); err != nil {
		return err
	}
	q := url.Values{}
	setIf(q, "phase", r.o.phase)
	setIf(q, "storageClassName", r.o.class)
	setIf(q, "driver", r.o.driver)
	setIf(q, "claimNamespace", r.o.claimNamespace)
	l, err := r.gw.list(ctx, "/v1/volumes", q, listOptions{field: "volumes", pageSize: r.o.pageSize})
	if err != nil {
		return err
	}
	return r.printList(l, "volumes", []column{
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
	}, "No volumes found.")
}

func runDrivers(ctx context.Context, r *runner, args []string) error {
	if err := noArgs("drivers", args); err != nil {
		return err
	}
	l, err := r.gw.list(ctx, "/v1/drivers", nil, listOptions{field: "drivers", pageSize: r.o.pageSize})
	if err != nil {
		return err
	}
	return r.printList(l, "drivers", []column{
		{header: "NAME", cell: func(o *object) string { return o.str("provisionerName") }},
		{header: "DRIVER", cell: func(o *object) string { return o.str("driverName") }},
		{header: "VERSION", cell: func(o *object) string { return o.str("vendorVersion") }},
		{header: "READY", cell: func(o *object) string { return o.str("ready") }},
		{header: "ENDPOINT", cell: func(o *object) string { return o.str("endpoint") }},
		{header: "MESSAGE", cell: func(o *object) string { return o.str("message") }},
		{header: "CAPABILITIES", wide: true, cell: func(o *object) string { return strings.Join(o.strs("capabilities"), ",") }},
	}, "No drivers found.")
}

func runOperations(ctx context.Context, r *runner, args []string) error {
	if err := noArgs("operations", args); err != nil {
		return err
	}
	q := url.Values{}
	setIf(q, "kind", r.o.kind)
	setIf(q, "driver", r.o.driver)
	setIf(q, "claimNamespace", r.o.claimNamespace)
	l, err := r.gw.list(ctx, "/v1/provisioner/operations", q, listOptions{field: "operations", pageSize: r.o.pageSize})
	if err != nil {
		return err
	}
	return r.printList(l, "operations", []column{
		{header: "KIND", cell: func(o *object) string { return o.str("kind") }},
		{header: "VOLUME", cell: func(o *object) string { return o.str("volumeName") }},
		{header: "CLAIM", cell: func(o *object) string { return ref(o.str("claimNamespace"), o.str("claimName")) }},
		{header: "DRIVER", cell: func(o *object) string { return o.str("provisioner") }},
		{header: "ATTEMPTS", cell: func(o *object) string { return o.str("attempts") }},
		{header: "OWNER", cell: func(o *object) string { return o.str("owner") }},
		{header: "AGE", cell: func(o *object) string { return age(o.time("startTime")) }},
		{header: "LAST ERROR", cell: func(o *object) string { return o.str("lastError") }},
	}, "No operations in flight.")
}

// states are the reclaim states --state takes.
var states = []string{"pending", "running", "retained", "succeeded", "failed", "skipped", "cancelled"}

func runReclaims(ctx context.Context, r *runner, args []string) error {
	if err := noArgs("reclaims", args); err != nil {
		return err
	}
	q := url.Values{}
	if s := strings.ToLower(strings.TrimPrefix(strings.ToUpper(r.o.state), "STATE_")); s != "" {
		found := false
		for _, st := range states {
			found = found || st == s
		}
		if !found {
			return fmt.Errorf("%w: --state %q: use one of %s", ErrUsage, r.o.state, strings.Join(states, ", "))
		}
		q.Set("state", "STATE_"+strings.ToUpper(s))
	}
	setIf(q, "driver", r.o.driver)
	setIf(q, "claimNamespace", r.o.claimNamespace)
	l, err := r.gw.list(ctx, "/v1/reclaims", q, listOptions{field: "reclaims", pageSize: r.o.pageSize})
	if err != nil {
		return err
	}
	return r.printList(l, "reclaims", []column{
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
	}, "No reclaims found.")
}

func runOrphans(ctx context.Context, r *runner, args []string) error {
	if err := noArgs("orphans", args); err != nil {
		return err
	}
	q := url.Values{}
	setIf(q, "driverName", r.o.driver)
	switch strings.ToLower(r.o.kind) {
	case "":
	case "volume", "volumes":
		q.Set("kind", "ORPHAN_KIND_VOLUME")
	case "pv", "pvs", "persistentvolume", "persistent-volume":
		q.Set("kind", "ORPHAN_KIND_PERSISTENT_VOLUME")
	default:
		return fmt.Errorf("%w: --kind %q: use volume (backing volumes without a PersistentVolume) or pv (PersistentVolumes without their volume)", ErrUsage, r.o.kind)
	}
	l, err := r.gw.list(ctx, "/v1/orphans", q, listOptions{field: "orphans", pageSize: r.o.pageSize, keep: []string{"drivers"}})
	if err != nil {
		return err
	}
	if r.o.output == "" || r.o.output == "wide" {
		// Say which drivers could not be checked: an empty report of a
		// driver that cannot list its volumes is no good news.
		for _, d := range l.list("drivers") {
			if o, _ := d.(*object); o != nil && !o.bool("checked") {
				fmt.Fprintf(r.s.ErrOut, "Warning: driver %s was not checked: %s\n", o.str("driverName"), o.str("message"))
			}
		}
	}
	return r.printList(l, "orphans", []column{
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
	}, "No orphans found.")
}

// ref is "namespace/name", "" when there is no name.
func ref(ns, name string) string {
	if name == "" {
		return ""
	}
	return ns + "/" + name
}

// runExplain asks the gateway why a claim is (or is not) bound:
// GET /v1/namespaces/{ns}/claims/{name}:explain. The answer is shown as
// it comes, laid out by describe; its candidate list is paged through
// when the answer carries a nextPageToken.
func runExplain(ctx context.Context, r *runner, args []string) error {
	name, err := claimArg(args)
	if err != nil {
		return err
	}
	path := "/v1/namespaces/" + url.PathEscape(r.namespace) + "/claims/" + url.PathEscape(name) + ":explain"
	q := url.Values{}
	if r.o.pageSize > 0 {
		q.Set("pageSize", strconv.Itoa(int(r.o.pageSize)))
	}
	ans, err := r.gw.do(ctx, http.MethodGet, path, q, nil)
	if err != nil {
		return err
	}
	for next := ans.str("nextPageToken"); next != ""; {
		q.Set("pageToken", next)
		more, err := r.gw.do(ctx, http.MethodGet, path, q, nil)
		if err != nil {
			return err
		}
		mergePages(ans, more)
		if n := more.str("nextPageToken"); n != next {
			next = n
		} else {
			next = ""
		}
	}
	ans.del("nextPageToken")
	return r.printAnswer(ans)
}

// mergePages appends the lists of a later page to the first page's,
// wherever they are in the answer.
func mergePages(into, page *object) {
	for _, k := range page.keys {
		switch v := page.m[k].(type) {
		case []any:
			if old, ok := into.m[k].([]any); ok {
				into.m[k] = append(old, v...)
			}
		case *object:
			if old, ok := into.m[k].(*object); ok {
				mergePages(old, v)
			}
		}
	}
}

// claimArg takes "pvc NAME", "pvc/NAME" (or persistentvolumeclaim, claim).
func claimArg(args []string) (string, error) {
	const u = "kubectl volplane explain pvc NAME [-n NAMESPACE]"
	var kind, name string
	switch len(args) {
	case 1:
		var ok bool
		if kind, name, ok = strings.Cut(args[0], "/"); !ok {
			return "", fmt.Errorf("%w: %s", ErrUsage, u)
		}
	case 2:
		kind, name = args[0], args[1]
	default:
		return "", fmt.Errorf("%w: %s", ErrUsage, u)
	}
	switch strings.ToLower(kind) {
	case "pvc", "pvcs", "persistentvolumeclaim", "persistentvolumeclaims", "claim", "claims":
	default:
		return "", fmt.Errorf("%w: explain explains claims (pvc), not %q; %s", ErrUsage, kind, u)
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return "", fmt.Errorf("%w: %q is not a claim name: %s", ErrUsage, name, strings.Join(errs, "; "))
	}
	return name, nil
}

// runMatch asks the gateway what would happen if the claim in -f were
// created now: POST /v1/claims:match with the claim as JSON. Nothing is
// written anywhere.
func runMatch(ctx context.Context, r *runner, args []string) error {
	if err := noArgs("match", args); err != nil {
		return err
	}
	if r.o.file == "" {
		return fmt.Errorf("%w: match needs -f FILE, a PersistentVolumeClaim in YAML or JSON (- for standard input)", ErrUsage)
	}
	claim, err := r.readClaim(r.o.file)
	if err != nil {
		return err
	}
	ans, err := r.gw.do(ctx, http.MethodPost, "/v1/claims:match", nil, matchBody(claim))
	if err != nil {
		return err
	}
	return r.printAnswer(ans)
}

// matchBody is the request body of POST /v1/claims:match for a claim.
func matchBody(claim map[string]any) any { return claim }

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
	} else if r.o.namespace != "" && ns != r.o.namespace {
		return nil, fmt.Errorf("the claim's namespace %q does not match -n %q", ns, r.o.namespace)
	}
	return claim, nil
}

// printAnswer writes a single answer: JSON or YAML as it came (in its
// fields' order), else laid out by describe.
func (r *runner) printAnswer(ans *object) error {
	if r.o.output == "json" || r.o.output == "yaml" {
		return printData(r.s.Out, r.o.output, ans)
	}
	return describe(r.s.Out, ans)
}

// IsUsage reports whether err is a mistake in the command line.
func IsUsage(err error) bool { return errors.Is(err, ErrUsage) }
