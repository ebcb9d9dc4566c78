package etcdbackup

import (
	"context"
	"fmt"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

// The Secret an export is kept in (--secret): its newest export under
// SecretLatest, the one before under SecretPrevious, and what the newest
// is in annotations (kubectl describe shows them).
const (
	SecretLatest   = "latest.json.gz"
	SecretPrevious = "previous.json.gz"

	annTaken    = "volplane.io/backup-taken"
	annRevision = "volplane.io/backup-revision"
	annKeys     = "volplane.io/backup-keys"
)

// maxSecretBytes is what the exports may take in the Secret: the API
// server refuses a Secret over 1 MiB, metadata included.
const maxSecretBytes = 1000 << 10

// SecretTarget names the Secret exports go to and how to reach it.
type SecretTarget struct {
	Client    kubernetes.Interface
	Namespace string
	Name      string
}

// saveExport encodes e into the Secret, the newest export before it kept
// as the previous one while both fit. The Secret must exist (the
// manifests create it empty): the backup's Role may update that one
// Secret and create none.
func saveExport(ctx context.Context, s SecretTarget, e *Export) (int, error) {
	b, err := e.Encode()
	if err != nil {
		return 0, err
	}
	if len(b) > maxSecretBytes {
		return 0, fmt.Errorf("the export of %d keys is %d bytes gzipped, more than a Secret holds (%d): back up to a volume instead (--dir, deploy/kubernetes/etcd-backup)", len(e.Keys), len(b), maxSecretBytes)
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		sec, err := s.Client.CoreV1().Secrets(s.Namespace).Get(ctx, s.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("secret %s/%s not found: the manifests create it (deploy/kubernetes/etcd-backup.yaml), and the backup may only update it: %w", s.Namespace, s.Name, err)
		}
		if err != nil {
			return fmt.Errorf("read secret %s/%s: %w", s.Namespace, s.Name, err)
		}
		if sec.Data == nil {
			sec.Data = map[string][]byte{}
		}
		if old := sec.Data[SecretLatest]; len(old) > 0 && len(old)+len(b) <= maxSecretBytes {
			sec.Data[SecretPrevious] = old
		} else {
			delete(sec.Data, SecretPrevious)
		}
		sec.Data[SecretLatest] = b
		if sec.Annotations == nil {
			sec.Annotations = map[string]string{}
		}
		sec.Annotations[annTaken] = e.Taken.Format(time.RFC3339)
		sec.Annotations[annRevision] = strconv.FormatInt(e.Revision, 10)
		sec.Annotations[annKeys] = strconv.Itoa(len(e.Keys))
		_, err = s.Client.CoreV1().Secrets(s.Namespace).Update(ctx, sec, metav1.UpdateOptions{})
		return err
	})
	return len(b), err
}

// loadExport reads the export of the Secret under key (SecretLatest or
// SecretPrevious).
func loadExport(ctx context.Context, s SecretTarget, key string) (*Export, error) {
	sec, err := s.Client.CoreV1().Secrets(s.Namespace).Get(ctx, s.Name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("read secret %s/%s: %w", s.Namespace, s.Name, err)
	}
	b := sec.Data[key]
	if len(b) == 0 {
		return nil, fmt.Errorf("secret %s/%s holds no %s: no backup has been written to it yet (kubectl -n %s get cronjob volplane-etcd-backup)", s.Namespace, s.Name, key, s.Namespace)
	}
	e, err := DecodeExport(b)
	if err != nil {
		return nil, fmt.Errorf("secret %s/%s, %s: %w", s.Namespace, s.Name, key, err)
	}
	return e, nil
}
