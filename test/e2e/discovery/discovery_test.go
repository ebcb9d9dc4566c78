package discovery

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/callers"
	"github.com/volplane/volplane/pkg/sidecar"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	"github.com/volplane/volplane/test/harness/e2e"
)

// setup makes what every test shares: volplane's namespace (the CA
// ConfigMap goes there), and the ClusterRole volplane-csi-sidecar as
// deploy/kubernetes/rbac.yaml ships it.
func setup(ctx context.Context, c kubernetes.Interface) error {
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "volplane-system"}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	role, err := shippedRole(sidecar.ClusterRole)
	if err != nil {
		return err
	}
	_, err = c.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{})
	return err
}

// shippedRole is the ClusterRole name of deploy/kubernetes/rbac.yaml.
func shippedRole(name string) (*rbacv1.ClusterRole, error) {
	b, err := os.ReadFile("../../../deploy/kubernetes/rbac.yaml")
	if err != nil {
		return nil, err
	}
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var r rbacv1.ClusterRole
		if err := yaml.Unmarshal([]byte(doc), &r); err != nil {
			return nil, err
		}
		if r.Kind == "ClusterRole" && r.Name == name {
			return &r, nil
		}
	}
	return nil, fmt.Errorf("rbac.yaml has no ClusterRole %s", name)
}

// sidecarStandIn serves the dev CSI driver named driver as
// volplane-csi-sidecar would: TLS 1.3 on 127.0.0.1 with a self-signed
// ECDSA certificate, accepting only a client certificate that chains to
// volplane's CA and names volplane's provisioner. It returns the port
// and the certificate's SHA-256.
func sidecarStandIn(t *testing.T, driver string) (int, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(now.UnixNano()), Subject: pkix.Name{CommonName: "volplane-csi-sidecar"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	pem, err := os.ReadFile(cluster.caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool,
		VerifyPeerCertificate: func(_ [][]byte, chains [][]*x509.Certificate) error {
			if len(chains) == 0 || chains[0][0].Subject.CommonName != callers.Provisioner {
				return errors.New("only volplane's provisioner may call")
			}
			return nil
		}}
	drv, err := devcsi.New(devcsi.Options{Name: driver, RootDir: t.TempDir(), NodeID: "node-a", Logger: cluster.e2e.Logger("sidecar", -4)})
	if err != nil {
		t.Fatal(err)
	}
	if err := devcsi.RegisterNode(t.Context(), cluster.client, driver, "node-a"); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(cfg)))
	drv.Register(srv)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().(*net.TCPAddr).Port, sidecar.CertSHA256(der)
}

// sidecarPod creates the sidecar's pod under ServiceAccount sa (bound to
// volplane-csi-sidecar when bind) and sets its status as a kubelet would:
// Ready, IP 127.0.0.1.
func sidecarPod(t *testing.T, ns, name, sa string, bind bool) {
	t.Helper()
	sidecarPodWith(t, ns, name, sa, bind, nil)
}

// sidecarPodWith is sidecarPod with the pod's spec changed by spec first
// (when not nil).
func sidecarPodWith(t *testing.T, ns, name, sa string, bind bool, spec func(*corev1.PodSpec)) {
	t.Helper()
	ctx, c := t.Context(), cluster.client
	if _, err := c.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if bind {
		if _, err := c.RbacV1().ClusterRoleBindings().Get(ctx, ns+"-"+sa, metav1.GetOptions{}); err == nil {
			bind = false // a second pod of the ServiceAccount
		}
	}
	if bind {
		b := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: ns + "-" + sa},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: sidecar.ClusterRole},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: ns}}}
		if _, err := c.RbacV1().ClusterRoleBindings().Create(ctx, b, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	no := false
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{ServiceAccountName: sa, AutomountServiceAccountToken: &no, NodeName: "node-a",
			Containers: []corev1.Container{{Name: "csi-provisioner", Image: "volplane-csi-sidecar"}}}}
	if spec != nil {
		spec(&pod.Spec)
	}
	pod, err := c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status.Phase = corev1.PodRunning
	pod.Status.PodIP = "127.0.0.1"
	pod.Status.PodIPs = []corev1.PodIP{{IP: "127.0.0.1"}}
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
	if _, err := c.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// register keeps the registration of pod fresh, as the sidecar does,
// until the returned function stops it and deletes the Lease.
func register(t *testing.T, ns, pod, driver string, port int, hash string) (unregister func()) {
	t.Helper()
	return registerWith(t, ns, pod, driver, port, hash, sidecar.Settings{})
}

// registerWith is register with the sidecar's provisioning settings.
func registerWith(t *testing.T, ns, pod, driver string, port int, hash string, settings sidecar.Settings) (unregister func()) {
	t.Helper()
	r := sidecar.Registration{Namespace: ns, Pod: pod, Driver: driver, Port: port, CertSHA256: hash, Duration: 10 * time.Second, Settings: settings}
	leases := cluster.client.CoordinationV1().Leases(ns)
	if _, err := leases.Create(t.Context(), r.Lease(time.Now()), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(2 * time.Second):
			}
			l, err := leases.Get(ctx, sidecar.RegistrationName(pod), metav1.GetOptions{})
			if err != nil {
				continue
			}
			renewed := r.Lease(time.Now())
			renewed.ResourceVersion = l.ResourceVersion
			_, _ = leases.Update(ctx, renewed, metav1.UpdateOptions{})
		}
	}()
	stop := func() {
		cancel()
		<-done
		_ = leases.Delete(context.Background(), sidecar.RegistrationName(pod), metav1.DeleteOptions{})
	}
	t.Cleanup(stop)
	return stop
}

// driverInfo is what ListDrivers says of driver, nil when it is not
// listed.
func driverInfo(t *testing.T, driver string) *provisionerv1.Driver {
	t.Helper()
	return driverInfoOf(t, cluster.prov, driver)
}

func driverInfoOf(t *testing.T, prov provisionerv1.ProvisionerServiceClient, driver string) *provisionerv1.Driver {
	t.Helper()
	resp, err := prov.ListDrivers(t.Context(), &provisionerv1.ListDriversRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range resp.GetDrivers() {
		if d.GetDriverName() == driver {
			return d
		}
	}
	return nil
}

func claimAndClass(t *testing.T, ns, name, driver string) *corev1.PersistentVolumeClaim {
	t.Helper()
	wait := storagev1.VolumeBindingImmediate
	del := corev1.PersistentVolumeReclaimDelete
	cls := ns + "-" + name
	e2e.CreateClass(t, cluster.client, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: cls}, Provisioner: driver,
		VolumeBindingMode: &wait, ReclaimPolicy: &del})
	claim, err := cluster.client.CoreV1().PersistentVolumeClaims(ns).Create(t.Context(), e2e.Claim(ns, name, "1Mi", cls), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return claim
}

func provision(t *testing.T, claim *corev1.PersistentVolumeClaim) *provisionerv1.ProvisionResponse {
	t.Helper()
	resp, err := cluster.prov.Provision(t.Context(), &provisionerv1.ProvisionRequest{ClaimNamespace: claim.Namespace, ClaimName: claim.Name, ClaimUid: string(claim.UID)})
	if err != nil {
		t.Fatalf("Provision %s/%s: %v", claim.Namespace, claim.Name, err)
	}
	return resp
}

// TestSidecarDiscoveredProvisionsAndGoes: a registered, Ready,
// authorized sidecar is discovered; a claim of its driver's class gets a
// volume made through it and its PV; once its registration is gone, the
// driver stays listed, not ready, and a new claim waits with a message
// and an Event naming the driver.
func TestSidecarDiscoveredProvisionsAndGoes(t *testing.T) {
	const driver = "vendor.csi.example.com"
	ns := e2e.Namespace(t, cluster.client)
	port, hash := sidecarStandIn(t, driver)
	sidecarPod(t, ns, "ctrl-0", "vendor-csi", true)
	unregister := register(t, ns, "ctrl-0", driver, port, hash)
	e2e.Eventually(t, 30*time.Second, func() string {
		if d := driverInfo(t, driver); d == nil || !d.GetReady() {
			return fmt.Sprintf("driver %v, want ready", d)
		}
		return ""
	})
	cm, err := cluster.client.CoreV1().ConfigMaps("volplane-system").Get(t.Context(), sidecar.CAConfigMap, metav1.GetOptions{})
	ca, _ := os.ReadFile(cluster.caFile)
	if err != nil || cm.Data[sidecar.CAConfigMapKey] != string(ca) {
		t.Errorf("the CA ConfigMap: %v, %v; want the provisioner's CA bundle", cm, err)
	}

	claim := claimAndClass(t, ns, "data", driver)
	resp := provision(t, claim)
	if resp.GetOutcome() != provisionerv1.Outcome_OUTCOME_FINISHED {
		t.Fatalf("Provision through the sidecar: %v", resp)
	}
	pv, err := cluster.client.CoreV1().PersistentVolumes().Get(t.Context(), resp.GetVolumeName(), metav1.GetOptions{})
	if err != nil || pv.Spec.CSI == nil || pv.Spec.CSI.Driver != driver || pv.Spec.CSI.VolumeHandle == "" {
		t.Fatalf("the PV of the claim: %v, %v", pv, err)
	}

	unregister()
	want := "no volplane-csi-sidecar of driver " + driver + " is registered; last seen "
	e2e.Eventually(t, 30*time.Second, func() string {
		d := driverInfo(t, driver)
		if d == nil || d.GetReady() || !strings.HasPrefix(d.GetMessage(), want) || !strings.HasSuffix(d.GetMessage(), "in pod "+ns+"/ctrl-0") ||
			d.GetProvisionerName() != driver {
			return fmt.Sprintf("driver %v, want listed not ready: %q...", d, want)
		}
		return ""
	})
	later := claimAndClass(t, ns, "later", driver)
	if resp := provision(t, later); resp.GetOutcome() != provisionerv1.Outcome_OUTCOME_IN_BACKGROUND || !strings.Contains(resp.GetMessage(), want) {
		t.Errorf("Provision with the sidecar gone: %v, want IN_BACKGROUND naming the driver", resp)
	}
	e2e.HasEvent(t, cluster.client, ns, "PersistentVolumeClaim", "later", "ProvisioningFailed", want, "", 10*time.Second)

	// A provisioner started now, which never saw the sidecar, lists the
	// driver too: its name is in etcd.
	restarted := startProvisioner(t)
	e2e.Eventually(t, 30*time.Second, func() string {
		d := driverInfoOf(t, restarted, driver)
		if d == nil || d.GetReady() || !strings.HasPrefix(d.GetMessage(), want) || !strings.HasSuffix(d.GetMessage(), "in pod "+ns+"/ctrl-0") {
			return fmt.Sprintf("a restarted provisioner lists %v, want the driver not ready: %q...", d, want)
		}
		return ""
	})

	// The sidecar back, the waiting claim is provisioned.
	register(t, ns, "ctrl-0", driver, port, hash)
	e2e.Eventually(t, 30*time.Second, func() string {
		if d := driverInfo(t, driver); !d.GetReady() {
			return fmt.Sprintf("driver %v, want ready again", d)
		}
		return ""
	})
	if resp := provision(t, later); resp.GetOutcome() != provisionerv1.Outcome_OUTCOME_FINISHED {
		t.Errorf("Provision with the sidecar back: %v", resp)
	}
}

// TestSidecarOfAnUnboundServiceAccountIsNeverUsed: a Ready pod with a
// valid registration and the right certificate, whose ServiceAccount is
// not bound to volplane-csi-sidecar, never makes its driver ready.
func TestSidecarOfAnUnboundServiceAccountIsNeverUsed(t *testing.T) {
	const driver = "rogue.csi.example.com"
	ns := e2e.Namespace(t, cluster.client)
	port, hash := sidecarStandIn(t, driver)
	sidecarPod(t, ns, "rogue-0", "rogue", false)
	register(t, ns, "rogue-0", driver, port, hash)
	e2e.Consistently(t, 8*time.Second, func() string {
		if d := driverInfo(t, driver); d.GetReady() {
			return fmt.Sprintf("the driver of an unbound ServiceAccount is ready: %v", d)
		}
		return ""
	})
	logs, err := os.ReadFile(cluster.e2e.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	why := "ServiceAccount " + ns + "/rogue may not serve CSI driver " + driver
	if n := strings.Count(string(logs), why); n != 1 {
		t.Errorf("the refusal is logged %d times, want once: %q", n, why)
	}
}

// TestSidecarInTheNodeNetworkServesOnlyADeclaredPort: a pod in the node's
// network (hostNetwork) shares the node's ports with every process there,
// so its registration could send the provisioner's CSI calls to another
// process's port. A forged registration of such a pod, Ready, of a bound
// ServiceAccount, naming a port none of its containers declares (though a
// sidecar with the pinned certificate listens there), never makes its
// driver ready and is logged once; the same sidecar registered by a pod
// that declares the port (its hostPort) is used.
func TestSidecarInTheNodeNetworkServesOnlyADeclaredPort(t *testing.T) {
	const driver = "hostnet.csi.example.com"
	ns := e2e.Namespace(t, cluster.client)
	port, hash := sidecarStandIn(t, driver)
	inNodeNetwork := func(declared int) func(*corev1.PodSpec) {
		return func(s *corev1.PodSpec) {
			s.HostNetwork = true
			s.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: int32(declared), Protocol: corev1.ProtocolTCP}}
		}
	}
	sidecarPodWith(t, ns, "forged-0", "hostnet", true, inNodeNetwork(port+1))
	unregister := register(t, ns, "forged-0", driver, port, hash)
	e2e.Consistently(t, 8*time.Second, func() string {
		if d := driverInfo(t, driver); d.GetReady() {
			return fmt.Sprintf("a registration naming an undeclared port of the node's network made the driver ready: %v", d)
		}
		return ""
	})
	logs, err := os.ReadFile(cluster.e2e.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	why := fmt.Sprintf("none of its containers declares the registered port %d", port)
	if n := strings.Count(string(logs), why); n != 1 {
		t.Errorf("the refusal is logged %d times, want once: %q", n, why)
	}
	unregister()

	sidecarPodWith(t, ns, "declared-0", "hostnet", true, inNodeNetwork(port))
	register(t, ns, "declared-0", driver, port, hash)
	e2e.Eventually(t, time.Minute, func() string {
		if d := driverInfo(t, driver); !d.GetReady() {
			return fmt.Sprintf("the driver of a pod declaring its port is not ready: %v", d)
		}
		return ""
	})
}
