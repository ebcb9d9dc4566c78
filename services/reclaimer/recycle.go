package reclaimer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volplane/volplane/pkg/faultpoint"
	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/logging"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
)

// Labels and annotations of recycler pods: which volume, and which release
// of it, a pod scrubs.
const (
	labelManagedBy    = "app.kubernetes.io/managed-by"
	managedBy         = "volplane-reclaimer"
	annVolume         = "reclaimer.volplane.io/volume"
	annVolumeUID      = "reclaimer.volplane.io/volume-uid"
	annClaimUID       = "reclaimer.volplane.io/claim-uid"
	recyclerPodPrefix = "recycler-for-"
	// recyclerVolumeName is the pod volume whose source becomes the
	// recycled volume's, mounted at /scrub in the default pod.
	recyclerVolumeName = "vol"
	// scrubScript is the default recycler's command, Kubernetes' own: it
	// fails unless /scrub exists and ends up empty.
	scrubScript = `test -e /scrub && find /scrub -mindepth 1 -delete && test -z "$(ls -A /scrub)" || exit 1`
	// deadlineGrace is how long after its deadline a recycler pod that no
	// kubelet reported terminated is given up.
	deadlineGrace = time.Minute
)

// recycleOnNode carries out Recycle in node-local mode: this process
// deletes everything inside the volume's directory on its own node, once
// allowedPath has found it below one of the configured prefixes.
func (c *controller) recycleOnNode(ctx context.Context, r *reclaimerv1.Reclaim, v *corev1.PersistentVolume) error {
	if !r.DataRemoved {
		live, err := c.guard(ctx, r, true)
		if err != nil {
			return c.blocked(ctx, r, err)
		}
		dir, err := allowedPath(localPath(live), c.cfg.prefixes)
		if err != nil {
			return c.fail(ctx, r, live, kube.EventVolumeFailedRecycle, "Recycle failed: "+err.Error())
		}
		if err := c.begin(ctx, r, fmt.Sprintf("scrubbing %s on node %s", dir, c.cfg.nodeName)); err != nil {
			return err
		}
		_, sp := c.startSpan(ctx, spanScrub, r)
		err = c.scrub(dir)
		endSpan(sp, err)
		if err != nil {
			return c.fail(ctx, r, live, kube.EventVolumeFailedRecycle, "Recycle failed: "+err.Error())
		}
		faultpoint.Hit(faultpoint.ReclaimerAfterScrub)
		r.DataRemoved, r.Message = true, fmt.Sprintf("scrubbed %s; making the volume Available", dir)
		if err := c.save(ctx, r); err != nil {
			return err
		}
	}
	return c.makeAvailable(ctx, r)
}

func localPath(v *corev1.PersistentVolume) string {
	switch {
	case v.Spec.HostPath != nil:
		return v.Spec.HostPath.Path
	case v.Spec.Local != nil:
		return v.Spec.Local.Path
	}
	return ""
}

// scrubDir deletes every entry inside dir (hidden ones, nested
// directories; symbolic links are removed, never followed) and keeps dir.
// Like Kubernetes' recycler it fails when dir does not exist or is not
// empty afterwards; it refuses "/" and relative paths.
func scrubDir(dir string) error {
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("path %q is not absolute", dir)
	}
	dir = filepath.Clean(dir)
	if dir == "/" {
		return errors.New("refusing to scrub /")
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	left, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	if len(left) > 0 {
		names := make([]string, 0, len(left))
		for _, e := range left {
			names = append(names, e.Name())
		}
		return fmt.Errorf("%s is not empty after the scrub: %s", dir, strings.Join(names, ", "))
	}
	return nil
}

// recycleWithPod carries out Recycle with a recycler pod, as
// kube-controller-manager does: the pod is created (after the guard), then
// every change of it syncs the volume again, until it Succeeded (the
// volume becomes Available) or Failed (the volume goes Failed and a new
// pod is tried after the backoff). The pod is deleted either way. Until
// the pod has run the volume stays Released.
func (c *controller) recycleWithPod(ctx context.Context, r *reclaimerv1.Reclaim, v *corev1.PersistentVolume) error {
	if r.DataRemoved {
		c.removePod(ctx, r)
		return c.makeAvailable(ctx, r)
	}
	if r.RecyclerPod == "" {
		if err := c.startPod(ctx, r); err != nil {
			return err
		}
	}
	ns, name, _ := strings.Cut(r.RecyclerPod, "/")
	pod, err := c.kube.GetPod(ctx, ns, name)
	switch {
	case apierrors.IsNotFound(err) || err == nil && string(pod.UID) != r.RecyclerPodUid:
		r.RecyclerPod, r.RecyclerPodUid = "", ""
		return c.transient(ctx, r, fmt.Errorf("recycler pod %s/%s disappeared before it finished; another one is started", ns, name))
	case err != nil:
		return c.transient(ctx, r, fmt.Errorf("read recycler pod %s/%s: %w", ns, name, err))
	}
	// Each outcome is recorded (a write fenced on the reclaim's lock)
	// before the pod is deleted.
	switch pod.Status.Phase {
	case corev1.PodSucceeded, corev1.PodFailed:
		var failed error
		if pod.Status.Phase == corev1.PodFailed {
			failed = errors.New(podFailure(pod))
		}
		c.addSpan(ctx, spanRecyclerPod, r, pod.CreationTimestamp.Time, c.now(), r.RecyclerPod+" "+string(pod.Status.Phase)+" (from its creationTimestamp, whole seconds)", failed)
	}
	switch pod.Status.Phase {
	case corev1.PodSucceeded:
		recyclerPods.WithLabelValues("succeeded").Inc()
		r.DataRemoved = true
		r.Message = fmt.Sprintf("recycler pod %s/%s succeeded; making the volume Available", ns, name)
		if err := c.save(ctx, r); err != nil {
			return err
		}
		c.removePod(ctx, r)
		return c.makeAvailable(ctx, r)
	case corev1.PodFailed:
		return c.podFailed(ctx, r, v, pod, "Recycle failed: "+podFailure(pod))
	}
	deadline := pod.CreationTimestamp.Add(time.Duration(activeDeadline(pod))*time.Second + deadlineGrace)
	if wait := deadline.Sub(c.now()); wait > 0 {
		// Its status changes sync the volume; this is the fallback.
		c.queue.AddAfter(r.VolumeName, wait)
		return nil
	}
	return c.podFailed(ctx, r, v, pod,
		fmt.Sprintf("Recycle failed: recycler pod %s/%s did not finish within %ds of its deadline and was deleted", ns, name, activeDeadline(pod)))
}

// podFailed fails the reclaim of a recycler pod that failed, then deletes
// the pod; the next attempt starts a new one.
func (c *controller) podFailed(ctx context.Context, r *reclaimerv1.Reclaim, v *corev1.PersistentVolume, pod *corev1.Pod, msg string) error {
	recyclerPods.WithLabelValues("failed").Inc()
	r.RecyclerPod, r.RecyclerPodUid = "", ""
	err := c.fail(ctx, r, v, kube.EventVolumeFailedRecycle, msg)
	if errors.Is(err, errSuperseded) {
		return err
	}
	if derr := c.deletePod(ctx, pod); derr != nil {
		c.log.Warn("cannot delete a failed recycler pod; the next attempt deletes it", "volume", r.VolumeName, logging.ClaimRef(r.ClaimNamespace, r.ClaimName, r.ClaimUid), "error", derr)
	}
	return err
}

// startPod creates the recycler pod, once the guard lets it, and records
// it; a pod of the same name left by this reclaim (a replica stopped after
// creating it) is adopted.
func (c *controller) startPod(ctx context.Context, r *reclaimerv1.Reclaim) error {
	live, err := c.guard(ctx, r, true)
	if err != nil {
		return c.blocked(ctx, r, err)
	}
	pod, err := c.recyclerPod(live, r)
	if err != nil {
		return c.fail(ctx, r, live, kube.EventVolumeFailedRecycle, "Recycle failed: "+err.Error())
	}
	if err := c.begin(ctx, r, fmt.Sprintf("starting recycler pod %s/%s", pod.Namespace, pod.Name)); err != nil {
		return err
	}
	created, err := c.kube.CreatePod(ctx, pod)
	if apierrors.IsAlreadyExists(err) {
		created, err = c.kube.GetPod(ctx, pod.Namespace, pod.Name)
		switch {
		case err != nil:
		case !podDone(created) && created.Annotations[annVolumeUID] == r.VolumeUid && created.Annotations[annClaimUID] == r.ClaimUid:
			// Created by this reclaim before its replica stopped.
			c.log.Info("adopting this reclaim's recycler pod", "volume", r.VolumeName, logging.ClaimRef(r.ClaimNamespace, r.ClaimName, r.ClaimUid), "pod", pod.Namespace+"/"+pod.Name)
		case created.Labels[labelManagedBy] == managedBy && podDone(created):
			err = c.deletePod(ctx, created)
			if err == nil {
				err = fmt.Errorf("the finished recycler pod %s/%s of an earlier attempt was in the way and is deleted", pod.Namespace, pod.Name)
			}
			return c.transient(ctx, r, err)
		default:
			r.State = reclaimerv1.State_STATE_PENDING
			return c.transient(ctx, r, fmt.Errorf("pod %s/%s exists and was not started for this reclaim; waiting for it to go", pod.Namespace, pod.Name))
		}
	}
	if err != nil {
		return c.transient(ctx, r, fmt.Errorf("create recycler pod %s/%s: %w", pod.Namespace, pod.Name, err))
	}
	r.RecyclerPod, r.RecyclerPodUid = created.Namespace+"/"+created.Name, string(created.UID)
	r.Message = fmt.Sprintf("recycler pod %s is scrubbing the volume", r.RecyclerPod)
	if err := c.save(ctx, r); err != nil {
		return err
	}
	recyclerPods.WithLabelValues("started").Inc()
	c.log.Info("recycler pod started", "volume", r.VolumeName, logging.ClaimRef(r.ClaimNamespace, r.ClaimName, r.ClaimUid), "pod", r.RecyclerPod, "deadline", activeDeadline(created))
	return nil
}

func podDone(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

func activeDeadline(p *corev1.Pod) int64 {
	if p.Spec.ActiveDeadlineSeconds == nil {
		return 0
	}
	return *p.Spec.ActiveDeadlineSeconds
}

// podFailure says why a recycler pod failed, from its status.
func podFailure(p *corev1.Pod) string {
	why := fmt.Sprintf("recycler pod %s/%s failed", p.Namespace, p.Name)
	if p.Status.Reason != "" {
		why += ": " + p.Status.Reason
	}
	if p.Status.Message != "" {
		why += ": " + p.Status.Message
	}
	for _, cs := range p.Status.ContainerStatuses {
		if t := cs.State.Terminated; t != nil && t.ExitCode != 0 {
			why += fmt.Sprintf(": container %s exited with %d", cs.Name, t.ExitCode)
			if t.Message != "" {
				why += ": " + t.Message
			}
		}
	}
	return why
}

// deletePod deletes a recycler pod (if it is still the same pod).
func (c *controller) deletePod(ctx context.Context, p *corev1.Pod) error {
	err := c.kube.DeletePod(ctx, p.Namespace, p.Name, p.UID)
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete recycler pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	return nil
}

// removePod deletes the reclaim's recycler pod, if any, when the reclaim
// stops without it.
func (c *controller) removePod(ctx context.Context, r *reclaimerv1.Reclaim) {
	if r.RecyclerPod == "" {
		return
	}
	ns, name, _ := strings.Cut(r.RecyclerPod, "/")
	err := c.kube.DeletePod(ctx, ns, name, types.UID(r.RecyclerPodUid))
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		c.log.Warn("cannot delete a recycler pod", "volume", r.VolumeName, logging.ClaimRef(r.ClaimNamespace, r.ClaimName, r.ClaimUid), "pod", r.RecyclerPod, "error", err)
	}
	r.RecyclerPod, r.RecyclerPodUid = "", ""
}

// recyclerPod builds the recycler pod of a volume: the template (or the
// default pod), named recycler-for-<volume> in the recycler namespace,
// with the volume's source as volume "vol" and a deadline growing with the
// volume's size.
func (c *controller) recyclerPod(v *corev1.PersistentVolume, r *reclaimerv1.Reclaim) (*corev1.Pod, error) {
	var src corev1.VolumeSource
	switch {
	case v.Spec.HostPath != nil:
		src.HostPath = &corev1.HostPathVolumeSource{Path: v.Spec.HostPath.Path}
	case v.Spec.NFS != nil:
		src.NFS = &corev1.NFSVolumeSource{Server: v.Spec.NFS.Server, Path: v.Spec.NFS.Path}
	default:
		//lint:ignore ST1005 kube-controller-manager's exact message, kept for fidelity
		return nil, errors.New(msgNoRecycler)
	}
	var pod *corev1.Pod
	if c.cfg.template != nil {
		pod = c.cfg.template.DeepCopy()
	} else {
		pod = defaultRecyclerPod(c.cfg.image)
	}
	vol := recyclerVolume(pod)
	if vol == nil {
		return nil, fmt.Errorf("the recycler pod template has no volume %q", recyclerVolumeName)
	}
	vol.VolumeSource = src
	pod.Name, pod.GenerateName, pod.Namespace = recyclerPodPrefix+v.Name, "", c.cfg.namespace
	pod.ResourceVersion, pod.UID = "", ""
	if pod.Labels == nil {
		pod.Labels = map[string]string{}
	}
	pod.Labels[labelManagedBy] = managedBy
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[annVolume], pod.Annotations[annVolumeUID], pod.Annotations[annClaimUID] = v.Name, string(v.UID), r.ClaimUid
	if pod.Spec.RestartPolicy == "" || pod.Spec.RestartPolicy == corev1.RestartPolicyAlways {
		pod.Spec.RestartPolicy = corev1.RestartPolicyNever
	}
	deadline := recyclerTimeout(v, c.cfg.minTimeout, c.cfg.increment)
	pod.Spec.ActiveDeadlineSeconds = &deadline
	return pod, nil
}

func recyclerVolume(p *corev1.Pod) *corev1.Volume {
	for i := range p.Spec.Volumes {
		if p.Spec.Volumes[i].Name == recyclerVolumeName {
			return &p.Spec.Volumes[i]
		}
	}
	return nil
}

// defaultRecyclerPod is Kubernetes' recycler pod with the given image:
// volplane's image runs its reclaimer's scrub (ScrubCommand), as root as
// busybox's runs, so that it deletes whatever user owns the files; any
// other image Kubernetes' shell command.
func defaultRecyclerPod(image string) *corev1.Pod {
	c := corev1.Container{
		Name:         "pv-recycler",
		Image:        image,
		Command:      []string{"/bin/sh"},
		Args:         []string{"-c", scrubScript},
		VolumeMounts: []corev1.VolumeMount{{Name: recyclerVolumeName, MountPath: "/scrub"}},
	}
	if isVolplaneImage(image) {
		root := int64(0)
		c.Command, c.Args = []string{"/usr/local/bin/reclaimer", ScrubCommand, "/scrub"}, nil
		c.SecurityContext = &corev1.SecurityContext{RunAsUser: &root, RunAsGroup: &root}
	}
	return &corev1.Pod{
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{c},
			Volumes:       []corev1.Volume{{Name: recyclerVolumeName}},
		},
	}
}

// isVolplaneImage says whether an image reference names volplane's image:
// its repository's last component is "volplane", on any registry (a
// mirror keeps the name), with any tag or digest.
func isVolplaneImage(image string) bool {
	repo, _, _ := strings.Cut(image, "@")
	if colon := strings.LastIndex(repo, ":"); colon > strings.LastIndex(repo, "/") {
		repo = repo[:colon]
	}
	return path.Base(repo) == "volplane" && strings.Contains(repo, "/")
}

// ScrubCommand is the reclaimer's mode that scrubs a directory and exits
// (reclaimer scrub DIR): the default recycler pod's command.
const ScrubCommand = "scrub"

// Scrub deletes every entry inside dir and keeps dir, as the recycler
// pod's command: it fails when dir does not exist, is not a directory, is
// "/" or relative, or is not empty afterwards. Symbolic links are removed,
// never followed.
func Scrub(dir string) error { return scrubDir(dir) }

// recyclerTimeout is the recycler pod's activeDeadlineSeconds: the
// increment per GiB of the volume's capacity (rounded up), at least the
// minimum, as kube-controller-manager computes it.
func recyclerTimeout(v *corev1.PersistentVolume, minimum, increment time.Duration) int64 {
	t := minimum
	if q, ok := v.Spec.Capacity[corev1.ResourceStorage]; ok {
		gib := math.Ceil(float64(q.Value()) / (1 << 30))
		if byCap := time.Duration(gib * float64(increment)); byCap > t {
			t = byCap
		}
	}
	return int64(math.Ceil(t.Seconds()))
}
