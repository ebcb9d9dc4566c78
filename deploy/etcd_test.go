package deploy

import (
	"fmt"
	"maps"
	"net/url"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/volplane/volplane/test/harness/manifests"
)

// renderedObjects is a kustomization's objects by kind and name.
type renderedObjects map[string]*unstructured.Unstructured

func renderObjects(t *testing.T, dir string) renderedObjects {
	t.Helper()
	_, objs, err := manifests.Render(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := renderedObjects{}
	for _, o := range objs {
		out[o.GetKind()+"/"+o.GetName()] = o
	}
	// cert-manager's certificates are applied on their own (they are not
	// in the kustomization, which must apply without cert-manager).
	raw, err := os.ReadFile("kubernetes/certificates.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
			t.Fatalf("certificates.yaml: %v", err)
		}
		if u.Object == nil || u.GetKind() != "Certificate" {
			continue
		}
		if _, ok := out[u.GetKind()+"/"+u.GetName()]; !ok {
			out[u.GetKind()+"/"+u.GetName()] = u
		}
	}
	return out
}

func (r renderedObjects) decode(key string, obj any) error {
	u, ok := r[key]
	if !ok {
		return fmt.Errorf("no %s", key)
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, obj, true); err != nil {
		return fmt.Errorf("%s: %w", key, err)
	}
	return nil
}

func (r renderedObjects) into(t *testing.T, key string, obj any) {
	t.Helper()
	if err := r.decode(key, obj); err != nil {
		t.Fatal(err)
	}
}

// flags are a command line's --name=value arguments.
func flags(command []string) map[string]string {
	out := map[string]string{}
	for _, a := range command[1:] {
		k, v, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		out[k] = v
	}
	return out
}

// etcd runs as DESIGN's deployment invariant 7 wants: it needs no claim
// (so no binder) to start or to replace a member, three members on
// emptyDir with the entrypoint that replaces a lost one, compaction and
// an explicit quota, probes on a plaintext port, a budget that keeps its
// quorum through a drain, and certificates that name every member.
func TestEtcdNeedsNoVolplaneBoundClaim(t *testing.T) {
	version := makefileVersion(t)
	for _, dir := range []string{"kubernetes", "overlays/dev", "overlays/csi-driver", "overlays/cluster-dev", "overlays/standalone"} {
		t.Run(dir, func(t *testing.T) {
			objs := renderObjects(t, dir)
			var sts appsv1.StatefulSet
			objs.into(t, "StatefulSet/volplane-etcd", &sts)
			for _, p := range etcdProblems(objs, &sts, version) {
				t.Error(p)
			}
		})
	}
}

// deploy/overlays/one-node, which the local cluster of one node installs,
// is deploy/overlays/cluster-dev with one change: etcd's members prefer a
// node each rather than require one. Nothing else of etcd's guards is
// relaxed. (TestChartRendersTheBase checks that the chart with
// deploy/helm/one-node-values.yaml renders the same objects.)
func TestOneNodeRelaxesOnlyTheMembersNode(t *testing.T) {
	version := makefileVersion(t)
	oneNode, clusterDev := renderObjects(t, "overlays/one-node"), renderObjects(t, "overlays/cluster-dev")
	var sts appsv1.StatefulSet
	oneNode.into(t, "StatefulSet/volplane-etcd", &sts)
	p := etcdProblems(oneNode, &sts, version)
	if len(p) != 1 || !strings.Contains(p[0], "no required anti-affinity by node") {
		t.Errorf("one-node's etcd problems are %v, want only the required anti-affinity by node", p)
	}
	if a := sts.Spec.Template.Spec.Affinity; a == nil || a.PodAntiAffinity == nil ||
		!slices.ContainsFunc(a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution, func(w corev1.WeightedPodAffinityTerm) bool {
			return w.PodAffinityTerm.TopologyKey == corev1.LabelHostname && w.PodAffinityTerm.LabelSelector.MatchLabels["app"] == "volplane-etcd"
		}) {
		t.Errorf("one-node's etcd does not prefer a node per member: %+v", a)
	}
	for _, objs := range []renderedObjects{oneNode, clusterDev} {
		o := objs["StatefulSet/volplane-etcd"].DeepCopy()
		unstructured.RemoveNestedField(o.Object, "spec", "template", "spec", "affinity")
		objs["StatefulSet/volplane-etcd"] = o
	}
	if d := differences(slices.Collect(maps.Values(oneNode)), slices.Collect(maps.Values(clusterDev))); len(d) != 0 {
		t.Errorf("one-node differs from cluster-dev beyond etcd's affinity: %v", d)
	}
}

// The check catches each way back to an etcd that needs volplane, or that
// loses its quorum, its probes or its compaction.
func TestEtcdCheckCatches(t *testing.T) {
	version := makefileVersion(t)
	for _, tc := range []struct {
		name   string
		mutate func(objs renderedObjects, sts *appsv1.StatefulSet)
		want   string
	}{
		{"a volumeClaimTemplate", func(_ renderedObjects, s *appsv1.StatefulSet) {
			s.Spec.VolumeClaimTemplates = []corev1.PersistentVolumeClaim{{}}
		}, "volumeClaimTemplates"},
		{"a claim as the data volume", func(_ renderedObjects, s *appsv1.StatefulSet) {
			s.Spec.Template.Spec.Volumes[0].VolumeSource = corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "x"}}
		}, "is a claim"},
		{"a hostPath", func(_ renderedObjects, s *appsv1.StatefulSet) {
			s.Spec.Template.Spec.Volumes[0].VolumeSource = corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/etcd"}}
		}, "hostPath"},
		{"evicted after 5 minutes of a node down", func(_ renderedObjects, s *appsv1.StatefulSet) {
			five := int64(300)
			s.Spec.Template.Spec.Tolerations[1].TolerationSeconds = &five
		}, "unreachable:NoExecute for good"},
		{"members allowed on one node", func(_ renderedObjects, s *appsv1.StatefulSet) {
			a := s.Spec.Template.Spec.Affinity.PodAntiAffinity
			a.PreferredDuringSchedulingIgnoredDuringExecution = []corev1.WeightedPodAffinityTerm{{Weight: 100, PodAffinityTerm: a.RequiredDuringSchedulingIgnoredDuringExecution[0]}}
			a.RequiredDuringSchedulingIgnoredDuringExecution = nil
		}, "no required anti-affinity by node"},
		{"no spread over zones", func(_ renderedObjects, s *appsv1.StatefulSet) {
			s.Spec.Template.Spec.TopologySpreadConstraints[0].TopologyKey = corev1.LabelHostname
		}, "no spread over zones"},
		{"one member", func(_ renderedObjects, s *appsv1.StatefulSet) { one := int32(1); s.Spec.Replicas = &one }, "want 3, Parallel"},
		{"ordered start", func(_ renderedObjects, s *appsv1.StatefulSet) {
			s.Spec.PodManagementPolicy = appsv1.OrderedReadyPodManagement
		}, "Parallel"},
		{"plain etcd", func(_ renderedObjects, s *appsv1.StatefulSet) {
			s.Spec.Template.Spec.Containers[0].Command[0] = "/usr/local/bin/etcd"
		}, "not the entrypoint"},
		{"no compaction", func(_ renderedObjects, s *appsv1.StatefulSet) {
			c := &s.Spec.Template.Spec.Containers[0]
			c.Command = slices.DeleteFunc(c.Command, func(a string) bool { return strings.HasPrefix(a, "--auto-compaction-retention") })
		}, "auto-compaction-retention"},
		{"no readiness probe", func(_ renderedObjects, s *appsv1.StatefulSet) {
			s.Spec.Template.Spec.Containers[0].ReadinessProbe = nil
		}, "/readyz"},
		{"a budget below the quorum", func(objs renderedObjects, _ *appsv1.StatefulSet) {
			_ = unstructured.SetNestedField(objs["PodDisruptionBudget/volplane-etcd"].Object, int64(1), "spec", "minAvailable")
		}, "minAvailable"},
		{"a certificate without the members' names", func(objs renderedObjects, _ *appsv1.StatefulSet) {
			_ = unstructured.SetNestedStringSlice(objs["Certificate/volplane-etcd"].Object, []string{"volplane-etcd"}, "spec", "dnsNames")
		}, "does not name member"},
		{"members cut off from each other", func(objs renderedObjects, _ *appsv1.StatefulSet) {
			unstructured.RemoveNestedField(objs["NetworkPolicy/volplane-etcd"].Object, "spec", "ingress")
		}, "reach each other"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := renderObjects(t, "kubernetes")
			var sts appsv1.StatefulSet
			objs.into(t, "StatefulSet/volplane-etcd", &sts)
			if p := etcdProblems(objs, &sts, version); len(p) != 0 {
				t.Fatalf("the shipped manifests have problems: %v", p)
			}
			tc.mutate(objs, &sts)
			p := etcdProblems(objs, &sts, version)
			if !slices.ContainsFunc(p, func(s string) bool { return strings.Contains(s, tc.want) }) {
				t.Fatalf("problems %v, want one about %q", p, tc.want)
			}
		})
	}
}

// etcdProblems lists how sts (and the objects around it) miss what
// TestEtcdNeedsNoVolplaneBoundClaim wants.
func etcdProblems(objs renderedObjects, sts *appsv1.StatefulSet, version string) []string {
	var problems []string
	errorf := func(format string, a ...any) { problems = append(problems, fmt.Sprintf(format, a...)) }
	ns := sts.Namespace
	if n := len(sts.Spec.VolumeClaimTemplates); n != 0 {
		errorf("etcd has %d volumeClaimTemplates: its claims would wait for volplane's binder, which waits for etcd", n)
	}
	pod := sts.Spec.Template.Spec
	for _, v := range pod.Volumes {
		switch {
		case v.PersistentVolumeClaim != nil || v.Ephemeral != nil:
			errorf("etcd volume %s is a claim: its binding would need volplane", v.Name)
		case v.HostPath != nil:
			errorf("etcd volume %s is a hostPath, which the restricted Pod Security profile forbids (docs/etcd.md)", v.Name)
		}
	}
	if sts.Spec.Replicas == nil || *sts.Spec.Replicas != 3 || sts.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		errorf("etcd: replicas %v, podManagementPolicy %q: want 3, Parallel (members bootstrap together)", sts.Spec.Replicas, sts.Spec.PodManagementPolicy)
	}
	if !requiredByHost(pod, "volplane-etcd") {
		errorf("etcd: no required anti-affinity by node: two members on one node lose the quorum with it")
	}
	if !slices.ContainsFunc(pod.TopologySpreadConstraints, func(c corev1.TopologySpreadConstraint) bool {
		return c.TopologyKey == corev1.LabelTopologyZone && c.MaxSkew == 1 && c.LabelSelector != nil && c.LabelSelector.MatchLabels["app"] == "volplane-etcd"
	}) {
		errorf("etcd: no spread over zones (topology.kubernetes.io/zone, maxSkew 1)")
	}
	for _, taint := range []string{corev1.TaintNodeNotReady, corev1.TaintNodeUnreachable} {
		if !slices.ContainsFunc(pod.Tolerations, func(tl corev1.Toleration) bool {
			return tl.Key == taint && tl.Operator == corev1.TolerationOpExists && tl.Effect == corev1.TaintEffectNoExecute && tl.TolerationSeconds == nil
		}) {
			errorf("etcd does not tolerate %s:NoExecute for good: a node down for 5 minutes would have its member evicted, and a power loss of every node would empty every member's data", taint)
		}
	}
	if len(pod.Containers) != 1 {
		return append(problems, fmt.Sprintf("etcd: %d containers, want 1", len(pod.Containers)))
	}
	c := pod.Containers[0]
	if want := "ghcr.io/volplane/etcd:" + version; c.Image != want {
		errorf("etcd image %q, want %s", c.Image, want)
	}
	if len(c.Command) == 0 || c.Command[0] != "/usr/local/bin/volplane-etcd-member" {
		return append(problems, fmt.Sprintf("etcd runs %v, not the entrypoint that replaces a lost member", c.Command))
	}
	f := flags(c.Command)
	for k, want := range map[string]string{"auto-compaction-mode": "periodic", "data-dir": "/var/lib/etcd/data"} {
		if f[k] != want {
			errorf("etcd --%s=%q, want %q", k, f[k], want)
		}
	}
	for _, k := range []string{"auto-compaction-retention", "quota-backend-bytes"} {
		if f[k] == "" || f[k] == "0" {
			errorf("etcd --%s not set explicitly", k)
		}
	}
	// The data directory is on an emptyDir.
	dataOnEmptyDir := false
	for _, m := range c.VolumeMounts {
		for _, v := range pod.Volumes {
			if v.Name == m.Name && v.EmptyDir != nil && strings.HasPrefix(f["data-dir"], m.MountPath+"/") {
				dataOnEmptyDir = v.EmptyDir.SizeLimit != nil
			}
		}
	}
	if !dataOnEmptyDir {
		errorf("etcd --data-dir is not on an emptyDir with a size limit")
	}
	// Every member by its pod's DNS name, in the order the StatefulSet
	// names its pods.
	var hosts []string
	members := strings.Split(f["initial-cluster"], ",")
	if len(members) != 3 {
		errorf("--initial-cluster lists %d members, want 3: %s", len(members), f["initial-cluster"])
	}
	for i, m := range members {
		name, peer, _ := strings.Cut(m, "=")
		u, err := url.Parse(peer)
		pod := fmt.Sprintf("%s-%d", sts.Name, i)
		if want := fmt.Sprintf("%s.%s.%s.svc", pod, sts.Spec.ServiceName, ns); err != nil || name != pod || u.Scheme != "https" || u.Hostname() != want {
			errorf("--initial-cluster member %q, want %s=https://%s:port", m, pod, want)
		}
		hosts = append(hosts, u.Hostname())
	}
	if want := "https://$(POD_NAME)." + sts.Spec.ServiceName + "." + ns + ".svc:2379"; f["advertise-client-urls"] != want {
		errorf("--advertise-client-urls %q, want %s", f["advertise-client-urls"], want)
	}
	// Probes on the plaintext metrics port.
	m, err := url.Parse(f["listen-metrics-urls"])
	if err != nil || m.Scheme != "http" {
		return append(problems, fmt.Sprintf("--listen-metrics-urls %q: want a plaintext http:// URL", f["listen-metrics-urls"]))
	}
	for what, p := range map[string]*corev1.Probe{"/readyz": c.ReadinessProbe, "/livez": c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != what || p.HTTPGet.Port.String() != m.Port() || p.HTTPGet.Scheme == corev1.URISchemeHTTPS {
			errorf("etcd probe %s: %+v, want an http GET on port %s", what, p, m.Port())
		}
	}
	// The headless Service gives the names before the pods are Ready.
	var svc corev1.Service
	if err := objs.decode("Service/"+sts.Spec.ServiceName, &svc); err != nil {
		errorf("%v", err)
	}
	if svc.Spec.ClusterIP != corev1.ClusterIPNone || !svc.Spec.PublishNotReadyAddresses || svc.Spec.Selector["app"] != sts.Spec.Template.Labels["app"] {
		errorf("Service %s: clusterIP %q, publishNotReadyAddresses %v: want headless, publishing members not Ready yet", svc.Name, svc.Spec.ClusterIP, svc.Spec.PublishNotReadyAddresses)
	}
	// A drain keeps the quorum.
	var pdb policyv1.PodDisruptionBudget
	if err := objs.decode("PodDisruptionBudget/volplane-etcd", &pdb); err != nil {
		errorf("%v", err)
	}
	if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 2 {
		errorf("etcd's PodDisruptionBudget: minAvailable %v, want 2 (the quorum of 3)", pdb.Spec.MinAvailable)
	}
	// The certificate names every member (etcd resolves a peer's names to
	// check its address).
	cert := objs["Certificate/volplane-etcd"]
	if cert == nil {
		return append(problems, "no Certificate volplane-etcd")
	}
	names, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
	usages, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "usages")
	for _, h := range hosts {
		if !slices.Contains(names, h) {
			errorf("Certificate volplane-etcd does not name member %s: %v", h, names)
		}
	}
	if !slices.Contains(usages, "server auth") || !slices.Contains(usages, "client auth") {
		errorf("Certificate volplane-etcd usages %v: want server and client auth (members are each other's clients)", usages)
	}
	// Members reach each other; Prometheus and the kubelet reach metrics.
	var np networkingv1.NetworkPolicy
	if err := objs.decode("NetworkPolicy/volplane-etcd", &np); err != nil {
		errorf("%v", err)
	}
	ports := map[string]bool{}
	open := map[string]bool{}
	for _, rule := range np.Spec.Ingress {
		for _, p := range rule.Ports {
			if len(rule.From) == 0 {
				open[p.Port.String()] = true
			}
			for _, from := range rule.From {
				if from.PodSelector != nil && from.PodSelector.MatchLabels["app"] == "volplane-etcd" {
					ports[p.Port.String()] = true
				}
				if from.NamespaceSelector != nil && from.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] == "monitoring" {
					open[p.Port.String()] = true
				}
			}
		}
	}
	if !ports["2380"] || !ports[f["status-port"]] || !ports["2379"] {
		errorf("etcd's NetworkPolicy lets the members reach each other on %v, want the client, peer and status ports", ports)
	}
	if !open[m.Port()] {
		errorf("etcd's NetworkPolicy closes the metrics port %s to Prometheus (namespace monitoring)", m.Port())
	}
	return problems
}

// Backups are on by default: the base renders a CronJob whose command
// line volplane-etcd-backup accepts, reaching every member, restricted,
// with no volume but its certificate (so nothing volplane must bind),
// exporting into the Secret the base creates, with a Role that may read
// and rewrite that one Secret and nothing else; etcd's NetworkPolicy lets
// it in. The etcd-backup Component adds snapshots into a claim to the
// same CronJob.
func TestEtcdBackupIsOnByDefault(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every binary")
	}
	bin := build(t)
	version := makefileVersion(t)
	objs := renderObjects(t, "kubernetes")
	tmpl, f := checkBackupCronJob(t, objs, bin, version)
	if f["secret"] != "volplane-etcd-backup" || f["dir"] != "" {
		t.Errorf("backup --secret %q --dir %q, want the Secret volplane-etcd-backup and no directory", f["secret"], f["dir"])
	}
	for _, v := range tmpl.Spec.Volumes {
		if v.Secret == nil {
			t.Errorf("backup volume %s is not a Secret: the default backup must need nothing volplane binds", v.Name)
		}
	}
	if objs["Secret/volplane-etcd-backup"] == nil {
		t.Error("the base has no Secret volplane-etcd-backup for the exports (the backup may not create one)")
	}
	var role rbacv1.Role
	objs.into(t, "Role/volplane-etcd-backup", &role)
	want := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{"volplane-etcd-backup"}, Verbs: []string{"get", "update"}}}
	if !reflect.DeepEqual(role.Rules, want) {
		t.Errorf("the backup's Role: %+v, want only get and update of its Secret %+v", role.Rules, want)
	}
	if tmpl.Spec.ServiceAccountName != "volplane-etcd-backup" {
		t.Errorf("the backup runs as ServiceAccount %q, want volplane-etcd-backup (its Role's)", tmpl.Spec.ServiceAccountName)
	}

	withDir := renderObjects(t, backupOverlay(t))
	_, f = checkBackupCronJob(t, withDir, bin, version)
	if f["dir"] == "" || f["keep"] == "" || f["secret"] == "" {
		t.Errorf("with the etcd-backup Component: backup --dir %q --keep %q --secret %q, want all three", f["dir"], f["keep"], f["secret"])
	}
	if withDir["PersistentVolumeClaim/volplane-etcd-backup"] == nil {
		t.Error("the etcd-backup Component has no backup claim")
	}
}

// checkBackupCronJob checks the CronJob volplane-etcd-backup of objs and
// returns its pod template and its container's flags.
func checkBackupCronJob(t *testing.T, objs renderedObjects, bin, version string) (corev1.PodTemplateSpec, map[string]string) {
	t.Helper()
	var sts appsv1.StatefulSet
	objs.into(t, "StatefulSet/volplane-etcd", &sts)
	var cj batchv1.CronJob
	objs.into(t, "CronJob/volplane-etcd-backup", &cj)
	if cj.Spec.ConcurrencyPolicy != batchv1.ForbidConcurrent {
		t.Errorf("the backup CronJob's concurrencyPolicy %q, want Forbid", cj.Spec.ConcurrencyPolicy)
	}
	tmpl := cj.Spec.JobTemplate.Spec.Template
	ps := tmpl.Spec.SecurityContext
	if ps == nil || ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot || ps.SeccompProfile == nil || ps.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("the backup pod is not restricted (runAsNonRoot, seccomp RuntimeDefault): %+v", ps)
	}
	for _, c := range tmpl.Spec.Containers {
		sc := c.SecurityContext
		if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
			t.Errorf("backup container %s: securityContext %+v", c.Name, sc)
		}
		if c.ImagePullPolicy != corev1.PullIfNotPresent || c.Resources.Limits.Memory().IsZero() || c.Resources.Requests.Cpu().IsZero() {
			t.Errorf("backup container %s: pull policy %q, resources %+v", c.Name, c.ImagePullPolicy, c.Resources)
		}
		acceptsFlags(t, bin, "backup container "+c.Name, c.Command)
	}
	for _, v := range tmpl.Spec.Volumes {
		if v.HostPath != nil {
			t.Errorf("backup volume %s is a hostPath", v.Name)
		}
	}
	c := tmpl.Spec.Containers[0]
	if c.Image != "ghcr.io/volplane/etcd:"+version {
		t.Errorf("backup image %s", c.Image)
	}
	f := flags(c.Command)
	var want []string
	for i := 0; i < int(*sts.Spec.Replicas); i++ {
		want = append(want, fmt.Sprintf("https://%s-%d.%s.%s.svc:2379", sts.Name, i, sts.Spec.ServiceName, sts.Namespace))
	}
	if got := strings.Split(f["etcd-endpoints"], ","); !slices.Equal(got, want) {
		t.Errorf("backup --etcd-endpoints %v, want every member %v", got, want)
	}
	var np networkingv1.NetworkPolicy
	objs.into(t, "NetworkPolicy/volplane-etcd", &np)
	admitted := false
	for _, rule := range np.Spec.Ingress {
		for _, from := range rule.From {
			admitted = admitted || (from.PodSelector != nil && from.PodSelector.MatchLabels["app"] == tmpl.Labels["app"])
		}
	}
	if !admitted {
		t.Errorf("etcd's NetworkPolicy does not let the backup job (app=%s) in", tmpl.Labels["app"])
	}
	return tmpl, f
}
