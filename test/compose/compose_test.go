// Package compose runs docker-compose.yaml for real: the images `make
// images` builds FROM scratch (etcd, kube-apiserver, the dev CSI driver,
// every service and the gateway) in containers, a static bind, a dynamic
// provisioning and a Delete reclaim through them, each checked through
// the gateway. `make test-compose` runs it (and `make test` does, when a
// Docker daemon answers); without VOLPLANE_COMPOSE=1 it skips.
package compose

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/volplane/volplane/test/harness/e2e"
)

// stack is one docker-compose project of docker-compose.yaml.
type stack struct {
	t       *testing.T
	compose []string // the compose command: docker compose, or docker-compose
	project string
	env     []string
}

func (s *stack) run(args ...string) (string, error) {
	all := append(append(append([]string{}, s.compose[1:]...), "-f", "../../docker-compose.yaml", "-p", s.project), args...)
	cmd := exec.Command(s.compose[0], all...)
	cmd.Env = append(os.Environ(), s.env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

func (s *stack) must(args ...string) string {
	s.t.Helper()
	out, err := s.run(args...)
	if err != nil {
		s.t.Fatalf("%s %s: %v\n%s", strings.Join(s.compose, " "), strings.Join(args, " "), err, out)
	}
	return out
}

// hostPort is where a published container port answers on loopback.
func (s *stack) hostPort(service, port string) string {
	s.t.Helper()
	return strings.TrimSpace(s.must("port", service, port))
}

// composeCommand is `docker compose` when the plugin is there, else
// Debian's docker-compose.
func composeCommand() ([]string, error) {
	if exec.Command("docker", "compose", "version").Run() == nil {
		return []string{"docker", "compose"}, nil
	}
	if p, err := exec.LookPath("docker-compose"); err == nil {
		return []string{p}, nil
	}
	return nil, fmt.Errorf("neither `docker compose` nor docker-compose is installed (make docker-daemon installs both)")
}

func TestComposeStack(t *testing.T) {
	if os.Getenv("VOLPLANE_COMPOSE") != "1" {
		t.Skip("make test-compose runs this (it needs a Docker daemon and the images of make images)")
	}
	bin := os.Getenv("VOLPLANE_BIN")
	if bin == "" {
		t.Fatal("VOLPLANE_BIN (the directory of make build) is not set")
	}
	compose, err := composeCommand()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if out, err := exec.Command(filepath.Join(bin, "volplane-dev"), "--write-compose", dir).CombinedOutput(); err != nil {
		t.Fatalf("volplane-dev --write-compose: %v\n%s", err, out)
	}
	s := &stack{t: t, compose: compose, project: fmt.Sprintf("volplane-test-%d", os.Getpid()),
		env: []string{"VOLPLANE_COMPOSE_DIR=" + dir, "VOLPLANE_APISERVER_PORT=0", "VOLPLANE_GATEWAY_PORT=0"}}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := s.run("logs", "--no-color", "--tail=40")
			t.Logf("containers' logs:\n%s", out)
		}
		if out, err := s.run("down", "-v", "--remove-orphans", "-t", "5"); err != nil {
			t.Logf("compose down: %v\n%s", err, out)
		}
	})
	s.must("up", "-d")

	ca, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	tokenBytes, err := os.ReadFile(filepath.Join(dir, "token"))
	if err != nil {
		t.Fatal(err)
	}
	token := strings.TrimSpace(string(tokenBytes))
	cfg := &rest.Config{Host: "https://" + s.hostPort("kube-apiserver", "6443"), BearerToken: token,
		TLSClientConfig: rest.TLSClientConfig{CAData: ca}, Timeout: 10 * time.Second}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	gw := &gateway{t: t, url: "https://" + s.hostPort("gateway", "8443"), token: token, client: tlsClient(t, ca)}

	e2e.Eventually(t, 3*time.Minute, func() string {
		body, err := c.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(context.Background())
		if err != nil {
			return "kube-apiserver not ready: " + err.Error()
		}
		if string(body) != "ok" {
			return "kube-apiserver: " + string(body)
		}
		return ""
	})
	// Without a token the gateway refuses; with the admin's it answers,
	// and the provisioner serves the dev driver.
	if code, body := gw.get("/v1/drivers", false); code != http.StatusUnauthorized {
		t.Fatalf("GET /v1/drivers without a token: %d %s, want 401", code, body)
	}
	e2e.Eventually(t, 3*time.Minute, func() string {
		code, body := gw.get("/v1/drivers", true)
		if code != http.StatusOK || !strings.Contains(body, `"driverName":"hostpath.csi.volplane.io"`) || !strings.Contains(body, `"ready":true`) {
			return fmt.Sprintf("gateway /v1/drivers: %d %s", code, body)
		}
		return ""
	})

	// A client certificate of the users' CA is a user (the admin); a
	// service's certificate is not.
	for _, tc := range []struct {
		cert string
		code int
	}{{"users/volplane-admin", http.StatusOK}, {"binder", http.StatusUnauthorized}} {
		pair, err := tls.LoadX509KeyPair(filepath.Join(dir, tc.cert+".crt"), filepath.Join(dir, tc.cert+".key"))
		if err != nil {
			t.Fatal(err)
		}
		withCert := &gateway{t: t, url: gw.url, client: tlsClient(t, ca)}
		withCert.client.Transport.(*http.Transport).TLSClientConfig.Certificates = []tls.Certificate{pair}
		if code, body := withCert.get("/v1/drivers", false); code != tc.code {
			t.Errorf("GET /v1/drivers with the certificate %s: %d %s, want %d", tc.cert, code, body, tc.code)
		}
	}

	ctx := context.Background()
	immediate := storagev1.VolumeBindingImmediate
	deletePolicy := corev1.PersistentVolumeReclaimDelete
	for _, sc := range []*storagev1.StorageClass{
		{ObjectMeta: metav1.ObjectMeta{Name: "compose-static"}, Provisioner: "kubernetes.io/no-provisioner", VolumeBindingMode: &immediate},
		{ObjectMeta: metav1.ObjectMeta{Name: "compose-dynamic"}, Provisioner: "hostpath.csi.volplane.io", VolumeBindingMode: &immediate, ReclaimPolicy: &deletePolicy},
	} {
		if _, err := c.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// A static bind: a free volume and a claim that fits it.
	pv := e2e.Volume("compose-pv", "1Gi", "compose-static")
	if _, err := c.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, pvc := range []*corev1.PersistentVolumeClaim{
		e2e.Claim("default", "static", "1Gi", "compose-static"),
		e2e.Claim("default", "dynamic", "1Gi", "compose-dynamic"),
	} {
		if _, err := c.CoreV1().PersistentVolumeClaims("default").Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if got := e2e.ClaimPhase(t, c, "default", "static", corev1.ClaimBound, 2*time.Minute); got.Spec.VolumeName != "compose-pv" {
		t.Fatalf("claim static bound to %q, want compose-pv", got.Spec.VolumeName)
	}
	dynamic := e2e.ClaimPhase(t, c, "default", "dynamic", corev1.ClaimBound, 2*time.Minute)
	provisioned, err := c.CoreV1().PersistentVolumes().Get(ctx, dynamic.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if provisioned.Spec.CSI == nil || provisioned.Spec.CSI.Driver != "hostpath.csi.volplane.io" {
		t.Fatalf("claim dynamic bound to %s, which is not a volume of the dev CSI driver: %+v", provisioned.Name, provisioned.Spec.PersistentVolumeSource)
	}

	// Both through the gateway, as a platform tool sees them.
	for claim, volume := range map[string]string{"static": "compose-pv", "dynamic": provisioned.Name} {
		code, body := gw.get("/v1/namespaces/default/claims/"+claim, true)
		var got struct {
			Claim struct{ Phase, VolumeName string }
		}
		if code != http.StatusOK || json.Unmarshal([]byte(body), &got) != nil || got.Claim.Phase != "Bound" || got.Claim.VolumeName != volume {
			t.Fatalf("gateway claims/%s: %d %s, want Bound to %s", claim, code, body, volume)
		}
	}

	// The reclaim: the dynamic claim's deletion deletes its volume
	// (policy Delete) and the backing volume (DeleteVolume).
	if err := c.CoreV1().PersistentVolumeClaims("default").Delete(ctx, "dynamic", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e2e.Eventually(t, 2*time.Minute, func() string {
		_, err := c.CoreV1().PersistentVolumes().Get(ctx, provisioned.Name, metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			return fmt.Sprintf("PV %s still there (%v)", provisioned.Name, err)
		}
		return ""
	})
	e2e.Eventually(t, time.Minute, func() string {
		code, body := gw.get("/v1/orphans", true)
		if code != http.StatusOK || strings.Contains(body, provisioned.Spec.CSI.VolumeHandle) {
			return fmt.Sprintf("gateway /v1/orphans: %d %s (the deleted volume's backing volume must be gone, not orphaned)", code, body)
		}
		return ""
	})
}

type gateway struct {
	t      *testing.T
	url    string
	token  string
	client *http.Client
}

func (g *gateway) get(path string, authenticated bool) (int, string) {
	g.t.Helper()
	req, err := http.NewRequest(http.MethodGet, g.url+path, nil)
	if err != nil {
		g.t.Fatal(err)
	}
	if authenticated {
		req.Header.Set("Authorization", "Bearer "+g.token)
	}
	resp, err := g.client.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func tlsClient(t *testing.T, caPEM []byte) *http.Client {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("ca.crt holds no certificate")
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
}
