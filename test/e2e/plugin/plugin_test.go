package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/internal/kubectlplugin"
	"github.com/volplane/volplane/test/harness/e2e"
)

// applyRoles creates what deploy/kubernetes/roles.yaml holds (the
// viewer and operator ClusterRoles, the gateway Service's discovery Role
// and RoleBinding), so the shipped file is what grants the plugin's users
// their rights.
func applyRoles(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	if _, err := cluster.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "volplane-system"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join("..", "..", "..", "deploy", "kubernetes", "roles.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); errors.Is(err, io.EOF) {
			return
		} else if err != nil {
			t.Fatal(err)
		}
		var meta metav1.TypeMeta
		if len(raw) == 0 || json.Unmarshal(raw, &meta) != nil {
			continue
		}
		rbac := cluster.client.RbacV1()
		switch meta.Kind {
		case "ClusterRole":
			var o rbacv1.ClusterRole
			decode(t, raw, &o)
			_, err = rbac.ClusterRoles().Create(ctx, &o, metav1.CreateOptions{})
		case "Role":
			var o rbacv1.Role
			decode(t, raw, &o)
			_, err = rbac.Roles(o.Namespace).Create(ctx, &o, metav1.CreateOptions{})
		case "RoleBinding":
			var o rbacv1.RoleBinding
			decode(t, raw, &o)
			_, err = rbac.RoleBindings(o.Namespace).Create(ctx, &o, metav1.CreateOptions{})
		default:
			t.Fatalf("roles.yaml holds a %s", meta.Kind)
		}
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
}

func decode(t *testing.T, raw []byte, into any) {
	t.Helper()
	if err := json.Unmarshal(raw, into); err != nil {
		t.Fatal(err)
	}
}

// serviceAccountToken creates a ServiceAccount and mints a token for it
// with the TokenRequest API.
func serviceAccountToken(t *testing.T, namespace, name string) string {
	t.Helper()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := cluster.client.CoreV1().ServiceAccounts(namespace).Create(t.Context(), sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := cluster.client.CoreV1().ServiceAccounts(namespace).CreateToken(t.Context(), name, &authnv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

func bindViewer(t *testing.T, name string, subject rbacv1.Subject) {
	t.Helper()
	bindRole(t, "volplane-viewer", name, subject)
}

// bindRole binds one of roles.yaml's ClusterRoles until the test ends.
func bindRole(t *testing.T, role, name string, subject rbacv1.Subject) {
	t.Helper()
	crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects: []rbacv1.Subject{subject}}
	if _, err := cluster.client.RbacV1().ClusterRoleBindings().Create(t.Context(), crb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.client.RbacV1().ClusterRoleBindings().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// users is a kubeconfig of the test cluster whose current context
// "viewer" is in namespace, with the users:
//   - viewer: a ServiceAccount token, bound to volplane-viewer;
//   - cert: a client certificate (CN plugin-cert-user) of the gateway's
//     client CA, bound to volplane-viewer;
//   - nobody: a ServiceAccount token bound to nothing;
//   - none: no credential at all;
//   - operator: a ServiceAccount token, bound to volplane-operator (and
//     its context "operator", in namespace).
func users(t *testing.T, namespace string) string {
	t.Helper()
	applyRoles(t)
	viewer := serviceAccountToken(t, namespace, "plugin-viewer")
	nobody := serviceAccountToken(t, namespace, "plugin-nobody")
	operator := serviceAccountToken(t, namespace, "plugin-operator")
	bindViewer(t, "plugin-viewer-"+namespace, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: namespace, Name: "plugin-viewer"})
	bindRole(t, "volplane-operator", "plugin-operator-"+namespace, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: namespace, Name: "plugin-operator"})
	cert, err := cluster.e2e.UserCA.IssueUser("plugin-cert-user")
	if err != nil {
		t.Fatal(err)
	}
	bindViewer(t, "plugin-cert-user-"+namespace, rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "plugin-cert-user"})

	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: cluster.env.APIServerURL, CertificateAuthorityData: cluster.env.RESTConfig.CAData}
	cfg.AuthInfos["viewer"] = &clientcmdapi.AuthInfo{Token: viewer}
	cfg.AuthInfos["nobody"] = &clientcmdapi.AuthInfo{Token: nobody}
	cfg.AuthInfos["cert"] = &clientcmdapi.AuthInfo{ClientCertificate: cert.CertFile, ClientKey: cert.KeyFile}
	cfg.AuthInfos["none"] = &clientcmdapi.AuthInfo{}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: cluster.env.RESTConfig.BearerToken}
	cfg.AuthInfos["operator"] = &clientcmdapi.AuthInfo{Token: operator}
	cfg.Contexts["operator"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "operator", Namespace: namespace}
	cfg.Contexts["viewer"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "viewer", Namespace: namespace}
	cfg.Contexts["admin"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "admin"}
	cfg.CurrentContext = "viewer"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// plugin runs kubectl-volplane in this process with the kubeconfig and
// returns what it wrote.
func plugin(t *testing.T, kubeconfig string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	return pluginAt(t, kubeconfig, false, "", args...)
}

// pluginAt runs kubectl-volplane with in as its standard input, a
// terminal a person answers at or not.
func pluginAt(t *testing.T, kubeconfig string, terminal bool, in string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err = kubectlplugin.Run(t.Context(), append([]string{"--kubeconfig", kubeconfig}, args...),
		kubectlplugin.Streams{In: strings.NewReader(in), Out: &out, ErrOut: &errOut, Terminal: terminal})
	return out.String(), errOut.String(), err
}

// gatewayFlags point the plugin at the test gateway and its CA.
func gatewayFlags() []string {
	return []string{"--gateway", cluster.gatewayURL, "--certificate-authority", cluster.gatewayCA}
}

// table runs a command that prints a table and returns its rows as
// fields, header first.
func table(t *testing.T, kubeconfig string, args ...string) [][]string {
	t.Helper()
	out, errOut, err := plugin(t, kubeconfig, append(gatewayFlags(), args...)...)
	if err != nil {
		t.Fatalf("kubectl volplane %v: %v\n%s", args, err, errOut)
	}
	var rows [][]string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		rows = append(rows, splitColumns(l))
	}
	return rows
}

// splitColumns splits a table line at runs of 3 or more spaces (cells may
// hold single spaces, e.g. a header "ACCESS MODES").
func splitColumns(l string) []string {
	var out []string
	for _, c := range strings.Split(l, "   ") {
		if c = strings.TrimSpace(c); c != "" {
			out = append(out, c)
		}
	}
	return out
}

// row finds the row whose first cell (or cell i) is v.
func row(rows [][]string, i int, v string) []string {
	for _, r := range rows[1:] {
		if len(r) > i && r[i] == v {
			return r
		}
	}
	return nil
}

// jsonOut runs a command with -o json (or yaml) and decodes it.
func jsonOut(t *testing.T, kubeconfig, format string, args ...string) map[string]any {
	t.Helper()
	out, errOut, err := plugin(t, kubeconfig, append(append(gatewayFlags(), "-o", format), args...)...)
	if err != nil {
		t.Fatalf("kubectl volplane %v -o %s: %v\n%s", args, format, err, errOut)
	}
	b := []byte(out)
	if format == "yaml" {
		if b, err = yaml.YAMLToJSON(b); err != nil {
			t.Fatalf("-o yaml is not YAML: %v\n%s", err, out)
		}
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("-o %s is not a JSON object: %v\n%s", format, err, out)
	}
	return m
}

func items(m map[string]any, field string) []map[string]any {
	var out []map[string]any
	for _, it := range m[field].([]any) {
		out = append(out, it.(map[string]any))
	}
	return out
}

// Every list command of the plugin, as a table and as JSON or YAML, with a
// real ServiceAccount token from a kubeconfig: a dynamically provisioned
// claim, a released static volume and its reclaim, a provisioning stuck on
// the driver, an orphaned backing volume, the driver.
func TestPluginCommands(t *testing.T) {
	ctx := t.Context()
	ns := e2e.Namespace(t, cluster.client)
	kc := users(t, ns)

	policy := corev1.PersistentVolumeReclaimDelete
	e2e.CreateClass(t, cluster.client, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "plugin-fast"}, Provisioner: devcsi.DefaultName, ReclaimPolicy: &policy})
	mustCreate := func(c *corev1.PersistentVolumeClaim) *corev1.PersistentVolumeClaim {
		t.Helper()
		c, err := cluster.client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, c, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	// A dynamically provisioned claim.
	mustCreate(e2e.Claim(ns, "fast-claim", "1Gi", "plugin-fast"))
	fast := e2e.ClaimPhase(t, cluster.client, ns, "fast-claim", corev1.ClaimBound, time.Minute)
	// A static volume whose claim is deleted: Released, reclaim Retained.
	static := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "plugin-static-" + ns},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("2Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              "plugin-manual",
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/tmp/plugin-static"}},
		},
	}
	if _, err := cluster.client.CoreV1().PersistentVolumes().Create(ctx, static, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.client.CoreV1().PersistentVolumes().Delete(context.Background(), static.Name, metav1.DeleteOptions{})
	})
	mustCreate(e2e.Claim(ns, "static-claim", "1Gi", "plugin-manual"))
	e2e.ClaimPhase(t, cluster.client, ns, "static-claim", corev1.ClaimBound, time.Minute)
	if err := cluster.client.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, "static-claim", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e2e.VolumePhase(t, cluster.client, static.Name, corev1.VolumeReleased, time.Minute)
	// A backing volume nothing knows: an orphan.
	leak, err := cluster.csi.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "plugin-leak-" + ns, CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}}})
	if err != nil {
		t.Fatal(err)
	}
	leakID := leak.GetVolume().GetVolumeId()
	t.Cleanup(func() {
		_, _ = cluster.csi.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: leakID})
	})
	// A provisioning the driver keeps refusing: in flight in the journal.
	cluster.driver.Faults().FailNext("CreateVolume", 1<<20, codes.Unavailable, "backend busy")
	t.Cleanup(func() { cluster.driver.Faults().Clear("CreateVolume") })
	stuck := mustCreate(e2e.Claim(ns, "stuck-claim", "1Gi", "plugin-fast"))

	t.Run("claims", func(t *testing.T) {
		rows := table(t, kc, "claims")
		if want := []string{"NAME", "STATUS", "VOLUME", "CAPACITY", "ACCESS MODES", "STORAGECLASS", "AGE"}; !slices.Equal(rows[0], want) {
			t.Fatalf("header %q, want %q", rows[0], want)
		}
		if r := row(rows, 0, "fast-claim"); r == nil || r[1] != "Bound" || r[2] != fast.Spec.VolumeName || r[3] != "1Gi" || r[4] != "RWO" || r[5] != "plugin-fast" {
			t.Errorf("fast-claim row %q", r)
		}
		if r := row(rows, 0, "stuck-claim"); r == nil || r[1] != "Pending" || r[2] != "<none>" {
			t.Errorf("stuck-claim row %q", r)
		}
		// Every namespace, one claim a page.
		rows = table(t, kc, "claims", "-A", "--page-size", "1", "--phase", "Bound")
		if rows[0][0] != "NAMESPACE" || row(rows, 1, "fast-claim") == nil || row(rows, 1, "stuck-claim") != nil {
			t.Errorf("claims -A --phase Bound:\n%q", rows)
		}
		m := jsonOut(t, kc, "json", "claims", "--class", "plugin-fast")
		var names []string
		for _, c := range items(m, "claims") {
			names = append(names, c["name"].(string))
		}
		if !slices.Equal(names, []string{"fast-claim", "stuck-claim"}) {
			t.Errorf("claims --class plugin-fast -o json: %v", names)
		}
	})
	t.Run("volumes", func(t *testing.T) {
		rows := table(t, kc, "volumes", "--class", "plugin-manual")
		if want := []string{"NAME", "CAPACITY", "ACCESS MODES", "RECLAIM POLICY", "STATUS", "CLAIM", "STORAGECLASS", "AGE"}; !slices.Equal(rows[0], want) {
			t.Fatalf("header %q, want %q", rows[0], want)
		}
		if r := row(rows, 0, static.Name); r == nil || r[1] != "2Gi" || r[3] != "Retain" || r[4] != "Released" || r[5] != ns+"/static-claim" {
			t.Errorf("static volume row %q", r)
		}
		m := jsonOut(t, kc, "yaml", "volumes", "--driver", devcsi.DefaultName, "--claim-namespace", ns)
		if vs := items(m, "volumes"); len(vs) != 1 || vs[0]["name"] != fast.Spec.VolumeName || vs[0]["phase"] != "Bound" {
			t.Errorf("volumes of the dev driver in %s -o yaml: %v", ns, vs)
		}
	})
	t.Run("drivers", func(t *testing.T) {
		rows := table(t, kc, "drivers")
		if r := row(rows, 0, devcsi.DefaultName); r == nil || r[1] != devcsi.DefaultName || r[3] != "true" {
			t.Errorf("drivers:\n%q", rows)
		}
		m := jsonOut(t, kc, "json", "drivers")
		if ds := items(m, "drivers"); len(ds) != 1 || !slices.Contains(ds[0]["capabilities"].([]any), any("LIST_VOLUMES")) {
			t.Errorf("drivers -o json: %v", ds)
		}
	})
	t.Run("operations", func(t *testing.T) {
		var rows [][]string
		e2e.Eventually(t, time.Minute, func() string {
			rows = table(t, kc, "operations", "--claim-namespace", ns)
			if r := row(rows, 1, "pvc-"+string(stuck.UID)); r == nil || !strings.Contains(strings.Join(r, " "), "backend busy") {
				return "no operation of stuck-claim with the driver's error yet: " + strings.Join(slices.Concat(rows...), " ")
			}
			return ""
		})
		if want := []string{"KIND", "VOLUME", "CLAIM", "DRIVER", "ATTEMPTS", "OWNER", "AGE", "LAST ERROR"}; !slices.Equal(rows[0], want) {
			t.Fatalf("header %q, want %q", rows[0], want)
		}
		if r := row(rows, 1, "pvc-"+string(stuck.UID)); r[0] != "provision" || r[2] != ns+"/stuck-claim" || r[3] != devcsi.DefaultName {
			t.Errorf("operation row %q", r)
		}
		m := jsonOut(t, kc, "json", "operations", "--kind", "provision", "--driver", devcsi.DefaultName, "--page-size", "1")
		found := false
		for _, op := range items(m, "operations") {
			found = found || op["claimName"] == "stuck-claim" && op["claimNamespace"] == ns
		}
		if !found {
			t.Errorf("operations -o json: %v", m)
		}
	})
	t.Run("explain a provisioning that fails", func(t *testing.T) {
		var out string
		e2e.Eventually(t, time.Minute, func() string {
			var err error
			out, _, err = plugin(t, kc, append(gatewayFlags(), "explain", "pvc", "stuck-claim")...)
			if err != nil {
				return err.Error()
			}
			if !strings.Contains(out, "Last Error:") {
				return "no last error yet:\n" + out
			}
			return ""
		})
		lines := strings.Split(out, "\n")
		if lines[0] != "Decision:  Provision" || !strings.HasPrefix(lines[1], `Reason:    no volume fits: a volume is to be provisioned with StorageClass "plugin-fast"`) || lines[2] != "" {
			t.Errorf("explain does not open with the decision and its reason:\n%s", out)
		}
		for key, want := range map[string]string{
			"Claim": ns + "/stuck-claim", "Status": "Pending", "Request": "1Gi", "StorageClass": "plugin-fast",
			"  StorageClass": "plugin-fast (provisioner " + devcsi.DefaultName + ", Immediate)",
			"  Driver":       devcsi.DefaultName + " (ready)",
		} {
			if got := field(out, key); got != want {
				t.Errorf("%s: %q, want %q:\n%s", key, got, want, out)
			}
		}
		if op := field(out, "  Operation"); !strings.HasPrefix(op, "pvc-"+string(stuck.UID)+" (") || !strings.Contains(op, " attempt") {
			t.Errorf("Operation: %q:\n%s", op, out)
		}
		if e := field(out, "  Last Error"); !strings.Contains(e, "backend busy") {
			t.Errorf("Last Error: %q:\n%s", e, out)
		}
		if !strings.Contains(out, "\n\nProvisioning:\n") {
			t.Errorf("no Provisioning section:\n%s", out)
		}
		noUnsetFields(t, out)
	})
	t.Run("explain a bound claim", func(t *testing.T) {
		out, _, err := plugin(t, kc, append(gatewayFlags(), "explain", "pvc/fast-claim")...)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(out, "Decision:  Bound\nReason:    by the controller: "+devcsi.DefaultName+" provisioned volume "+fast.Spec.VolumeName) {
			t.Errorf("explain does not open with the decision and its reason:\n%s", out)
		}
		for key, want := range map[string]string{"Volume": fast.Spec.VolumeName + " (Bound)", "Provisioned By": devcsi.DefaultName, "Capacity": "1Gi", "Status": "Bound"} {
			if got := field(out, key); got != want {
				t.Errorf("%s: %q, want %q:\n%s", key, got, want, out)
			}
		}
		if strings.Contains(out, "Candidates") || strings.Contains(out, "Provisioning:") {
			t.Errorf("a bound claim has neither candidates nor provisioning:\n%s", out)
		}
		noUnsetFields(t, out)
	})
	t.Run("match a claim that would be provisioned", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "claim.yaml")
		if err := os.WriteFile(file, []byte("metadata: {name: would-be}\nspec:\n  storageClassName: plugin-fast\n  accessModes: [ReadWriteOnce]\n  resources: {requests: {storage: 2Gi}}\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		out, _, err := plugin(t, kc, append(gatewayFlags(), "match", "-f", file)...)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(out, "Decision:  Provision\nReason:    ") || !strings.Contains(out, "\n\nWould Create Volume:\n") {
			t.Errorf("match layout:\n%s", out)
		}
		if got := field(out, "Claim"); got != ns+"/would-be" {
			t.Errorf("Claim: %q:\n%s", got, out)
		}
		_, create, _ := strings.Cut(out, "\nWould Create Volume:\n")
		for key, want := range map[string]string{"  Driver": devcsi.DefaultName, "  Capacity": "2Gi"} {
			if got := field(create, key); got != want {
				t.Errorf("%s: %q, want %q:\n%s", key, got, want, out)
			}
		}
		if c := field(create, "  Capabilities"); !strings.HasPrefix(c, "SINGLE_NODE_") || !strings.Contains(c, ", filesystem") {
			t.Errorf("Capabilities: %q:\n%s", c, out)
		}
		noUnsetFields(t, out)
	})
	t.Run("reclaims", func(t *testing.T) {
		var rows [][]string
		e2e.Eventually(t, 30*time.Second, func() string {
			rows = table(t, kc, "reclaims", "--claim-namespace", ns)
			if row(rows, 0, static.Name) == nil {
				return "no reclaim of the released volume yet"
			}
			return ""
		})
		if want := []string{"VOLUME", "POLICY", "STATE", "METHOD", "CLAIM", "ATTEMPTS", "AGE", "MESSAGE"}; !slices.Equal(rows[0], want) {
			t.Fatalf("header %q, want %q", rows[0], want)
		}
		if r := row(rows, 0, static.Name); r[1] != "Retain" || r[2] != "RETAINED" || r[4] != ns+"/static-claim" {
			t.Errorf("reclaim row %q", r)
		}
		m := jsonOut(t, kc, "json", "reclaims", "--state", "retained")
		found := false
		for _, r := range items(m, "reclaims") {
			found = found || r["volumeName"] == static.Name && r["state"] == "STATE_RETAINED"
		}
		if !found {
			t.Errorf("reclaims --state retained -o json: %v", m)
		}
		if _, _, err := plugin(t, kc, append(gatewayFlags(), "reclaims", "--state", "lost")...); !kubectlplugin.IsUsage(err) {
			t.Errorf("--state lost: %v, want a usage error", err)
		}
	})
	t.Run("orphans", func(t *testing.T) {
		rows := table(t, kc, "orphans", "--kind", "volume", "--page-size", "1")
		if want := []string{"DRIVER", "KIND", "VOLUME ID", "PERSISTENTVOLUME", "SIZE", "AGE", "UNCERTAIN"}; !slices.Equal(rows[0], want) {
			t.Fatalf("header %q, want %q", rows[0], want)
		}
		if r := row(rows, 2, leakID); r == nil || r[0] != devcsi.DefaultName || r[1] != "Volume" || r[4] != "1Mi" {
			t.Errorf("orphans:\n%q", rows)
		}
		m := jsonOut(t, kc, "json", "orphans")
		found := false
		for _, o := range items(m, "orphans") {
			found = found || o["volumeId"] == leakID
		}
		if ds := items(m, "drivers"); !found || len(ds) != 1 || ds[0]["checked"] != true {
			t.Errorf("orphans -o json: %v", m)
		}
	})
	t.Run("a client certificate", func(t *testing.T) {
		rows := table(t, kc, "drivers", "--user", "cert")
		if row(rows, 0, devcsi.DefaultName) == nil {
			t.Errorf("drivers as the certificate's user:\n%q", rows)
		}
	})
	t.Run("refusals", func(t *testing.T) {
		for name, tc := range map[string]struct {
			args []string
			want []string
		}{
			"no credential":                {[]string{"drivers", "--user", "none"}, []string{"Error from gateway (401 Unauthorized): unauthorized", "has no token, client certificate"}},
			"a user bound to nothing":      {[]string{"claims", "--user", "nobody"}, []string{"Error from gateway (403 Forbidden): ", `system:serviceaccount:` + ns + `:plugin-nobody" cannot list resource "claims"`, "volplane-viewer"}},
			"a filter the gateway refuses": {[]string{"claims", "--phase", "Bogus"}, []string{`Error from gateway (400 Bad Request): phase "Bogus" is not a phase`}},
			"a driver not served":          {[]string{"orphans", "--driver", "nope.example.com"}, []string{`Error from gateway (404 Not Found): driver "nope.example.com" is not served`}},
		} {
			t.Run(name, func(t *testing.T) {
				_, _, err := plugin(t, kc, append(gatewayFlags(), tc.args...)...)
				var ge *kubectlplugin.Error
				if !errors.As(err, &ge) {
					t.Fatalf("error %v, want the gateway's refusal", err)
				}
				for _, w := range tc.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q lacks %q", err, w)
					}
				}
			})
		}
	})
	cluster.driver.Faults().Clear("CreateVolume")
	e2e.ClaimPhase(t, cluster.client, ns, "stuck-claim", corev1.ClaimBound, time.Minute)
}

// explain and match show whatever the gateway answers, as a description
// and as JSON; an unknown claim is 404; nothing is needed but a viewer's
// token.
func TestPluginExplainAndMatch(t *testing.T) {
	ns := e2e.Namespace(t, cluster.client)
	kc := users(t, ns)
	if _, err := cluster.client.CoreV1().PersistentVolumeClaims(ns).Create(t.Context(), e2e.Claim(ns, "lonely", "1Gi", "plugin-nothing"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e2e.ClaimPhase(t, cluster.client, ns, "lonely", corev1.ClaimPending, time.Minute)
	claimFile := filepath.Join(t.TempDir(), "claim.yaml")
	if err := os.WriteFile(claimFile, []byte("apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: would-be}\nspec:\n  storageClassName: plugin-nothing\n  accessModes: [ReadWriteOnce]\n  resources: {requests: {storage: 1Gi}}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Run("explain", func(t *testing.T) {
		out, _, err := plugin(t, kc, append(gatewayFlags(), "explain", "pvc", "lonely")...)
		if err != nil || !strings.Contains(out, "lonely") {
			t.Fatalf("explain: %v\n%s", err, out)
		}
		if m := jsonOut(t, kc, "json", "explain", "pvc/lonely"); len(m) == 0 {
			t.Fatal("explain -o json is empty")
		}
		_, _, err = plugin(t, kc, append(gatewayFlags(), "explain", "pvc", "no-such-claim")...)
		var ge *kubectlplugin.Error
		if !errors.As(err, &ge) || ge.Status != 404 {
			t.Fatalf("explain of an unknown claim: %v, want the gateway's 404", err)
		}
	})
	t.Run("match", func(t *testing.T) {
		out, _, err := plugin(t, kc, append(gatewayFlags(), "match", "-f", claimFile)...)
		if err != nil || strings.TrimSpace(out) == "" {
			t.Fatalf("match: %v\n%s", err, out)
		}
		if m := jsonOut(t, kc, "yaml", "match", "-f", claimFile); len(m) == 0 {
			t.Fatal("match -o yaml is empty")
		}
	})
	t.Run("match refuses what is not a claim", func(t *testing.T) {
		pod := filepath.Join(t.TempDir(), "pod.yaml")
		if err := os.WriteFile(pod, []byte("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, _, err := plugin(t, kc, append(gatewayFlags(), "match", "-f", pod)...); err == nil || !strings.Contains(err.Error(), "holds a Pod, not a PersistentVolumeClaim") {
			t.Fatalf("match of a Pod: %v", err)
		}
	})
}

// gatewayService creates the Service kubectl-volplane finds the gateway
// by, in volplane-system, until the test ends.
func gatewayService(t *testing.T, svc *corev1.Service) *corev1.Service {
	t.Helper()
	svc.Namespace = "volplane-system"
	if len(svc.Spec.Ports) == 0 {
		_, port, _ := strings.Cut(strings.TrimPrefix(cluster.gatewayURL, "https://"), ":")
		p, _ := strconv.Atoi(port)
		svc.Spec.Ports = []corev1.ServicePort{{Name: "https", Port: int32(p)}}
	}
	svc, err := cluster.client.CoreV1().Services("volplane-system").Create(t.Context(), svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.client.CoreV1().Services("volplane-system").Delete(context.Background(), svc.Name, metav1.DeleteOptions{})
	})
	return svc
}

// Without --gateway, the plugin reads the gateway's Service (which every
// authenticated user may, by roles.yaml): its URL and CA annotations, or
// its load balancer's address; a Service that gives no way in says how to
// get one.
func TestPluginFindsTheGatewayByItsService(t *testing.T) {
	ns := e2e.Namespace(t, cluster.client)
	kc := users(t, ns)
	ca, err := os.ReadFile(cluster.gatewayCA)
	if err != nil {
		t.Fatal(err)
	}
	gatewayService(t, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "volplane-gateway",
		Annotations: map[string]string{kubectlplugin.AnnotationGatewayURL: cluster.gatewayURL, kubectlplugin.AnnotationGatewayCA: string(ca)}}})
	lb := gatewayService(t, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "gateway-lb",
		Annotations: map[string]string{kubectlplugin.AnnotationGatewayCA: string(ca)}}, Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer}})
	lb.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "127.0.0.1"}}
	if _, err := cluster.client.CoreV1().Services("volplane-system").UpdateStatus(t.Context(), lb, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	gatewayService(t, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "gateway-bare"}})

	for name, tc := range map[string]struct {
		args []string
		want string // in the error; "" for success
	}{
		"the annotations": {[]string{"drivers"}, ""},
		// The other Services are the admin's to read (only
		// volplane-gateway is everyone's).
		"the load balancer":            {[]string{"drivers", "--context", "admin", "--gateway-service", "volplane-system/gateway-lb"}, ""},
		"a Service without a way in":   {[]string{"drivers", "--context", "admin", "--gateway-service", "volplane-system/gateway-bare"}, "port-forward svc/gateway-bare"},
		"no Service":                   {[]string{"drivers", "--context", "admin", "--gateway-service", "volplane-system/nope"}, "there is no Service volplane-system/nope to find the volplane gateway by: pass --gateway URL"},
		"another Service, as a viewer": {[]string{"drivers", "--gateway-service", "volplane-system/gateway-lb"}, "cannot read Service volplane-system/gateway-lb"},
		// The gateway's client CA is not the API server's here: the API
		// server sees the certificate's user as anonymous.
		"a certificate the API server does not know": {[]string{"drivers", "--user", "cert"}, `User "system:anonymous" cannot get resource "services"`},
		"the wrong CA": {[]string{"drivers", "--certificate-authority", cluster.env.Dir + "/pki/ca.crt"}, "certificate signed by unknown authority"},
	} {
		t.Run(name, func(t *testing.T) {
			out, _, err := plugin(t, kc, tc.args...)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("%v", err)
			case tc.want == "" && !strings.Contains(out, devcsi.DefaultName):
				t.Fatalf("drivers:\n%s", out)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}

// noUnsetFields fails when a description shows a field the answer left
// unset (protojson sends every field: "0", false, "", null, enums'
// UNSPECIFIED), outside the candidates table whose <none> cells are
// kubectl's.
func noUnsetFields(t *testing.T, out string) {
	t.Helper()
	head, _, _ := strings.Cut(out, "Candidates (")
	for _, bad := range []string{"<none>", "Bytes", "UNSPECIFIED", "false", ":  0\n", ": 0\n", "null"} {
		if strings.Contains(head, bad) {
			t.Errorf("the description shows %q, an unset field:\n%s", bad, out)
		}
	}
	for _, l := range strings.Split(strings.TrimRight(head, "\n"), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(v) == "" && !strings.HasPrefix(l, " ") && k != "Provisioning" && k != "Would Create Volume" {
			t.Errorf("an empty line %q:\n%s", l, out)
		}
	}
}

// field is the value of the first "key:  value" line of a description
// (key with its indent: "  Driver" is the Driver of a section).
func field(out, key string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, key+":") {
			return strings.TrimSpace(strings.TrimPrefix(l, key+":"))
		}
	}
	return ""
}
