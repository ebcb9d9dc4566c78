package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/internal/devcsi"
)

// The storm's objects.
const (
	// Namespace holds every claim of a run.
	Namespace = "chaos"
	// DynamicClass is the dev CSI driver's class, policy Delete.
	DynamicClass = "chaos-dynamic"
	// RetainClass is the dev CSI driver's class with policy Retain and the
	// rebind policy on, made only with Options.RebindReleased.
	RetainClass = "chaos-retain"
	// annRebindReleased and rebindSameClaimName are the binder's rebind
	// policy (services/binder, docs/rebind.md), spelled out here: the
	// harness checks the binder, it does not share its constants.
	annRebindReleased   = "volplane.io/rebind-released"
	rebindSameClaimName = "SameClaimName"
	size                = "1Gi"
)

// storm makes the run's objects: static hostPath PVs (half Recycle, half
// Retain) and as many claims of no class, and claims of DynamicClass, in
// a seeded random order over the given time; and deletes the chosen
// claims, most of them right after they are made (while they bind or
// provision), some later.
//
// With rebind (Options.RebindReleased) the classes and most static PVs
// carry the rebind policy (docs/rebind.md), every third dynamic claim
// is of RetainClass, and half the deleted claims are deleted once they
// have had time to bind and then created again under the same name, so
// that the binder gives their Released volumes back while replicas are
// killed. One spare static PV per recreated static claim keeps a PV free
// for every live static claim whatever is rebound.
type storm struct {
	c      *Cluster
	b      *Book
	rng    *rand.Rand
	mu     sync.Mutex // rng
	logf   func(string, ...any)
	rebind bool
}

type task struct {
	at     time.Duration
	static int // PV and claim index, or -1
	pv     bool
	dyn    int // dynamic claim index, or -1
	del    time.Duration
	delete bool
	// recreate: again after the deletion, a claim of the same namespace,
	// name and spec is created.
	recreate bool
	again    time.Duration
}

// ClassPolicies are the rebind policies the run puts on its classes (by
// class name; "" for none).
func ClassPolicies(rebind bool) map[string]string {
	if !rebind {
		return map[string]string{}
	}
	return map[string]string{DynamicClass: rebindSameClaimName, RetainClass: rebindSameClaimName}
}

// staticPolicy is the rebind policy annotation of static PV i (odd ones
// Retain, even ones Recycle), with rebind: SameClaimName on three Retain
// PVs in four (the fourth says Never) and on half the Recycle ones (which
// must never be rebound); none on the other Recycle ones.
func staticPolicy(rebind bool, i int) string {
	switch {
	case !rebind || i%4 == 2:
		return ""
	case i%8 == 7:
		return "Never"
	}
	return rebindSameClaimName
}

// dynamicClass is the class of dynamic claim i.
func (s *storm) dynamicClass(i int) string {
	if s.rebind && i%3 == 2 {
		return RetainClass
	}
	return DynamicClass
}

// The times of the storm's deletions (docs/chaos.md): three in four come
// within quickDeleteWithin of the claim's creation; with the rebind
// policy, half are deleted between rebindDeleteMin and rebindDeleteMax
// after it and created again between recreateMin and recreateMax later.
const (
	quickDeleteWithin = 2 * time.Second
	rebindDeleteMin   = 3 * time.Second
	rebindDeleteMax   = 8 * time.Second
	recreateMin       = 300 * time.Millisecond
	recreateMax       = 4300 * time.Millisecond
)

// between is a time in [lo, hi), to the millisecond, from the seed.
func (s *storm) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(s.intn(int((hi-lo)/time.Millisecond)))*time.Millisecond
}

func (s *storm) intn(n int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rng.IntN(n)
}

// setup makes the namespace and the class.
func (s *storm) setup(ctx context.Context) error {
	if _, err := s.c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	classes := []struct {
		name   string
		policy corev1.PersistentVolumeReclaimPolicy
	}{{DynamicClass, corev1.PersistentVolumeReclaimDelete}}
	if s.rebind {
		classes = append(classes, struct {
			name   string
			policy corev1.PersistentVolumeReclaimPolicy
		}{RetainClass, corev1.PersistentVolumeReclaimRetain})
	}
	mode := storagev1.VolumeBindingImmediate
	for _, cl := range classes {
		sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: cl.name},
			Provisioner: devcsi.DefaultName, ReclaimPolicy: &cl.policy, VolumeBindingMode: &mode}
		if p := ClassPolicies(s.rebind)[cl.name]; p != "" {
			sc.Annotations = map[string]string{annRebindReleased: p}
		}
		if _, err := s.c.Client.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	return nil
}

// plan lays the storm out over span.
func (s *storm) plan(statics, dynamics, deletions int, span time.Duration) []task {
	var ts []task
	at := func() time.Duration { return time.Duration(s.intn(int(span/time.Millisecond)+1)) * time.Millisecond }
	for i := range statics {
		ts = append(ts, task{at: at(), static: i, pv: true, dyn: -1}, task{at: at(), static: i, dyn: -1})
	}
	for i := range dynamics {
		ts = append(ts, task{at: at(), static: -1, dyn: i})
	}
	// Deletions among the claims: three in four right after the claim is
	// made (0-2s: while it binds or provisions), the rest later.
	var claims []int
	for i, t := range ts {
		if !t.pv {
			claims = append(claims, i)
		}
	}
	spares := 0
	for n := 0; n < deletions && len(claims) > 0; n++ {
		k := s.intn(len(claims))
		i := claims[k]
		claims = append(claims[:k], claims[k+1:]...)
		ts[i].delete = true
		if s.rebind && s.intn(2) == 0 {
			// Deleted once it has likely bound (its volume is then
			// Released), and created again soon after: some before
			// the binder has seen the volume Released, most after.
			ts[i].recreate = true
			ts[i].del = s.between(rebindDeleteMin, rebindDeleteMax)
			ts[i].again = s.between(recreateMin, recreateMax)
			if ts[i].static >= 0 {
				spares++
			}
			continue
		}
		if s.intn(4) < 3 {
			ts[i].del = s.between(0, quickDeleteWithin)
		} else {
			ts[i].del = time.Duration(s.intn(int(span/time.Millisecond)/2+1)) * time.Millisecond
		}
	}
	for k := range spares {
		ts = append(ts, task{at: at(), static: statics + k, pv: true, dyn: -1})
	}
	return ts
}

// run carries the plan out; it returns when every task is done.
func (s *storm) run(ctx context.Context, ts []task) {
	start := time.Now()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for _, t := range ts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !sleep(ctx, time.Until(start.Add(t.at))) {
				return
			}
			sem <- struct{}{}
			made, err := s.do(ctx, t)
			<-sem
			if err == nil && made != nil && t.delete && sleep(ctx, t.del) {
				// The wait holds no slot: only the API calls are bounded.
				sem <- struct{}{}
				err = s.remove(ctx, made)
				<-sem
				if err == nil && t.recreate && sleep(ctx, t.again) {
					sem <- struct{}{}
					err = s.recreate(ctx, made, t.dyn >= 0)
					<-sem
				}
			}
			if err != nil && ctx.Err() == nil {
				s.logf("storm: %v", err)
			}
		}()
	}
	wg.Wait()
}

// do makes the task's object; a claim is returned, to be deleted later
// when the task says so.
func (s *storm) do(ctx context.Context, t task) (*corev1.PersistentVolumeClaim, error) {
	switch {
	case t.pv:
		return nil, s.volume(ctx, t.static)
	case t.static >= 0:
		cl := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: fmt.Sprintf("static-%d", t.static)},
			Spec: claimSpec("")}
		return s.claim(ctx, cl, false)
	default:
		cl := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: fmt.Sprintf("dynamic-%d", t.dyn)},
			Spec: claimSpec(s.dynamicClass(t.dyn))}
		return s.claim(ctx, cl, true)
	}
}

func claimSpec(class string) corev1.PersistentVolumeClaimSpec {
	return corev1.PersistentVolumeClaimSpec{
		AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		StorageClassName: &class,
		Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}},
	}
}

// volume makes static PV i: a hostPath directory under the cluster's
// HostPath, policy Recycle for even i and Retain for odd.
func (s *storm) volume(ctx context.Context, i int) error {
	dir := filepath.Join(s.c.HostPath, fmt.Sprintf("static-%d", i))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	policy := corev1.PersistentVolumeReclaimRecycle
	if i%2 == 1 {
		policy = corev1.PersistentVolumeReclaimRetain
	}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("chaos-static-%d", i)},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: policy,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir}},
		},
	}
	if p := staticPolicy(s.rebind, i); p != "" {
		pv.Annotations = map[string]string{annRebindReleased: p}
	}
	return retry(ctx, func() error {
		_, err := s.c.Client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	})
}

// claim makes a claim and records it.
func (s *storm) claim(ctx context.Context, cl *corev1.PersistentVolumeClaim, dynamic bool) (*corev1.PersistentVolumeClaim, error) {
	var made *corev1.PersistentVolumeClaim
	err := retry(ctx, func() error {
		var err error
		made, err = s.c.Client.CoreV1().PersistentVolumeClaims(Namespace).Create(ctx, cl, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			// An earlier try was made before its answer was lost.
			made, err = s.c.Client.CoreV1().PersistentVolumeClaims(Namespace).Get(ctx, cl.Name, metav1.GetOptions{})
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("create claim %s: %w", cl.Name, err)
	}
	s.b.Created(made, dynamic)
	return made, nil
}

// recreate makes a claim of the namespace, name and spec of the deleted
// claim old, once old is gone, and records it.
func (s *storm) recreate(ctx context.Context, old *corev1.PersistentVolumeClaim, dynamic bool) error {
	cl := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: old.Namespace, Name: old.Name},
		Spec: claimSpec(*old.Spec.StorageClassName)}
	claims := s.c.Client.CoreV1().PersistentVolumeClaims(old.Namespace)
	var made *corev1.PersistentVolumeClaim
	err := retry(ctx, func() error {
		var err error
		made, err = claims.Create(ctx, cl, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			// The old claim not gone yet, or an earlier try whose
			// answer was lost.
			got, gerr := claims.Get(ctx, cl.Name, metav1.GetOptions{})
			if gerr != nil {
				return gerr
			}
			if got.UID == old.UID || got.DeletionTimestamp != nil {
				return err
			}
			made, err = got, nil
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("recreate claim %s: %w", cl.Name, err)
	}
	s.b.Created(made, dynamic)
	s.b.Recreated(made.UID, old.UID)
	return nil
}

// remove deletes the claim made (that very UID) and records it.
func (s *storm) remove(ctx context.Context, made *corev1.PersistentVolumeClaim) error {
	uid := made.UID
	err := retry(ctx, func() error {
		err := s.c.Client.CoreV1().PersistentVolumeClaims(made.Namespace).Delete(ctx, made.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("delete claim %s: %w", made.Name, err)
	}
	s.b.Deleted(uid, made.Namespace+"/"+made.Name)
	return nil
}

// retry calls f until it succeeds or ctx ends: the API server is down on
// purpose now and then.
func retry(ctx context.Context, f func() error) error {
	delay := 100 * time.Millisecond
	for {
		err := f()
		if err == nil || apierrors.IsInvalid(err) || apierrors.IsForbidden(err) {
			return err
		}
		if !sleep(ctx, delay) {
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), err)
		}
		delay = min(2*delay, 2*time.Second)
	}
}

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
