package bench

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/volplane/volplane/pkg/kube"
)

// The existing population: what a cluster of many volumes holds before
// the measured claims arrive. Every run with the same size makes the same
// objects (a fixed seed per index), none of the bench's class, so that
// they cost what a large cluster costs (watch, cache, resync, matching
// over other classes) without taking the measured claims.
var (
	// existingClasses and their shares (percent).
	existingClasses = []weighted[string]{{"standard", 50}, {"fast", 25}, {"slow", 15}, {"archive", 10}}
	// existingModes are the volumes' access modes and their shares.
	existingModes = []weighted[corev1.PersistentVolumeAccessMode]{
		{corev1.ReadWriteOnce, 70}, {corev1.ReadWriteMany, 15}, {corev1.ReadOnlyMany, 10}, {corev1.ReadWriteOncePod, 5}}
	// existingSizes are the volumes' capacities and their shares.
	existingSizes = []weighted[string]{{"1Gi", 25}, {"5Gi", 20}, {"10Gi", 20}, {"20Gi", 12}, {"50Gi", 10},
		{"100Gi", 8}, {"500Gi", 4}, {"1Ti", 1}}
)

const (
	// existingBound is the percentage of existing volumes Bound to a
	// claim; the rest are Available.
	existingBound = 90
	// existingProvisioned is the percentage of existing volumes made by a
	// provisioner (CSI source, provisioned-by, policy Delete with the
	// external-provisioner finalizer); the rest are static, policy Retain.
	existingProvisioned = 80
	// existingNamespaces spread the existing claims.
	existingNamespaces = 50
	// existingDriver is the existing volumes' CSI driver: one no service
	// serves, as a cluster's other drivers are.
	existingDriver = "existing.csi.example.com"
	// existingSeed makes the population the same in every run.
	existingSeed = 14
)

type weighted[T any] struct {
	v      T
	weight int
}

// pick chooses from choices in proportion to their weights.
func pick[T any](r *rand.Rand, choices []weighted[T]) T {
	total := 0
	for _, c := range choices {
		total += c.weight
	}
	n := r.IntN(total)
	for _, c := range choices {
		if n < c.weight {
			return c.v
		}
		n -= c.weight
	}
	return choices[len(choices)-1].v
}

// existingPair is existing volume i and, when Bound, its claim (whose UID
// the volume's claimRef gets once the claim is created).
func existingPair(i int) (*corev1.PersistentVolume, *corev1.PersistentVolumeClaim) {
	r := rand.New(rand.NewPCG(existingSeed, uint64(i)))
	class := pick(r, existingClasses)
	mode := pick(r, existingModes)
	size := resource.MustParse(pick(r, existingSizes))
	bound := r.IntN(100) < existingBound
	provisioned := r.IntN(100) < existingProvisioned
	name := fmt.Sprintf("existing-pv-%06d", i)
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: size},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{mode},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              class,
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: existingDriver, VolumeHandle: fmt.Sprintf("vol-%08x", r.Uint32()), FSType: "ext4"}},
		},
	}
	if provisioned {
		pv.Annotations = map[string]string{kube.AnnDynamicallyProvisioned: existingDriver}
		pv.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimDelete
		pv.Finalizers = []string{kube.FinalizerExternalProvisioner}
	}
	if !bound {
		return pv, nil
	}
	claim := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("existing-%02d", i%existingNamespaces), Name: fmt.Sprintf("data-%06d", i),
			Annotations: map[string]string{kube.AnnBindCompleted: "yes", kube.AnnBoundByController: "yes"}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{mode},
			StorageClassName: &class,
			VolumeName:       name,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
		},
	}
	if provisioned {
		// As kube-controller-manager and a provisioner leave it.
		claim.Annotations[kube.AnnStorageProvisioner] = existingDriver
		claim.Annotations[kube.AnnBetaStorageProvisioner] = existingDriver
	} else {
		// A static volume the controller chose for the claim.
		pv.Annotations = map[string]string{kube.AnnBoundByController: "yes"}
	}
	return pv, claim
}

// Existing is the population a run made before its services started.
type Existing struct {
	Volumes, Claims int
	Requests        int           // API requests the bench made for them
	Took            time.Duration // creating them, from the first request to the last
}

// createExisting makes n existing volumes (and their claims) from k
// goroutines, each object in its final state: a Bound pair is the claim,
// then the volume with the claim's UID in its claimRef, then both
// statuses; an Available volume is the volume, then its status. The
// services then start on a cluster where nothing is left to do.
func createExisting(ctx context.Context, client kubernetes.Interface, n, k int, log io.Writer) (Existing, error) {
	start := time.Now()
	fmt.Fprintf(log, "creating %d existing volumes and their claims...\n", n)
	for _, c := range existingClasses {
		policy := corev1.PersistentVolumeReclaimDelete
		mode := storagev1.VolumeBindingImmediate
		if _, err := client.StorageV1().StorageClasses().Create(ctx, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: c.v},
			Provisioner: existingDriver, ReclaimPolicy: &policy, VolumeBindingMode: &mode}, metav1.CreateOptions{}); err != nil {
			return Existing{}, err
		}
	}
	for i := range existingNamespaces {
		if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("existing-%02d", i)}}, metav1.CreateOptions{}); err != nil {
			return Existing{}, err
		}
	}
	var claims, requests, done atomic.Int64
	progress := time.NewTicker(10 * time.Second)
	defer progress.Stop()
	stopProgress := make(chan struct{})
	defer close(stopProgress)
	go func() {
		for {
			select {
			case <-stopProgress:
				return
			case <-progress.C:
				fmt.Fprintf(log, "  %d of %d existing volumes (%.0f requests/s)\n", done.Load(), n, float64(requests.Load())/time.Since(start).Seconds())
			}
		}
	}()
	err := parallel(ctx, n, k, func(i int) error {
		defer done.Add(1)
		pv, claim := existingPair(i)
		if claim != nil {
			c, err := client.CoreV1().PersistentVolumeClaims(claim.Namespace).Create(ctx, claim, metav1.CreateOptions{})
			if err != nil {
				return err
			}
			claims.Add(1)
			requests.Add(1)
			pv.Spec.ClaimRef = claimRef(c)
			claim = c
		}
		v, err := client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		requests.Add(1)
		v.Status.Phase = corev1.VolumeAvailable
		if claim != nil {
			v.Status.Phase = corev1.VolumeBound
		}
		if _, err := client.CoreV1().PersistentVolumes().UpdateStatus(ctx, v, metav1.UpdateOptions{}); err != nil {
			return err
		}
		requests.Add(1)
		if claim == nil {
			return nil
		}
		claim.Status = corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound, AccessModes: v.Spec.AccessModes, Capacity: v.Spec.Capacity}
		if _, err := client.CoreV1().PersistentVolumeClaims(claim.Namespace).UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
			return err
		}
		requests.Add(1)
		return nil
	})
	if err != nil {
		return Existing{}, err
	}
	e := Existing{Volumes: n, Claims: int(claims.Load()), Requests: int(requests.Load()), Took: time.Since(start)}
	fmt.Fprintf(log, "created %d existing volumes and %d claims in %s\n", e.Volumes, e.Claims, e.Took.Round(time.Millisecond))
	return e, nil
}
