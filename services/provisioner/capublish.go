package provisioner

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/volplane/volplane/pkg/sidecar"
)

// DefaultNamespace is the provisioner's namespace when neither
// --namespace nor $POD_NAMESPACE names one.
const DefaultNamespace = "volplane-system"

// caPublisher keeps the ConfigMap sidecar.CAConfigMap in the provisioner's
// namespace holding the provisioner's CA bundle (its --tls-ca-file): the
// sidecars verify the provisioner's client certificate with it. It
// publishes at start and whenever the file changes, and again when the
// ConfigMap is changed or deleted by someone else (checked every period).
type caPublisher struct {
	log       *slog.Logger
	client    kubernetes.Interface
	namespace string
	file      string
	period    time.Duration
}

// run publishes until ctx ends; a failure is logged once until the next
// success and retried every period.
func (c *caPublisher) run(ctx context.Context) {
	t := time.NewTicker(c.period)
	defer t.Stop()
	var failing string
	for {
		err := c.publish(ctx)
		switch {
		case err != nil && err.Error() != failing:
			failing = err.Error()
			c.log.Warn("cannot publish the provisioner's CA for the sidecars", "configmap", c.namespace+"/"+sidecar.CAConfigMap, "error", err)
		case err == nil && failing != "":
			failing = ""
			c.log.Info("published the provisioner's CA for the sidecars", "configmap", c.namespace+"/"+sidecar.CAConfigMap)
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

// publish makes the ConfigMap hold the CA file's bytes, writing only when
// it does not already.
func (c *caPublisher) publish(ctx context.Context) error {
	ca, err := os.ReadFile(c.file)
	if err != nil {
		return fmt.Errorf("read the CA bundle: %w", err)
	}
	if !bytes.Contains(ca, []byte("-----BEGIN CERTIFICATE-----")) {
		return fmt.Errorf("%s holds no PEM certificate", c.file)
	}
	cms := c.client.CoreV1().ConfigMaps(c.namespace)
	cm, err := cms.Get(ctx, sidecar.CAConfigMap, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		cm = &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: sidecar.CAConfigMap, Namespace: c.namespace,
				Labels: map[string]string{"app.kubernetes.io/part-of": "volplane", "app.kubernetes.io/component": "provisioner"}},
			Data: map[string]string{sidecar.CAConfigMapKey: string(ca)},
		}
		_, err = cms.Create(ctx, cm, metav1.CreateOptions{})
		return err
	case err != nil:
		return err
	case cm.Data[sidecar.CAConfigMapKey] == string(ca):
		return nil
	}
	cm = cm.DeepCopy()
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	cm.Data[sidecar.CAConfigMapKey] = string(ca)
	_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
	return err
}
