package capacity

import (
	"context"
	"errors"
	"fmt"
	"strings"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/volplane/volplane/pkg/coord"
)

// key names one object: a class in a segment.
func key(class string, seg map[string]string) string {
	return class + " " + segmentString(seg)
}

// segmentString shows a segment, its keys sorted (fmt sorts map keys).
func segmentString(seg map[string]string) string { return fmt.Sprint(seg) }

// wanted is one object a driver should have.
type wanted struct {
	class *storagev1.StorageClass
	seg   map[string]string // nil: a driver without topology
}

// desired lists the objects driver d should have: its classes (those of
// its provisioner name, WaitForFirstConsumer unless ForImmediateBinding)
// in every segment of a node where it is installed.
func (c *Controller) desired(d Driver) ([]wanted, error) {
	classes, err := c.classes.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	segs := []map[string]string{nil}
	if d.Topology {
		if segs, err = c.drivers.Segments(d.Name); err != nil {
			return nil, err
		}
	}
	var out []wanted
	for _, sc := range classes {
		if sc.Provisioner != d.ProvisionerName {
			continue
		}
		wffc := sc.VolumeBindingMode != nil && *sc.VolumeBindingMode == storagev1.VolumeBindingWaitForFirstConsumer
		if !wffc && !c.opts.ForImmediateBinding {
			continue
		}
		for _, seg := range segs {
			if seg != nil && len(sc.AllowedTopologies) > 0 && !c.drivers.Allowed(seg, sc) {
				continue
			}
			out = append(out, wanted{class: sc, seg: seg})
		}
	}
	return out, nil
}

// sync makes driver name's objects match what GetCapacity says now.
func (c *Controller) sync(ctx context.Context, name string) error {
	d, ok := c.drivers.Driver(name)
	if !ok || !d.Ready {
		return nil // probed again soon; the next poll comes back
	}
	if err := c.elect.Reserve(ctx, "capacity/"+name, c.member); err != nil {
		if errors.Is(err, coord.ErrReserved) {
			return nil // another replica publishes this driver's capacity
		}
		return err
	}
	var want []wanted
	if d.GetCapacity {
		var err error
		if want, err = c.desired(d); err != nil {
			return err
		}
	}
	api := c.client.StorageV1().CSIStorageCapacities(c.opts.Namespace)
	list, err := api.List(ctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(c.labels(name)).String()})
	if err != nil {
		return fmt.Errorf("list CSIStorageCapacities: %w", err)
	}
	have := map[string]*storagev1.CSIStorageCapacity{}
	var errs []error
	for i := range list.Items {
		obj := &list.Items[i]
		k := key(obj.StorageClassName, selectorSegment(obj.NodeTopology))
		if _, dup := have[k]; dup {
			// Two writers raced once: keep one.
			errs = append(errs, c.delete(ctx, obj))
			continue
		}
		have[k] = obj
	}
	for _, w := range want {
		k := key(w.class.Name, w.seg)
		obj := have[k]
		delete(have, k)
		if err := c.publish(ctx, d, w, obj); err != nil {
			errs = append(errs, err)
		}
	}
	for _, obj := range have { // a class or segment that is gone
		errs = append(errs, c.delete(ctx, obj))
	}
	return errors.Join(errs...)
}

func (c *Controller) labels(driver string) map[string]string {
	return map[string]string{LabelDriverName: driver, LabelManagedBy: c.opts.ManagedBy}
}

// publish asks the driver for w's capacity and creates or updates obj.
func (c *Controller) publish(ctx context.Context, d Driver, w wanted, obj *storagev1.CSIStorageCapacity) error {
	req := &csi.GetCapacityRequest{Parameters: parameters(w.class)}
	if w.seg != nil {
		req.AccessibleTopology = &csi.Topology{Segments: w.seg}
	}
	cctx, cancel := context.WithTimeout(ctx, c.timeout)
	resp, err := d.Client.GetCapacity(cctx, req)
	cancel()
	if err != nil {
		return fmt.Errorf("GetCapacity of class %s in %s: %w", w.class.Name, segmentString(w.seg), err)
	}
	capacity := resource.NewQuantity(resp.GetAvailableCapacity(), resource.BinarySI)
	var maxSize *resource.Quantity
	if m := resp.GetMaximumVolumeSize(); m != nil {
		maxSize = resource.NewQuantity(m.GetValue(), resource.BinarySI)
	}
	api := c.client.StorageV1().CSIStorageCapacities(c.opts.Namespace)
	if obj == nil {
		obj = &storagev1.CSIStorageCapacity{
			ObjectMeta:        metav1.ObjectMeta{GenerateName: "csisc-", Labels: c.labels(d.Name)},
			StorageClassName:  w.class.Name,
			NodeTopology:      &metav1.LabelSelector{MatchLabels: w.seg},
			Capacity:          capacity,
			MaximumVolumeSize: maxSize,
		}
		if c.owner != nil {
			obj.OwnerReferences = []metav1.OwnerReference{*c.owner}
		}
		created, err := api.Create(ctx, obj, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create CSIStorageCapacity for class %s in %s: %w", w.class.Name, segmentString(w.seg), err)
		}
		c.log.Debug("created CSIStorageCapacity", "name", created.Name, "class", w.class.Name, "segment", segmentString(w.seg), "capacity", capacity.String())
		return nil
	}
	if sameQuantity(obj.Capacity, capacity) && sameQuantity(obj.MaximumVolumeSize, maxSize) && c.ownedBy(obj) {
		return nil
	}
	obj = obj.DeepCopy()
	obj.Capacity, obj.MaximumVolumeSize = capacity, maxSize
	if !c.ownedBy(obj) {
		obj.OwnerReferences = append(obj.OwnerReferences, *c.owner)
	}
	if _, err := api.Update(ctx, obj, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update CSIStorageCapacity %s: %w", obj.Name, err)
	}
	c.log.Debug("updated CSIStorageCapacity", "name", obj.Name, "class", w.class.Name, "segment", segmentString(w.seg), "capacity", capacity.String())
	return nil
}

func (c *Controller) delete(ctx context.Context, obj *storagev1.CSIStorageCapacity) error {
	err := c.client.StorageV1().CSIStorageCapacities(obj.Namespace).Delete(ctx, obj.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &obj.UID}})
	if err != nil && !isNotFoundOrConflict(err) {
		return fmt.Errorf("delete CSIStorageCapacity %s: %w", obj.Name, err)
	}
	return nil
}

// ownedBy reports whether obj carries the configured owner (true when
// none is configured).
func (c *Controller) ownedBy(obj *storagev1.CSIStorageCapacity) bool {
	if c.owner == nil {
		return true
	}
	for _, r := range obj.OwnerReferences {
		if r.UID == c.owner.UID {
			return true
		}
	}
	return false
}

func sameQuantity(a, b *resource.Quantity) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Cmp(*b) == 0
}

// provisionerParameterPrefix starts the class parameters that are for
// the provisioner, not the driver.
const provisionerParameterPrefix = "csi.storage.k8s.io/"

// parameters are the class parameters CreateVolume gets, so GetCapacity
// answers for the volumes this class makes: without the
// csi.storage.k8s.io/ keys, which only the provisioner reads.
func parameters(class *storagev1.StorageClass) map[string]string {
	out := map[string]string{}
	for k, v := range class.Parameters {
		if !strings.HasPrefix(k, provisionerParameterPrefix) {
			out[k] = v
		}
	}
	return out
}

// selectorSegment is the segment an object's nodeTopology selects (nil
// for none).
func selectorSegment(s *metav1.LabelSelector) map[string]string {
	if s == nil || len(s.MatchLabels) == 0 {
		return nil
	}
	return s.MatchLabels
}

// isNotFoundOrConflict: the object is gone, or is another one now.
func isNotFoundOrConflict(err error) bool {
	return apierrors.IsNotFound(err) || apierrors.IsConflict(err)
}
