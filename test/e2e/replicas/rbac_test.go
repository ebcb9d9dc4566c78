package replicas

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	startup "github.com/volplane/volplane/pkg/replica"
	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
	"github.com/volplane/volplane/services/binder"
	"github.com/volplane/volplane/services/watcher"
	"github.com/volplane/volplane/test/harness/devenv"
)

// applyRBAC creates the objects of deploy/kubernetes/rbac.yaml.
func applyRBAC(t *testing.T) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "deploy", "kubernetes", "rbac.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, part := range strings.Split(string(b), "\n---\n") {
		doc, err := yaml.ToJSON([]byte(part))
		if err != nil {
			t.Fatal(err)
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		switch o := obj.(type) {
		case *corev1.Namespace:
			_, err = client.CoreV1().Namespaces().Create(ctx, o, metav1.CreateOptions{})
		case *corev1.ServiceAccount:
			_, err = client.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRole:
			_, err = client.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRoleBinding:
			_, err = client.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.Role:
			_, err = client.RbacV1().Roles(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.RoleBinding:
			_, err = client.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		default:
			t.Fatalf("unexpected %T in rbac.yaml", obj)
		}
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
}

// asComponent is an admin client config that impersonates the
// ServiceAccount deploy/kubernetes/rbac.yaml gives component ("watcher",
// "binder", "provisioner", "reclaimer", "gateway"): a service run with it
// has exactly the rights its Deployment has.
func asComponent(component string) *rest.Config {
	sa := rest.CopyConfig(env.RESTConfig)
	sa.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:volplane-system:volplane-" + component}
	return sa
}

// The watcher and the binder need no more than deploy/kubernetes/rbac.yaml
// grants: run each as its own ServiceAccount (by impersonation) and bind.
func TestServicesRunWithTheDeployedRBAC(t *testing.T) {
	applyRBAC(t)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wAddr, _ := devenv.FreeAddr()
	bAddr, _ := devenv.FreeAddr()
	errc := make(chan error, 2)
	go func() {
		errc <- watcher.Run(ctx, watcher.Options{RESTConfig: asComponent("watcher"), Listen: wAddr, TLS: cl.TLS("watcher"), Logger: logger("watcher-rbac")})
	}()
	go func() {
		errc <- binder.Run(ctx, binder.Options{
			Options:        startup.Options{RESTConfig: asComponent("binder"), EtcdEndpoints: env.EtcdEndpoints, Etcd: env.EtcdSecurity, Listen: bAddr, TLS: cl.TLS("binder"), MemberID: "binder-rbac", Logger: logger("binder-rbac")},
			WatcherAddress: wAddr,
		})
	}()
	if err := cl.WaitServing(ctx, bAddr, time.Minute); err != nil {
		t.Fatal(err)
	}
	ns := newNamespace(t, "rbac")
	createPairs(t, ns, "rbac", 5)
	allBound(t, ns, 5)
	matchWithItsRights(t, bAddr, ns)
	cancel()
	for range 2 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
}

// matchWithItsRights asks the binder, run with its ServiceAccount's rights,
// for a match: its dry-run create of the claim is allowed, and the free
// volume of the namespace's class is what it would bind.
func matchWithItsRights(t *testing.T, addr, ns string) {
	t.Helper()
	if _, err := client.CoreV1().PersistentVolumes().Create(context.Background(), &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-spare"},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              ns,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/tmp/x"}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cc, err := cl.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	claim, err := structpb.NewStruct(map[string]any{
		"metadata": map[string]any{"name": "what-if"},
		"spec": map[string]any{"storageClassName": ns, "accessModes": []any{"ReadWriteOnce"},
			"resources": map[string]any{"requests": map[string]any{"storage": "1Gi"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, func() string {
		resp, err := binderv1.NewBinderServiceClient(cc).MatchClaim(context.Background(), &binderv1.MatchClaimRequest{Namespace: ns, Claim: claim})
		if err != nil {
			return err.Error()
		}
		if resp.GetWouldBind() != ns+"-spare" {
			return fmt.Sprintf("match: %v would bind %q: %s", resp.GetDecision(), resp.GetWouldBind(), resp.GetMessage())
		}
		return ""
	})
}
