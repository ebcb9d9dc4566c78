package cluster

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// cgroupRoot is where the kubelets' pod cgroups live, in every hierarchy
// (cgroup v1, the cgroupfs driver: .../kubepods/<qos>/pod<UID>/...).
const cgroupRoot = "/sys/fs/cgroup"

// powerLoss is the drill's step before the backup is needed: every etcd
// member's pod loses every process at once (SIGKILL of the sandbox and the
// container, as a power loss of their nodes does), and the kubelet starts
// the same pods again on the same emptyDirs. Every member restarts on its
// data, so the marker and the reclaim's journal record are still there
// and nothing needs restoring: a restart of every member at once loses
// nothing (docs/etcd.md). The pods stay the same pods (same UIDs), each
// restarted at least once.
func (d *restoreDrill) powerLoss(t *testing.T) string {
	pods, err := c.Client.CoreV1().Pods(volplaneNS).List(t.Context(), metav1.ListOptions{LabelSelector: "app=volplane-etcd"})
	if err != nil {
		t.Fatal(err)
	}
	restarts := map[types.UID]int32{}
	for _, p := range pods.Items {
		restarts[p.UID] = restartsOf(&p)
	}
	began := time.Now()
	killed := 0
	for uid := range restarts {
		killed += killPodProcesses(t, uid)
	}
	waitFor(t, 5*time.Minute, func() string {
		pods, err := c.Client.CoreV1().Pods(volplaneNS).List(t.Context(), metav1.ListOptions{LabelSelector: "app=volplane-etcd"})
		if err != nil {
			return err.Error()
		}
		var waiting []string
		for _, p := range pods.Items {
			before, ok := restarts[p.UID]
			switch {
			case !ok:
				t.Fatalf("etcd pod %s is a new pod (UID %s): the power loss replaced a pod, and its data with it", p.Name, p.UID)
			case restartsOf(&p) <= before || !podReady(&p):
				waiting = append(waiting, fmt.Sprintf("%s (restarts %d, was %d; ready %v)", p.Name, restartsOf(&p), before, podReady(&p)))
			}
		}
		return strings.Join(waiting, ", ")
	})
	took := time.Since(began).Round(time.Second)
	var kvs map[string]string
	waitFor(t, 2*time.Minute, func() string {
		var err error
		kvs, err = etcdRange(t, d.marker, false)
		return errOrEmpty(err)
	})
	if _, ok := kvs[d.marker]; !ok {
		t.Fatalf("%s is gone after every member restarted at once: the restart lost the members' data", d.marker)
	}
	if msg := journalRecordOf(t, d.gone); msg != "" {
		t.Fatalf("after every member restarted at once: %s", msg)
	}
	return fmt.Sprintf("%d processes of %d pods killed; the same pods Ready again after %v; marker and journal record of %s still there", killed, len(restarts), took, d.gone)
}

// restartsOf sums the restarts of p's containers.
func restartsOf(p *corev1.Pod) int32 {
	var n int32
	for _, s := range p.Status.ContainerStatuses {
		n += s.RestartCount
	}
	return n
}

// killPodProcesses SIGKILLs every process in the cgroups of the pod uid
// (its sandbox's and its containers'), in every hierarchy, until none is
// left, and says how many it killed. The kubelet sees the sandbox dead
// and starts it again, with the same pod and volumes.
func killPodProcesses(t *testing.T, uid types.UID) int {
	t.Helper()
	var dirs []string
	name := "pod" + string(uid)
	err := filepath.WalkDir(cgroupRoot, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
				return nil
			}
			return err
		}
		if e.IsDir() && e.Name() == name {
			dirs = append(dirs, path)
			return filepath.SkipDir
		}
		return nil
	})
	if err != nil {
		t.Fatalf("looking for pod %s's cgroups below %s: %v", uid, cgroupRoot, err)
	}
	if len(dirs) == 0 {
		t.Fatalf("no cgroup named %s below %s (the kubelet's cgroupfs driver keeps one per pod)", name, cgroupRoot)
	}
	killed := 0
	for range 20 {
		found := 0
		for _, dir := range dirs {
			found += killInCgroup(dir)
		}
		if found == 0 {
			return killed
		}
		killed += found
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("processes left in pod %s's cgroups %v after 20 rounds of SIGKILL", uid, dirs)
	return killed
}

// killInCgroup SIGKILLs the processes of dir and of the cgroups below it,
// and says how many it found.
func killInCgroup(dir string) int {
	found := 0
	_ = filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
		if err != nil || !e.IsDir() {
			return nil
		}
		b, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
		if err != nil {
			return nil
		}
		for f := range strings.FieldsSeq(string(b)) {
			pid, err := strconv.Atoi(f)
			if err != nil {
				continue
			}
			if p, err := os.FindProcess(pid); err == nil && p.Kill() == nil {
				found++
			}
		}
		return nil
	})
	return found
}
