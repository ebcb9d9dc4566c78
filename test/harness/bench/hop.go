package bench

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/callers"
	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/sidecar"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	"github.com/volplane/volplane/test/harness/devenv"
)

// The hop's names: volplane's namespace (where the provisioner publishes
// its CA), and the driver's own namespace, ServiceAccount and controller
// pod, as a vendor's chart makes them.
const (
	volplaneNamespace = "volplane-system"
	hopNamespace      = "dev-csi"
	hopAccount        = "dev-csi-controller"
	hopPod            = "dev-csi-controller-0"
	sidecarProc       = "volplane-csi-sidecar"
)

// runHop runs o.Hop rounds of dynamic provisioning by volplane with the
// dev CSI driver on the provisioner's own unix socket (A) and through a
// volplane-csi-sidecar over mutual TLS (B), interleaved A/B/A/B, each on
// a fresh control plane, and prints each run, then one table of both and
// their ratio.
func runHop(ctx context.Context, o *Options) error {
	pair := [2]*cell{{system: o.name(sysVolplane), dynamic: true, claims: o.N}, {system: o.name(sysSidecar), dynamic: true, claims: o.N}}
	for round := 1; round <= o.Hop; round++ {
		for i, sys := range []system{sysVolplane, sysSidecar} {
			fmt.Fprintf(o.Log, "== round %d of %d: %s\n", round, o.Hop, o.name(sys))
			r, err := once(ctx, o, sys, load{n: o.N, clients: o.Clients})
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", round, o.name(sys), err)
			}
			r.Print(o.Log)
			pair[i].runs = append(pair[i].runs, r)
		}
	}
	printHop(o.Out, o, pair)
	return nil
}

// procCPU is the measured CPU per claim of the process named name in c's
// runs, averaged over them.
func (c *cell) procCPU(name string) time.Duration {
	var sum time.Duration
	for _, r := range c.runs {
		for _, p := range r.Procs {
			if p.Name == name {
				sum += p.Measured / time.Duration(max(r.Claims, 1))
			}
		}
	}
	return sum / time.Duration(max(len(c.runs), 1))
}

// printHop writes the hop's table: per way, the means of volumes/s,
// create-to-Bound p50 and p99, the CPU per claim of volplane as a whole
// (its services, and the sidecar in B) and of the sidecar alone, and
// B's figures over A's.
func printHop(w io.Writer, o *Options, pair [2]*cell) {
	fmt.Fprintf(w, "the sidecar's hop: dynamic provisioning, %d claims, %d round(s) of A/B, fresh control plane per run; placement %s; means over rounds\n\n",
		pair[0].claims, len(pair[0].runs), o.placement())
	fmt.Fprintln(w, "| way | volumes/s | p50 | p99 | CPU per claim (volplane, sidecar included) | CPU per claim (sidecar) | CPU per claim (dev CSI driver) |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|")
	ratio := func(b, a float64) string {
		if a == 0 {
			return "–"
		}
		return fmt.Sprintf("%.2f×", b/a)
	}
	var m [2]means
	for i, c := range pair {
		m[i] = c.means()
		fmt.Fprintf(w, "| %s | %.1f | %s | %s | %s | %s | %s |\n", "AB"[i:i+1]+": "+c.system, m[i].perSecond, secs(m[i].p50), secs(m[i].p99),
			ms(m[i].cpu), ms(c.procCPU(sidecarProc)), ms(c.procCPU("volplane-csi")))
	}
	a, b := m[0], m[1]
	fmt.Fprintf(w, "| B ÷ A | %s | %s | %s | %s | – | %s |\n", ratio(b.perSecond, a.perSecond), ratio(float64(b.p50), float64(a.p50)),
		ratio(float64(b.p99), float64(a.p99)), ratio(float64(b.cpu), float64(a.cpu)),
		ratio(float64(pair[1].procCPU("volplane-csi")), float64(pair[0].procCPU("volplane-csi"))))
}

// provisionerDriverArgs are the provisioner's flags that reach the dev
// CSI driver: its socket (A), or the sidecars it discovers, publishing
// its CA in volplane's namespace (B).
func provisionerDriverArgs(sys system, csiSock string) []string {
	if sys == sysSidecar {
		return []string{"--discover-sidecars", "--namespace", volplaneNamespace}
	}
	return []string{"--csi-endpoint", "unix://" + csiSock}
}

// sidecarArgs is the sidecar's command line: csi-provisioner's flags as
// a chart gives them (its socket, no leader election), and the address it
// serves the driver on.
func sidecarArgs(csiSock, kubeconfig, listen string) []string {
	return []string{"--csi-address=" + csiSock, "--kubeconfig=" + kubeconfig, "--leader-election=false",
		"--volplane-listen=" + listen, "--v=1"}
}

// prepareHop makes what the sidecar's discovery checks before the
// provisioner starts: volplane's namespace, the ClusterRole
// volplane-csi-sidecar (as deploy/kubernetes/rbac.yaml ships it) bound to
// the driver's ServiceAccount in the driver's namespace, and its
// controller pod, Ready on 127.0.0.1 as a kubelet would report it (there
// is none).
func (t *trial) prepareHop(ctx context.Context) error {
	c := t.client
	for _, ns := range []string{volplaneNamespace, hopNamespace} {
		if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: sidecar.ClusterRole}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{sidecar.Group}, Resources: []string{sidecar.ResourceDrivers}, Verbs: []string{sidecar.VerbServe}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{sidecar.CAConfigMap}, Verbs: []string{"get"}}}}
	if _, err := c.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		return err
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: hopAccount},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: sidecar.ClusterRole},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: hopAccount, Namespace: hopNamespace}}}
	if _, err := c.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		return err
	}
	if _, err := c.CoreV1().ServiceAccounts(hopNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: hopAccount}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	no := false
	pod, err := c.CoreV1().Pods(hopNamespace).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: hopPod},
		Spec: corev1.PodSpec{ServiceAccountName: hopAccount, AutomountServiceAccountToken: &no, NodeName: benchNode,
			Containers: []corev1.Container{{Name: "csi-provisioner", Image: sidecarProc}}}}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	pod.Status.Phase = corev1.PodRunning
	pod.Status.PodIP, pod.Status.PodIPs = "127.0.0.1", []corev1.PodIP{{IP: "127.0.0.1"}}
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
	_, err = c.CoreV1().Pods(hopNamespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	return err
}

// startSidecar runs volplane-csi-sidecar as the driver pod's
// csi-provisioner container, in front of the dev CSI driver's socket,
// and waits until the provisioner at provisionerAddr has discovered it
// and lists the driver ready.
func (t *trial) startSidecar(ctx context.Context, provisionerAddr string) error {
	listen, err := devenv.FreeAddr()
	if err != nil {
		return err
	}
	p, err := t.startProcessEnv(sidecarProc, filepath.Join(t.o.BinDir, sidecarProc),
		[]string{"POD_NAME=" + hopPod, "POD_NAMESPACE=" + hopNamespace}, sidecarArgs(t.csiSock, t.api.Kubeconfig, listen)...)
	if err != nil {
		return err
	}
	t.procs = append(t.procs, p)
	if err := waitDriverReady(ctx, provisionerAddr, t.certs[callers.Conformance], t.fail, time.Minute); err != nil {
		return fmt.Errorf("%w (log: %s)", err, p.LogPath)
	}
	return nil
}

// waitDriverReady polls the provisioner's ListDrivers, as the binder
// calls it, until the dev CSI driver is listed ready.
func waitDriverReady(ctx context.Context, addr string, tls grpcutil.TLSFiles, fail <-chan error, timeout time.Duration) error {
	cc, err := grpcutil.Dial(addr, tls)
	if err != nil {
		return err
	}
	defer cc.Close()
	client := provisionerv1.NewProvisionerServiceClient(cc)
	last := "not listed"
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); {
		resp, err := client.ListDrivers(ctx, &provisionerv1.ListDriversRequest{})
		if err != nil {
			last = err.Error()
		}
		for _, d := range resp.GetDrivers() {
			if d.GetDriverName() == devcsi.DefaultName {
				if d.GetReady() {
					return nil
				}
				last = "not ready: " + d.GetMessage()
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-fail:
			return err
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("the provisioner did not list %s ready through the sidecar within %s: %s", devcsi.DefaultName, timeout, last)
}
