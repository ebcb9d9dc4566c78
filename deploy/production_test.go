package deploy

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/volplane/volplane/internal/certs"
)

// kustomizations are the base and the overlays a platform team applies.
var kustomizations = []string{"kubernetes", "overlays/dev", "overlays/csi-driver", "overlays/cluster-dev", "overlays/standalone"}

// rendered is one kustomization's objects, decoded, by kind.
type rendered struct {
	workloads     []workload
	services      []*corev1.Service
	namespaces    map[string]*corev1.Namespace
	policies      []*networkingv1.NetworkPolicy
	clusterRoles  map[string]*rbacv1.ClusterRole
	roles         map[string]*rbacv1.Role // by namespace/name
	crBindings    []*rbacv1.ClusterRoleBinding
	roleBindings  []*rbacv1.RoleBinding
	flowSchemas   []*flowcontrolv1.FlowSchema
	priorityLevel map[string]*flowcontrolv1.PriorityLevelConfiguration
}

// mainContainer is the container of w that runs its component (named as
// the component: "provisioner" in volplane-provisioner), else the first:
// an overlay may add or reorder containers (a CSI driver's next to the
// provisioner).
func mainContainer(w workload) corev1.Container {
	cs := w.template.Spec.Containers
	for _, c := range cs {
		if "volplane-"+c.Name == w.name {
			return c
		}
	}
	return cs[0]
}

// workload is a Deployment or StatefulSet: its pods' names and template.
type workload struct {
	name, namespace string
	pods            []string // a StatefulSet's pod names; nil for a Deployment
	template        corev1.PodTemplateSpec
}

func decodeAll(t *testing.T, dir string) *rendered {
	t.Helper()
	r := &rendered{namespaces: map[string]*corev1.Namespace{}, clusterRoles: map[string]*rbacv1.ClusterRole{}, roles: map[string]*rbacv1.Role{},
		priorityLevel: map[string]*flowcontrolv1.PriorityLevelConfiguration{}}
	for i, doc := range render(t, dir) {
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("%s #%d: %v", dir, i, err)
		}
		switch o := obj.(type) {
		case *appsv1.Deployment:
			r.workloads = append(r.workloads, workload{name: o.Name, namespace: o.Namespace, template: o.Spec.Template})
		case *appsv1.StatefulSet:
			w := workload{name: o.Name, namespace: o.Namespace, template: o.Spec.Template}
			for i := range *o.Spec.Replicas {
				w.pods = append(w.pods, o.Name+"-"+strconv.Itoa(int(i)))
			}
			r.workloads = append(r.workloads, w)
		case *corev1.Service:
			r.services = append(r.services, o)
		case *corev1.Namespace:
			r.namespaces[o.Name] = o
		case *networkingv1.NetworkPolicy:
			r.policies = append(r.policies, o)
		case *rbacv1.ClusterRole:
			r.clusterRoles[o.Name] = o
		case *rbacv1.Role:
			r.roles[o.Namespace+"/"+o.Name] = o
		case *rbacv1.ClusterRoleBinding:
			r.crBindings = append(r.crBindings, o)
		case *rbacv1.RoleBinding:
			r.roleBindings = append(r.roleBindings, o)
		case *flowcontrolv1.FlowSchema:
			r.flowSchemas = append(r.flowSchemas, o)
		case *flowcontrolv1.PriorityLevelConfiguration:
			r.priorityLevel[o.Name] = o
		}
	}
	return r
}

func (r *rendered) workload(t *testing.T, name string) workload {
	t.Helper()
	for _, w := range r.workloads {
		if w.name == name {
			return w
		}
	}
	t.Fatalf("no workload %s", name)
	return workload{}
}

// flagValue is the value of --name=value in a container's command line.
func flagValue(c corev1.Container, name string) (string, bool) {
	for _, a := range append(append([]string{}, c.Command...), c.Args...) {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// containerPort resolves a probe's or policy's port (a number or a
// container port's name) on c.
func containerPort(c corev1.Container, p intstr.IntOrString) (int32, bool) {
	for _, cp := range c.Ports {
		if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
			return cp.ContainerPort, true
		}
	}
	return 0, false
}

// binderless is 1 for a kustomization that runs no binder (standalone
// mode): one Secret and one certificate fewer.
func binderless(dir string) int {
	if len(componentsOf(dir)) < len(components) {
		return 1
	}
	return 0
}

// Every volplane service's readiness probe is /readyz and its liveness
// probe /livez on its debug port (the gateway: /readyz and /healthz on
// its HTTPS port), each on a port the container declares and the process
// listens on.
func TestProbesMeanSomething(t *testing.T) {
	for _, dir := range kustomizations {
		t.Run(dir, func(t *testing.T) {
			r := decodeAll(t, dir)
			for _, name := range componentsOf(dir) {
				w := r.workload(t, name)
				c := mainContainer(w)
				where := name + " container " + c.Name
				listen := map[int32]bool{}
				for _, f := range []string{"debug-address", "listen"} {
					if v, ok := flagValue(c, f); ok {
						p, _ := strconv.Atoi(v[strings.LastIndex(v, ":")+1:])
						listen[int32(p)] = true
					}
				}
				readyPath, livePath, scheme := "/readyz", "/livez", corev1.URISchemeHTTP
				if name == "volplane-gateway" {
					livePath, scheme = "/healthz", corev1.URISchemeHTTPS
				}
				for _, p := range []struct {
					kind  string
					probe *corev1.Probe
					path  string
				}{{"readiness", c.ReadinessProbe, readyPath}, {"liveness", c.LivenessProbe, livePath}} {
					if p.probe == nil || p.probe.HTTPGet == nil {
						t.Errorf("%s: no HTTP %s probe", where, p.kind)
						continue
					}
					g := p.probe.HTTPGet
					port, ok := containerPort(c, g.Port)
					switch {
					case g.Path != p.path:
						t.Errorf("%s: %s probe on %s, want %s", where, p.kind, g.Path, p.path)
					case !ok:
						t.Errorf("%s: %s probe port %s is not a port of the container", where, p.kind, g.Port.String())
					case !listen[port]:
						t.Errorf("%s: %s probe port %d is not where the process listens (%v)", where, p.kind, port, listen)
					case g.Scheme != "" && g.Scheme != scheme || g.Scheme == "" && scheme != corev1.URISchemeHTTP:
						t.Errorf("%s: %s probe scheme %q, want %s", where, p.kind, g.Scheme, scheme)
					}
				}
				if lp := c.LivenessProbe; lp != nil && lp.PeriodSeconds*max(lp.FailureThreshold, 1) < 20 {
					t.Errorf("%s: liveness kills after %ds of failures: too eager", where, lp.PeriodSeconds*lp.FailureThreshold)
				}
			}
		})
	}
}

// Every image is fully qualified (a registry host in its name), so a
// runtime pulls exactly it; volplane's is ghcr.io/volplane/volplane at the
// Makefile's VERSION, etcd's volplane's etcd build.
func TestImagesFullyQualified(t *testing.T) {
	version := makefileVersion(t)
	for _, dir := range kustomizations {
		t.Run(dir, func(t *testing.T) {
			r := decodeAll(t, dir)
			for _, w := range r.workloads {
				for _, c := range append(append([]corev1.Container{}, w.template.Spec.InitContainers...), w.template.Spec.Containers...) {
					host, _, ok := strings.Cut(c.Image, "/")
					if !ok || !(strings.ContainsAny(host, ".:") || host == "localhost") {
						t.Errorf("%s/%s: image %q is not fully qualified (registry/repository:tag)", w.name, c.Name, c.Image)
					}
					if strings.Contains(c.Image, "volplane/volplane") && c.Image != "ghcr.io/volplane/volplane:"+version {
						t.Errorf("%s/%s: image %q, want ghcr.io/volplane/volplane:%s", w.name, c.Name, c.Image, version)
					}
					if w.name == "volplane-etcd" && c.Image != "ghcr.io/volplane/etcd:"+version {
						t.Errorf("%s/%s: image %q, want ghcr.io/volplane/etcd:%s (volplane's etcd entrypoint)", w.name, c.Name, c.Image, version)
					}
				}
			}
		})
	}
}

// hostPort finds host:port in a command-line argument (a URL's too).
var hostPort = regexp.MustCompile(`(?:^|[=,/])([A-Za-z0-9$()][A-Za-z0-9$().-]*):([0-9]{2,5})\b`)

// The documented step without cert-manager (volplane-certs, internal/certs)
// makes every Secret the rendered manifests mount, with every key their
// command lines read; and each certificate verifies, under the CA the
// services trust, for every name a manifest reaches its component by: the
// addresses in the command lines (a StatefulSet pod's own
// $(POD_NAME).<peers> name for each replica) and every Service's names.
func TestCertificateStepMakesEverySecret(t *testing.T) {
	secrets, err := certs.Make(certs.Options{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	made := map[string]*corev1.Secret{}
	for _, s := range secrets {
		made[s.Name] = s
	}
	for _, dir := range kustomizations {
		t.Run(dir, func(t *testing.T) {
			r := decodeAll(t, dir)
			// servingCert: the serving certificate of each container port.
			servingCert := map[int32]*x509.Certificate{}
			servingCA := map[int32]*x509.CertPool{}
			byWorkload := map[string]*x509.Certificate{}
			referenced := 0
			for _, w := range r.workloads {
				spec := w.template.Spec
				secretOf := map[string]corev1.SecretVolumeSource{}
				for _, v := range spec.Volumes {
					if v.Secret != nil {
						secretOf[v.Name] = *v.Secret
					}
					if v.Projected != nil {
						for _, src := range v.Projected.Sources {
							if src.Secret != nil {
								t.Errorf("%s: projected Secret %s: teach this test to read it", w.name, src.Secret.Name)
							}
						}
					}
				}
				// file resolves a path in a secret volume to its Secret's key.
				file := func(c corev1.Container, p string) (*corev1.Secret, string, bool) {
					for _, m := range c.VolumeMounts {
						sv, ok := secretOf[m.Name]
						rel, under := strings.CutPrefix(p, m.MountPath+"/")
						if !ok || !under {
							continue
						}
						key := rel
						for _, it := range sv.Items {
							if it.Path == rel {
								key = it.Key
							}
						}
						return made[sv.SecretName], key, true
					}
					return nil, "", false
				}
				for _, sv := range secretOf {
					referenced++
					if made[sv.SecretName] == nil {
						t.Errorf("%s mounts Secret %s, which the certificate step does not make", w.name, sv.SecretName)
					}
					for _, it := range sv.Items {
						if s := made[sv.SecretName]; s != nil && s.Data[it.Key] == nil {
							t.Errorf("%s mounts key %s of Secret %s, which has none", w.name, it.Key, sv.SecretName)
						}
					}
				}
				for _, c := range spec.Containers {
					for _, a := range append(append([]string{}, c.Command...), c.Args...) {
						_, v, ok := strings.Cut(a, "=")
						if !ok || !strings.HasPrefix(v, "/") {
							continue
						}
						if s, key, ok := file(c, v); ok && s != nil && s.Data[key] == nil {
							t.Errorf("%s/%s: %s reads key %s of Secret %s, which has none", w.name, c.Name, a, key, s.Name)
						}
					}
					// The certificate this container serves with.
					certFlag, caFlag := "tls-cert-file", "tls-ca-file"
					if c.Name == "etcd" {
						certFlag, caFlag = "cert-file", "trusted-ca-file"
					}
					if c.Name == "gateway" {
						certFlag = "tls-serving-cert-file"
					}
					certPath, ok1 := flagValue(c, certFlag)
					caPath, ok2 := flagValue(c, caFlag)
					if !ok1 || !ok2 {
						continue
					}
					cs, ckey, _ := file(c, certPath)
					as, akey, _ := file(c, caPath)
					if cs == nil || as == nil {
						continue
					}
					cert := parseCert(t, cs.Data[ckey])
					pool := x509.NewCertPool()
					pool.AppendCertsFromPEM(as.Data[akey])
					// It is a client of the other services too.
					if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
						t.Errorf("%s/%s: its certificate is no client certificate of the CA it trusts: %v", w.name, c.Name, err)
					}
					byWorkload[w.name] = cert
					for _, p := range c.Ports {
						servingCert[p.ContainerPort], servingCA[p.ContainerPort] = cert, pool
					}
				}
			}
			if referenced < 7-binderless(dir) {
				t.Errorf("%d Secret volumes in the manifests: the walk missed some", referenced)
			}
			verify := func(where, host string, port int32) {
				cert := servingCert[port]
				if cert == nil {
					return // not a TLS port of volplane's (a CSI socket, the debug port)
				}
				if _, err := cert.Verify(x509.VerifyOptions{Roots: servingCA[port], DNSName: host, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
					t.Errorf("%s: %s:%d does not verify: %v", where, host, port, err)
				}
			}
			names := 0
			for _, w := range r.workloads {
				for _, c := range w.template.Spec.Containers {
					for _, a := range append(append([]string{}, c.Command...), c.Args...) {
						for _, m := range hostPort.FindAllStringSubmatch(a, -1) {
							host := m[1]
							port, _ := strconv.Atoi(m[2])
							if host == "0.0.0.0" || host == "127.0.0.1" || host == "localhost" {
								continue
							}
							hosts := []string{host}
							if strings.Contains(host, "$(POD_NAME)") {
								hosts = nil
								for _, p := range w.pods {
									hosts = append(hosts, strings.ReplaceAll(host, "$(POD_NAME)", p))
								}
							}
							for _, h := range hosts {
								names++
								verify(w.name+"/"+c.Name+" "+a, h, int32(port))
							}
						}
					}
				}
			}
			for _, svc := range r.services {
				for _, p := range svc.Spec.Ports {
					target := p.Port
					if p.TargetPort.IntVal != 0 {
						target = p.TargetPort.IntVal
					}
					ns := svc.Namespace
					for _, h := range []string{svc.Name, svc.Name + "." + ns, svc.Name + "." + ns + ".svc"} {
						names++
						verify("Service "+svc.Name, h, target)
					}
				}
			}
			if names < 20 || len(byWorkload) < 6-binderless(dir) {
				t.Errorf("checked %d names and %d certificates: the walk missed some", names, len(byWorkload))
			}
		})
	}
}

func parseCert(t *testing.T, b []byte) *x509.Certificate {
	t.Helper()
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("no PEM certificate: %q", b)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// allows reports whether rules grant verb on resource (group "").
func allows(rules []rbacv1.PolicyRule, verb, resource string) bool {
	for _, r := range rules {
		if (slices.Contains(r.APIGroups, "") || slices.Contains(r.APIGroups, "*")) &&
			(slices.Contains(r.Resources, resource) || slices.Contains(r.Resources, "*")) &&
			(slices.Contains(r.Verbs, verb) || slices.Contains(r.Verbs, "*")) && len(r.ResourceNames) == 0 {
			return true
		}
	}
	return false
}

func boundTo(subjects []rbacv1.Subject, ns, sa string) bool {
	for _, s := range subjects {
		if s.Kind == rbacv1.ServiceAccountKind && s.Name == sa && s.Namespace == ns {
			return true
		}
	}
	return false
}

// The reclaimer may write pods only in its recycler namespace: no
// ClusterRole bound to it grants a pod write anywhere (it keeps listing
// pods, read only, for the guard before a scrub), and a Role in the
// namespace its --recycler-namespace names grants what a recycler pod
// needs. No other volplane component may write pods at all.
func TestReclaimerPodRightsConfined(t *testing.T) {
	writes := []string{"create", "delete", "deletecollection", "update", "patch"}
	for _, dir := range kustomizations {
		t.Run(dir, func(t *testing.T) {
			r := decodeAll(t, dir)
			w := r.workload(t, "volplane-reclaimer")
			ns, ok := flagValue(mainContainer(w), "recycler-namespace")
			if !ok || ns == "default" || ns == "volplane-system" {
				t.Fatalf("the reclaimer's --recycler-namespace is %q: want a namespace of its own", ns)
			}
			if r.namespaces[ns] == nil {
				t.Errorf("the manifests do not create the recycler namespace %s", ns)
			}
			for _, b := range r.crBindings {
				for _, c := range componentsOf(dir) {
					if !boundTo(b.Subjects, "volplane-system", c) {
						continue
					}
					cr := r.clusterRoles[b.RoleRef.Name]
					if cr == nil {
						t.Fatalf("ClusterRoleBinding %s names a missing ClusterRole", b.Name)
					}
					for _, v := range writes {
						if allows(cr.Rules, v, "pods") {
							t.Errorf("%s may %s pods in every namespace (ClusterRole %s)", c, v, cr.Name)
						}
					}
				}
			}
			granted := map[string]bool{}
			for _, b := range r.roleBindings {
				if b.Namespace != ns || !boundTo(b.Subjects, "volplane-system", "volplane-reclaimer") || b.RoleRef.Kind != "Role" {
					continue
				}
				role := r.roles[ns+"/"+b.RoleRef.Name]
				if role == nil {
					t.Fatalf("RoleBinding %s/%s names a missing Role", ns, b.Name)
				}
				for _, v := range []string{"create", "get", "list", "watch", "delete"} {
					granted[v] = granted[v] || allows(role.Rules, v, "pods")
				}
				granted["events"] = granted["events"] || allows(role.Rules, "watch", "events")
			}
			for _, v := range []string{"create", "get", "list", "watch", "delete", "events"} {
				if !granted[v] {
					t.Errorf("no Role in %s grants the reclaimer %s (pods, or watching events)", ns, v)
				}
			}
		})
	}
}

// request is what an API Priority and Fairness FlowSchema matches on.
type request struct {
	user, verb, group, resource, namespace string
	nonResourceURL                         string
}

func saUser(name string) string { return "system:serviceaccount:volplane-system:" + name }

// flowSchemaOf is the FlowSchema a request matches, among fss, as the API
// server picks it: the lowest matchingPrecedence whose rules match; nil
// when none does (the API server's own then: service-accounts, at
// workload-low, for a ServiceAccount).
func flowSchemaOf(fss []*flowcontrolv1.FlowSchema, q request) *flowcontrolv1.FlowSchema {
	sorted := append([]*flowcontrolv1.FlowSchema(nil), fss...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Spec.MatchingPrecedence < sorted[j].Spec.MatchingPrecedence })
	in := func(list []string, v string) bool { return slices.Contains(list, v) || slices.Contains(list, "*") }
	for _, fs := range sorted {
		for _, rule := range fs.Spec.Rules {
			subject := false
			for _, s := range rule.Subjects {
				switch s.Kind {
				case flowcontrolv1.SubjectKindServiceAccount:
					subject = subject || saUser(s.ServiceAccount.Name) == q.user && s.ServiceAccount.Namespace == "volplane-system" ||
						s.ServiceAccount.Name == "*" && strings.HasPrefix(q.user, "system:serviceaccount:"+s.ServiceAccount.Namespace+":")
				case flowcontrolv1.SubjectKindUser:
					subject = subject || s.User.Name == q.user || s.User.Name == "*"
				case flowcontrolv1.SubjectKindGroup:
					subject = subject || s.Group.Name == "system:authenticated" || s.Group.Name == "system:serviceaccounts"
				}
			}
			if !subject {
				continue
			}
			if q.nonResourceURL != "" {
				for _, nr := range rule.NonResourceRules {
					if in(nr.Verbs, q.verb) && (in(nr.NonResourceURLs, q.nonResourceURL)) {
						return fs
					}
				}
				continue
			}
			for _, rr := range rule.ResourceRules {
				scope := q.namespace == "" && rr.ClusterScope || q.namespace != "" && in(rr.Namespaces, q.namespace)
				if in(rr.Verbs, q.verb) && in(rr.APIGroups, q.group) && in(rr.Resources, q.resource) && scope {
					return fs
				}
			}
		}
	}
	return nil
}

// volplane's controllers get kube-controller-manager's standing with the
// API server's priority and fairness: every request of the watcher, the
// binder, the provisioner and the reclaimer goes to a priority level with
// workload-high's shares and queuing (bootstrap configuration of v1.36);
// the gateway's reviews for REST users, and the binder's requests made
// only for a REST user (MatchClaim, ExplainClaim), do not.
func TestFlowSchemaGivesControllersTheirStanding(t *testing.T) {
	for _, dir := range kustomizations {
		t.Run(dir, func(t *testing.T) {
			r := decodeAll(t, dir)
			if len(r.flowSchemas) == 0 {
				t.Fatal("no FlowSchema")
			}
			for _, q := range []request{
				{user: saUser("volplane-watcher"), verb: "list", resource: "persistentvolumeclaims"},
				{user: saUser("volplane-watcher"), verb: "watch", resource: "pods"},
				{user: saUser("volplane-binder"), verb: "update", resource: "persistentvolumes"},
				{user: saUser("volplane-binder"), verb: "update", resource: "persistentvolumeclaims", namespace: "team"},
				{user: saUser("volplane-binder"), verb: "create", group: "events.k8s.io", resource: "events", namespace: "team"},
				{user: saUser("volplane-provisioner"), verb: "create", resource: "persistentvolumes"},
				{user: saUser("volplane-provisioner"), verb: "get", resource: "secrets", namespace: "team"},
				{user: saUser("volplane-provisioner"), verb: "update", group: "storage.k8s.io", resource: "csistoragecapacities", namespace: "volplane-system"},
				{user: saUser("volplane-reclaimer"), verb: "delete", resource: "persistentvolumes"},
				{user: saUser("volplane-reclaimer"), verb: "create", resource: "pods", namespace: "volplane-recycler"},
				{user: saUser("volplane-binder"), verb: "get", nonResourceURL: "/readyz"},
			} {
				fs := flowSchemaOf(r.flowSchemas, q)
				if fs == nil {
					t.Errorf("%+v: no volplane FlowSchema matches (workload-low)", q)
					continue
				}
				pl := r.priorityLevel[fs.Spec.PriorityLevelConfiguration.Name]
				if pl == nil {
					t.Errorf("%+v: FlowSchema %s's priority level %s is not shipped", q, fs.Name, fs.Spec.PriorityLevelConfiguration.Name)
					continue
				}
				// workload-high: Limited, 40 shares, 50% lendable, 128 queues, hand 6, 50 long.
				l := pl.Spec.Limited
				if pl.Spec.Type != flowcontrolv1.PriorityLevelEnablementLimited || l == nil || l.NominalConcurrencyShares == nil || *l.NominalConcurrencyShares < 40 ||
					l.LendablePercent == nil || *l.LendablePercent > 50 || l.LimitResponse.Type != flowcontrolv1.LimitResponseTypeQueue ||
					l.LimitResponse.Queuing == nil || l.LimitResponse.Queuing.Queues < 128 || l.LimitResponse.Queuing.QueueLengthLimit < 50 {
					t.Errorf("%+v: priority level %s has less than workload-high's standing: %+v", q, pl.Name, pl.Spec)
				}
				if fs.Spec.MatchingPrecedence >= 9000 || fs.Spec.MatchingPrecedence <= 800 {
					t.Errorf("FlowSchema %s: matchingPrecedence %d, want after the API server's own (800) and before service-accounts (9000)", fs.Name, fs.Spec.MatchingPrecedence)
				}
			}
			for _, q := range []request{
				{user: saUser("volplane-gateway"), verb: "create", group: "authentication.k8s.io", resource: "tokenreviews"},
				{user: saUser("volplane-gateway"), verb: "create", group: "authorization.k8s.io", resource: "subjectaccessreviews"},
				{user: saUser("volplane-binder"), verb: "create", resource: "persistentvolumeclaims", namespace: "team"},
				{user: saUser("volplane-binder"), verb: "get", resource: "nodes"},
				{user: "alice", verb: "get", resource: "persistentvolumes"},
				{user: "system:serviceaccount:team:app", verb: "list", resource: "pods", namespace: "team"},
			} {
				fs := flowSchemaOf(r.flowSchemas, q)
				if fs == nil {
					continue
				}
				if pl := fs.Spec.PriorityLevelConfiguration.Name; pl != "workload-low" && pl != "global-default" && pl != "catch-all" {
					t.Errorf("%+v: a REST user's request matches FlowSchema %s, priority level %s", q, fs.Name, pl)
				}
			}
		})
	}
}

// policyAllows reports whether the NetworkPolicies let a pod of another
// namespace, whose namespace has the labels fromNS, reach port on pod (of
// namespace podNS).
func policyAllows(t *testing.T, policies []*networkingv1.NetworkPolicy, podNS string, pod corev1.PodTemplateSpec, fromNS map[string]string, port int32) bool {
	t.Helper()
	sel := func(s *metav1.LabelSelector, l map[string]string) bool {
		ls, err := metav1.LabelSelectorAsSelector(s)
		if err != nil {
			t.Fatal(err)
		}
		return ls.Matches(labels.Set(l))
	}
	isolated, allowed := false, false
	for _, np := range policies {
		if np.Namespace != podNS || !sel(&np.Spec.PodSelector, pod.Labels) || !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
			continue
		}
		isolated = true
		for _, rule := range np.Spec.Ingress {
			peerOK := len(rule.From) == 0
			for _, peer := range rule.From {
				// The caller is a pod without volplane's labels in another
				// namespace: a peer of pods alone (the policy's namespace)
				// never matches it, and a pod selector next to a namespace
				// selector must match its (empty) labels.
				if peer.NamespaceSelector != nil && sel(peer.NamespaceSelector, fromNS) &&
					(peer.PodSelector == nil || sel(peer.PodSelector, map[string]string{})) {
					peerOK = true
				}
			}
			portOK := len(rule.Ports) == 0
			for _, p := range rule.Ports {
				if p.Port == nil {
					portOK = true
					continue
				}
				for _, c := range pod.Spec.Containers {
					if n, ok := containerPort(c, *p.Port); ok && n == port {
						portOK = true
					}
				}
			}
			allowed = allowed || peerOK && portOK
		}
	}
	return !isolated || allowed
}

// Prometheus, in the namespace "monitoring", reaches every service's
// debug port (9090: metrics) and nothing else of volplane's: not the gRPC
// ports, not etcd; a pod of another namespace reaches none of them.
func TestMetricsReachableFromMonitoring(t *testing.T) {
	monitoring := map[string]string{"kubernetes.io/metadata.name": "monitoring"}
	other := map[string]string{"kubernetes.io/metadata.name": "team"}
	for _, dir := range kustomizations {
		t.Run(dir, func(t *testing.T) {
			r := decodeAll(t, dir)
			for _, w := range r.workloads {
				for _, c := range w.template.Spec.Containers {
					for _, p := range c.Ports {
						where := fmt.Sprintf("%s port %d (%s)", w.name, p.ContainerPort, p.Name)
						fromMonitoring := policyAllows(t, r.policies, w.namespace, w.template, monitoring, p.ContainerPort)
						fromOther := policyAllows(t, r.policies, w.namespace, w.template, other, p.ContainerPort)
						switch {
						case p.Name == "debug" || w.name == "volplane-etcd" && p.Name == "metrics":
							if !fromMonitoring {
								t.Errorf("%s: Prometheus in monitoring cannot scrape it", where)
							}
							if fromOther {
								t.Errorf("%s: open to every namespace", where)
							}
							if w.template.Annotations["prometheus.io/scrape"] != "true" || w.template.Annotations["prometheus.io/port"] != strconv.Itoa(int(p.ContainerPort)) {
								t.Errorf("%s: the pods do not say where to scrape: %v", where, w.template.Annotations)
							}
						case w.name == "volplane-gateway":
							if !fromOther {
								t.Errorf("%s: the gateway must be reachable (it authenticates)", where)
							}
						default:
							if fromMonitoring || fromOther {
								t.Errorf("%s: reachable from outside volplane (monitoring %v, other %v)", where, fromMonitoring, fromOther)
							}
						}
					}
				}
			}
		})
	}
}

// Every controller's client has an explicit rate limit in the manifests,
// a fuse sized for a replica's peak (kube.RateLimits), not unlimited.
func TestClientRateLimitsSet(t *testing.T) {
	for _, dir := range kustomizations {
		t.Run(dir, func(t *testing.T) {
			r := decodeAll(t, dir)
			for _, name := range componentsOf(dir) {
				if name == "volplane-gateway" {
					continue // it calls the API server for reviews only
				}
				c := mainContainer(r.workload(t, name))
				qps, ok1 := flagValue(c, "kube-api-qps")
				burst, ok2 := flagValue(c, "kube-api-burst")
				q, _ := strconv.ParseFloat(qps, 64)
				b, _ := strconv.Atoi(burst)
				if !ok1 || !ok2 || q < 50 || b < int(q) {
					t.Errorf("%s: --kube-api-qps=%q --kube-api-burst=%q: want both, QPS at least 50, burst at least the QPS", name, qps, burst)
				}
			}
		})
	}
}
