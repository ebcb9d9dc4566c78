package main

import (
	"context"
	"fmt"
	"os"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/volplane/volplane/internal/kubectlplugin"
	"github.com/volplane/volplane/test/harness/devenv"
)

// publishGateway creates the Service kubectl-volplane finds the gateway by
// (volplane-system/volplane-gateway, as deploy/kubernetes has it), with no
// selector and the gateway's URL and CA as its annotations, so that
// `kubectl volplane` needs nothing but the kubeconfig.
func publishGateway(ctx context.Context, env *devenv.Env, url, caFile string) error {
	client, err := kubernetes.NewForConfig(env.RESTConfig)
	if err != nil {
		return err
	}
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return err
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "volplane-system"}}
	if _, err := client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace volplane-system: %w", err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "volplane-system", Name: "volplane-gateway",
			Annotations: map[string]string{kubectlplugin.AnnotationGatewayURL: url, kubectlplugin.AnnotationGatewayCA: string(ca)}},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "https", Port: 443}}},
	}
	if _, err := client.CoreV1().Services("volplane-system").Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create Service volplane-system/volplane-gateway: %w", err)
	}
	return nil
}
