package kubectlplugin

import (
	"context"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Shell completion: cobra's (`completion bash|zsh|fish|powershell`, and
// `__complete`, which kubectl_complete-volplane runs for kubectl). Flag
// values and arguments are completed from the API server (namespaces,
// StorageClasses, the kubeconfig's contexts) and from the gateway
// (claims, volumes, drivers, reclaims, orphans), one page each; a
// completion that cannot ask offers nothing rather than an error.

// completionPage is how many names one completion asks for.
const completionPage = "1000"

type completeFunc = func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective)

const noFiles = cobra.ShellCompDirectiveNoFileComp

// prefixed keeps the values that start with prefix, each once.
func prefixed(values []string, prefix string) []string {
	var out []string
	for _, v := range values {
		if strings.HasPrefix(v, prefix) && !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}

func ctxOf(cmd *cobra.Command) context.Context {
	if ctx := cmd.Context(); ctx != nil {
		return ctx
	}
	return context.Background()
}

func (o *options) registerGlobalCompletions(root *cobra.Command) {
	_ = root.RegisterFlagCompletionFunc("namespace", o.namespaces)
	for flag, names := range map[string]func(*kubeconfigNames) []string{
		"context": func(n *kubeconfigNames) []string { return n.contexts },
		"cluster": func(n *kubeconfigNames) []string { return n.clusters },
		"user":    func(n *kubeconfigNames) []string { return n.users },
	} {
		_ = root.RegisterFlagCompletionFunc(flag, func(_ *cobra.Command, _ []string, prefix string) ([]string, cobra.ShellCompDirective) {
			n, err := o.kubeconfigNames()
			if err != nil {
				return nil, noFiles
			}
			return prefixed(names(n), prefix), noFiles
		})
	}
}

type kubeconfigNames struct{ contexts, clusters, users []string }

func (o *options) kubeconfigNames() (*kubeconfigNames, error) {
	raw, err := o.config.ToRawKubeConfigLoader().RawConfig()
	if err != nil {
		return nil, err
	}
	n := &kubeconfigNames{}
	for k := range raw.Contexts {
		n.contexts = append(n.contexts, k)
	}
	for k := range raw.Clusters {
		n.clusters = append(n.clusters, k)
	}
	for k := range raw.AuthInfos {
		n.users = append(n.users, k)
	}
	slices.Sort(n.contexts)
	slices.Sort(n.clusters)
	slices.Sort(n.users)
	return n, nil
}

// apiClient is a client of the API server as the kubeconfig says.
func (o *options) apiClient() (kubernetes.Interface, error) {
	o.timeout = timeoutOrDefault(o.timeout)
	cfg, _, err := o.kubeconfig()
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

// namespaces completes -n (and --claim-namespace) from the API server.
func (o *options) namespaces(cmd *cobra.Command, _ []string, prefix string) ([]string, cobra.ShellCompDirective) {
	client, err := o.apiClient()
	if err != nil {
		return nil, noFiles
	}
	l, err := client.CoreV1().Namespaces().List(ctxOf(cmd), metav1.ListOptions{})
	if err != nil {
		return nil, noFiles
	}
	var names []string
	for _, n := range l.Items {
		names = append(names, n.Name)
	}
	return prefixed(names, prefix), noFiles
}

func (o *options) completeNamespaces(cmd *cobra.Command, flag string) {
	_ = cmd.RegisterFlagCompletionFunc(flag, o.namespaces)
}

func (o *options) completeStatic(cmd *cobra.Command, flag string, values []string) {
	_ = cmd.RegisterFlagCompletionFunc(flag, func(_ *cobra.Command, _ []string, prefix string) ([]string, cobra.ShellCompDirective) {
		return prefixed(values, prefix), noFiles
	})
}

// completeClasses completes --class from the API server's StorageClasses.
func (o *options) completeClasses(cmd *cobra.Command) {
	_ = cmd.RegisterFlagCompletionFunc("class", func(cmd *cobra.Command, _ []string, prefix string) ([]string, cobra.ShellCompDirective) {
		client, err := o.apiClient()
		if err != nil {
			return nil, noFiles
		}
		l, err := client.StorageV1().StorageClasses().List(ctxOf(cmd), metav1.ListOptions{})
		if err != nil {
			return nil, noFiles
		}
		var names []string
		for _, c := range l.Items {
			names = append(names, c.Name)
		}
		return prefixed(names, prefix), noFiles
	})
}

// gatewayNames lists one page of a gateway list and returns field of
// each item.
func (o *options) gatewayNames(cmd *cobra.Command, path string, q url.Values, list string, fields ...string) []string {
	r, err := o.runner(ctxOf(cmd))
	if err != nil {
		return nil
	}
	if q == nil {
		q = url.Values{}
	}
	q.Set("pageSize", completionPage)
	if strings.Contains(path, "{namespace}") {
		path = strings.ReplaceAll(path, "{namespace}", url.PathEscape(r.namespace))
	}
	ans, err := r.gw.do(ctxOf(cmd), http.MethodGet, path, q, nil)
	if err != nil {
		return nil
	}
	var out []string
	for _, it := range ans.list(list) {
		if it, _ := it.(*object); it != nil {
			for _, f := range fields {
				if v := it.str(f); v != "" {
					out = append(out, v)
				}
			}
		}
	}
	return out
}

func (o *options) completeDrivers(cmd *cobra.Command, flag string) {
	_ = cmd.RegisterFlagCompletionFunc(flag, func(cmd *cobra.Command, _ []string, prefix string) ([]string, cobra.ShellCompDirective) {
		return prefixed(o.gatewayNames(cmd, "/v1/drivers", nil, "drivers", "provisionerName", "driverName"), prefix), noFiles
	})
}

func (o *options) claimNames(cmd *cobra.Command, prefix string) []string {
	return prefixed(o.gatewayNames(cmd, "/v1/namespaces/{namespace}/claims", nil, "claims", "name"), prefix)
}

func (o *options) volumeNames(cmd *cobra.Command, prefix string, phases ...string) []string {
	if len(phases) == 0 {
		return prefixed(o.gatewayNames(cmd, "/v1/volumes", nil, "volumes", "name"), prefix)
	}
	var out []string
	for _, p := range phases {
		out = append(out, o.gatewayNames(cmd, "/v1/volumes", url.Values{"phase": {p}}, "volumes", "name")...)
	}
	slices.Sort(out)
	return prefixed(out, prefix)
}

// completeClaimArgs completes "pvc NAME" (and pvc/NAME).
func (o *options) completeClaimArgs(cmd *cobra.Command, args []string, prefix string) ([]string, cobra.ShellCompDirective) {
	switch len(args) {
	case 0:
		if kind, name, ok := strings.Cut(prefix, "/"); ok && slices.Contains(claimKinds, strings.ToLower(kind)) {
			return withKind(kind, o.claimNames(cmd, name)), noFiles
		}
		return prefixed([]string{"pvc"}, prefix), noFiles
	case 1:
		if slices.Contains(claimKinds, strings.ToLower(args[0])) {
			return o.claimNames(cmd, prefix), noFiles
		}
	}
	return nil, noFiles
}

// completeSyncArgs completes "pvc NAME" and "pv NAME".
func (o *options) completeSyncArgs(cmd *cobra.Command, args []string, prefix string) ([]string, cobra.ShellCompDirective) {
	switch len(args) {
	case 0:
		if kind, name, ok := strings.Cut(prefix, "/"); ok {
			switch k := strings.ToLower(kind); {
			case slices.Contains(claimKinds, k):
				return withKind(kind, o.claimNames(cmd, name)), noFiles
			case slices.Contains(volumeKinds, k):
				return withKind(kind, o.volumeNames(cmd, name)), noFiles
			}
		}
		return prefixed([]string{"pvc", "pv"}, prefix), noFiles
	case 1:
		switch k := strings.ToLower(args[0]); {
		case slices.Contains(claimKinds, k):
			return o.claimNames(cmd, prefix), noFiles
		case slices.Contains(volumeKinds, k):
			return o.volumeNames(cmd, prefix), noFiles
		}
	}
	return nil, noFiles
}

func withKind(kind string, names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = kind + "/" + n
	}
	return out
}

// completeVolumes completes a VOLUME argument with the volumes in one of
// the phases.
func (o *options) completeVolumes(phases ...string) completeFunc {
	return func(cmd *cobra.Command, args []string, prefix string) ([]string, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, noFiles
		}
		return o.volumeNames(cmd, prefix, phases...), noFiles
	}
}

// completeReclaims completes a VOLUME argument with the volumes of the
// reclaims in state.
func (o *options) completeReclaims(state string) completeFunc {
	return func(cmd *cobra.Command, args []string, prefix string) ([]string, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, noFiles
		}
		return prefixed(o.gatewayNames(cmd, "/v1/reclaims", url.Values{"state": {state}}, "reclaims", "volumeName"), prefix), noFiles
	}
}

// completeOrphanIDs completes --volume-id with the orphaned backing
// volumes (of --driver, when given).
func (o *options) completeOrphanIDs(cmd *cobra.Command, _ []string, prefix string) ([]string, cobra.ShellCompDirective) {
	q := url.Values{"kind": {"ORPHAN_KIND_VOLUME"}}
	if d, _ := cmd.Flags().GetString("driver"); d != "" {
		q.Set("driverName", d)
	}
	return prefixed(o.gatewayNames(cmd, "/v1/orphans", q, "orphans", "volumeId"), prefix), noFiles
}
