package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

const (
	// benchNamespace holds the measured claims.
	benchNamespace = "bench"
	// benchClass is the measured claims' and volumes' class.
	benchClass = "bench"
	// benchLabel marks the measured volumes, to count them among many.
	benchLabel = "volplane.io/bench"
)

func volume(i int) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bench-pv-%06d", i), Labels: map[string]string{benchLabel: "volume"}},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              benchClass,
			PersistentVolumeSource: corev1.PersistentVolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: fmt.Sprintf("/tmp/bench/%d", i)},
			},
		},
	}
}

func claim(i int) *corev1.PersistentVolumeClaim {
	cls := benchClass
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: benchNamespace, Name: fmt.Sprintf("claim-%d", i)},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: &cls,
			Resources: corev1.VolumeResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			},
		},
	}
}

// parallel runs fn(0..n-1) on k goroutines and returns the first error.
func parallel(ctx context.Context, n, k int, fn func(i int) error) error {
	next := make(chan int)
	errc := make(chan error, k)
	var wg sync.WaitGroup
	for range k {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := fn(i); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	var err error
feed:
	for i := range n {
		select {
		case next <- i:
		case err = <-errc:
			break feed
		case <-ctx.Done():
			err = ctx.Err()
			break feed
		}
	}
	close(next)
	wg.Wait()
	if err == nil {
		select {
		case err = <-errc:
		default:
		}
	}
	return err
}

// waitVolumesAvailable waits until n of the bench's volumes are Available.
func waitVolumesAvailable(ctx context.Context, client kubernetes.Interface, n int, fail <-chan error) error {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		list, err := client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{ResourceVersion: "0", LabelSelector: benchLabel})
		available := 0
		if err == nil {
			for _, v := range list.Items {
				if v.Status.Phase == corev1.VolumeAvailable {
					available++
				}
			}
			if available >= n {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d volumes Available within 5 minutes (%v)", available, n, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-fail:
			return err
		case <-time.After(250 * time.Millisecond):
		}
	}
}
