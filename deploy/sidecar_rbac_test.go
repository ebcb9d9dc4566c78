package deploy

import (
	"slices"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/volplane/volplane/pkg/sidecar"
)

// The rights of sidecar discovery: the shipped provisioner runs with
// --discover-sidecars and may do exactly what it needs for it; the
// ClusterRole a platform team binds to a driver's ServiceAccount grants
// serving drivers and reading volplane's CA, nothing else.
func TestSidecarDiscoveryRBAC(t *testing.T) {
	for _, dir := range kustomizations {
		t.Run(dir, func(t *testing.T) {
			r := decodeAll(t, dir)
			role := r.clusterRoles[sidecar.ClusterRole]
			if role == nil {
				t.Fatalf("no ClusterRole %s", sidecar.ClusterRole)
			}
			want := []rbacv1.PolicyRule{
				{APIGroups: []string{sidecar.Group}, Resources: []string{sidecar.ResourceDrivers}, Verbs: []string{sidecar.VerbServe}},
				{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{sidecar.CAConfigMap}, Verbs: []string{"get"}},
			}
			if !slices.EqualFunc(role.Rules, want, func(a, b rbacv1.PolicyRule) bool {
				return slices.Equal(a.APIGroups, b.APIGroups) && slices.Equal(a.Resources, b.Resources) &&
					slices.Equal(a.ResourceNames, b.ResourceNames) && slices.Equal(a.Verbs, b.Verbs)
			}) {
				t.Errorf("ClusterRole %s rules %+v, want exactly %+v", sidecar.ClusterRole, role.Rules, want)
			}
			prov := r.clusterRoles["volplane-provisioner"]
			if prov == nil {
				t.Fatal("no ClusterRole volplane-provisioner")
			}
			for _, need := range []struct{ group, resource, verb string }{
				{"coordination.k8s.io", "leases", "list"}, {"coordination.k8s.io", "leases", "watch"},
				{"", "pods", "get"}, {"authorization.k8s.io", "subjectaccessreviews", "create"},
			} {
				if !grants(prov.Rules, need.group, need.resource, need.verb) {
					t.Errorf("the provisioner may not %s %s (%s)", need.verb, need.resource, need.group)
				}
			}
			for _, never := range []string{"list", "watch"} {
				if grants(prov.Rules, "", "pods", never) {
					t.Errorf("the provisioner may %s pods: it only gets the pod a registration names", never)
				}
			}
			ca := r.roles["volplane-system/volplane-provisioner-ca"]
			if ca == nil {
				t.Fatal("no Role volplane-system/volplane-provisioner-ca")
			}
			for _, v := range []string{"get", "update"} {
				if allows(ca.Rules, v, "configmaps") {
					t.Errorf("the provisioner may %s every ConfigMap of volplane-system, not only %s", v, sidecar.CAConfigMap)
				}
			}
			if !allows(ca.Rules, "create", "configmaps") {
				t.Error("the provisioner may not create its CA ConfigMap")
			}
			w := r.workload(t, "volplane-provisioner")
			if v, _ := flagValue(mainContainer(w), "discover-sidecars"); v != "true" {
				t.Error("the shipped provisioner does not run with --discover-sidecars")
			}
		})
	}
}

// grants reports whether rules grant verb on group's resource.
func grants(rules []rbacv1.PolicyRule, group, resource, verb string) bool {
	for _, r := range rules {
		if slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb) {
			return true
		}
	}
	return false
}
