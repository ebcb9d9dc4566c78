package devenv_test

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/volplane/volplane/test/harness/devenv"
)

func TestStartServesTheKubernetesAPI(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiserver")
	}
	ctx := context.Background()
	env, err := devenv.Start(ctx, devenv.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Stop()
	// Through the kubeconfig file, as kubectl and the services use it.
	cfg, err := clientcmd.BuildConfigFromFlags("", env.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	client := kubernetes.NewForConfigOrDie(cfg)
	if _, err := client.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{}); err != nil {
		t.Fatalf("get namespace default: %v", err)
	}
	info, err := client.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kube-apiserver %s at %s", info.GitVersion, env.APIServerURL)
}
