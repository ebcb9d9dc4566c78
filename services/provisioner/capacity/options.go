package capacity

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Defaults of Options.
const (
	DefaultPollInterval = time.Minute
	DefaultManagedBy    = "volplane-provisioner"
)

// Options configures storage capacity tracking: for every driver
// with the GET_CAPACITY controller capability, one CSIStorageCapacity
// object per topology segment and StorageClass, as external-provisioner's
// --enable-capacity publishes them, so the scheduler places pods of
// WaitForFirstConsumer claims where their volumes fit.
type Options struct {
	// Enabled turns tracking on (--enable-capacity); off by default, as
	// in external-provisioner.
	Enabled bool
	// PollInterval is how often every object is refreshed
	// (--capacity-poll-interval); default DefaultPollInterval.
	// Objects are also refreshed when a volume is created or deleted, and
	// when classes, CSINodes or Node labels change.
	PollInterval time.Duration
	// Namespace holds the objects (--capacity-namespace): the
	// provisioner's own namespace, as external-provisioner's NAMESPACE.
	// Required when Enabled.
	Namespace string
	// ManagedBy is the csi.storage.k8s.io/managed-by label value of the
	// objects this provisioner owns (--capacity-managed-by); default
	// DefaultManagedBy. external-provisioner's is
	// "external-provisioner": set that to adopt its objects when replacing
	// it; the distinct default keeps the two from fighting over objects
	// while both run. The scheduler reads neither label.
	ManagedBy string
	// Owner is the object that owns the objects, "Kind/name" in Namespace
	// (--capacity-owner): Deployment, StatefulSet, DaemonSet or ReplicaSet
	// (apps/v1). Deleting it garbage-collects them, as external-provisioner's
	// --capacity-ownerref-level does for its Deployment. Empty sets no
	// owner: the objects stay after an uninstall, found by their labels.
	Owner string
	// ForImmediateBinding also publishes for classes with Immediate
	// binding (--capacity-for-immediate-binding); by default only
	// WaitForFirstConsumer classes, whose pods the scheduler places.
	ForImmediateBinding bool
}

// Validate checks the options and fills in the defaults.
func (c *Options) Validate() error {
	if !c.Enabled {
		return nil
	}
	var errs []error
	if c.Namespace == "" {
		errs = append(errs, errors.New("capacity tracking needs the namespace of its CSIStorageCapacity objects (--capacity-namespace)"))
	}
	switch {
	case c.PollInterval < 0:
		errs = append(errs, fmt.Errorf("--capacity-poll-interval must not be negative, got %s", c.PollInterval))
	case c.PollInterval == 0:
		c.PollInterval = DefaultPollInterval
	}
	if c.ManagedBy == "" {
		c.ManagedBy = DefaultManagedBy
	}
	if c.Owner != "" {
		if _, _, err := parseOwner(c.Owner); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ownerKinds are the kinds --capacity-owner accepts.
var ownerKinds = map[string]bool{"Deployment": true, "StatefulSet": true, "DaemonSet": true, "ReplicaSet": true}

func parseOwner(s string) (kind, name string, err error) {
	kind, name, ok := strings.Cut(s, "/")
	if !ok || name == "" || !ownerKinds[kind] {
		return "", "", fmt.Errorf("--capacity-owner %q: want Kind/name with Kind Deployment, StatefulSet, DaemonSet or ReplicaSet", s)
	}
	return kind, name, nil
}
