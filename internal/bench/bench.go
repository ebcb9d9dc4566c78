package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/internal/devenv"
	"github.com/volplane/volplane/internal/pki"
	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/kube"
)

// Options configures a benchmark run.
type Options struct {
	// N is the number of volume/claim pairs.
	N int
	// BinDir holds the watcher and binder binaries.
	BinDir string
	// KubeAPIServer is the kube-apiserver binary; empty finds the cached one.
	KubeAPIServer string
	// Workers is passed to the binder's --workers; 0 keeps its default.
	Workers int
	// Clients is how many goroutines create objects in parallel.
	Clients int
	// ProfileDir, when set, receives CPU profiles of the binder and the
	// watcher taken while the claims are bound (binder.pprof, watcher.pprof)
	// and their heap profiles at the end (binder.heap, watcher.heap).
	ProfileDir string
	// KCM, when set, is a kube-controller-manager binary: its
	// persistentvolume-binder controller (client QPS KCMQPS) binds instead
	// of volplane, for a comparison on the same machine and apiserver.
	KCM string
	// KCMQPS is kube-controller-manager's --kube-api-qps (and burst).
	KCMQPS int
	// ExternalProvisioner, with KCM and Dynamic, is a csi-provisioner
	// binary (the CSI external-provisioner): it provisions through the
	// same dev CSI driver instead of volplane's provisioner, for a
	// comparison on the same machine, apiserver and driver.
	ExternalProvisioner string
	// Dynamic measures dynamic provisioning instead of static binding: no
	// volumes are made up front; the claims are of a class of volplane's
	// dev CSI driver, provisioned by the provisioner service (the
	// volplane-csi and provisioner binaries run as processes too).
	Dynamic bool
	// Out receives the report.
	Out io.Writer
}

// Result is what a run measured.
type Result struct {
	N                  int
	Binder             string        // what bound: "volplane" or "kube-controller-manager"
	Dynamic            bool          // claims were provisioned, not bound to existing volumes
	Elapsed            time.Duration // first claim created to last claim Bound
	BindsPerSecond     float64
	P50, P99, Max      time.Duration // create-to-Bound latency
	BinderPeakRSS      int64         // bytes
	BinderCPU          time.Duration // user+system time of the binder process
	WatcherCPU         time.Duration
	WatcherPeakRSS     int64         // bytes
	CreateClaimsWindow time.Duration // how long creating the N claims took
	ProvisionerCPU     time.Duration // dynamic only
	ProvisionerPeakRSS int64         // bytes; dynamic only
	DriverCPU          time.Duration // the dev CSI driver's; dynamic only
}

// Run runs the benchmark once.
func Run(ctx context.Context, o Options) (*Result, error) {
	if o.N <= 0 {
		return nil, fmt.Errorf("n must be positive, got %d", o.N)
	}
	if o.Clients <= 0 {
		o.Clients = 32
	}
	if o.Out == nil {
		o.Out = os.Stdout
	}
	if o.Dynamic && o.KCM != "" && o.ExternalProvisioner == "" {
		return nil, errors.New("kube-controller-manager provisions nothing itself: compare dynamic provisioning with --external-provisioner too")
	}
	if o.ExternalProvisioner != "" && (!o.Dynamic || o.KCM == "") {
		return nil, errors.New("--external-provisioner goes with --dynamic and --kube-controller-manager")
	}
	dir, err := os.MkdirTemp("", "volplane-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)

	fmt.Fprintf(o.Out, "starting etcd and kube-apiserver...\n")
	env, err := devenv.Start(ctx, devenv.Options{Dir: dir, KubeAPIServer: o.KubeAPIServer})
	if err != nil {
		return nil, err
	}
	defer env.Stop()
	// Mutual TLS between the services, as in production.
	certs, err := pki.Generate(filepath.Join(dir, "tls"), append(pki.Services, "bench")...)
	if err != nil {
		return nil, fmt.Errorf("generate certificates: %w", err)
	}

	var binder, watcher, provisioner, driver *devenv.Process
	var binderAddr, watcherDebug, binderDebug, provisionerAddr string
	if o.Dynamic {
		if driver, provisioner, provisionerAddr, err = startProvisioning(ctx, dir, o.BinDir, env, certs, o.ExternalProvisioner, o.KCMQPS); err != nil {
			return nil, err
		}
		defer driver.Stop()
		defer provisioner.Stop()
	}
	if o.KCM != "" {
		if binder, err = startKCM(dir, o.KCM, env.Kubeconfig, o.KCMQPS); err != nil {
			return nil, err
		}
		defer binder.Stop()
	} else {
		watcherAddr, err := devenv.FreeAddr()
		if err != nil {
			return nil, err
		}
		if binderAddr, err = devenv.FreeAddr(); err != nil {
			return nil, err
		}
		watcherArgs := append([]string{"--kubeconfig", env.Kubeconfig, "--listen", watcherAddr, "--log-level", "warn"}, devenv.TLSArgs(certs["watcher"])...)
		if o.ProfileDir != "" {
			if watcherDebug, err = devenv.FreeAddr(); err != nil {
				return nil, err
			}
			if binderDebug, err = devenv.FreeAddr(); err != nil {
				return nil, err
			}
			watcherArgs = append(watcherArgs, "--debug-address", watcherDebug)
		}
		watcher, err = devenv.StartProcess(dir, "watcher", filepath.Join(o.BinDir, "watcher"), watcherArgs...)
		if err != nil {
			return nil, err
		}
		defer watcher.Stop()
		args := []string{"--kubeconfig", env.Kubeconfig, "--etcd-endpoints", strings.Join(env.EtcdEndpoints, ","),
			"--listen", binderAddr, "--watcher-address", watcherAddr, "--log-level", "warn"}
		args = append(args, devenv.TLSArgs(certs["binder"])...)
		if o.Workers > 0 {
			args = append(args, "--workers", strconv.Itoa(o.Workers))
		}
		if provisionerAddr != "" {
			args = append(args, "--provisioner-address", provisionerAddr)
		}
		if binderDebug != "" {
			args = append(args, "--debug-address", binderDebug)
		}
		binder, err = devenv.StartProcess(dir, "binder", filepath.Join(o.BinDir, "binder"), args...)
		if err != nil {
			return nil, err
		}
		defer binder.Stop()
		if err := devenv.WaitServing(ctx, binderAddr, "", certs["bench"], 2*time.Minute); err != nil {
			return nil, fmt.Errorf("binder: %w (log: %s)", err, binder.LogPath)
		}
	}
	client := kubernetes.NewForConfigOrDie(kube.Tune(env.RESTConfig, kube.ClientOptions{UserAgent: "volplane-bench"}))
	const ns = "bench"
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}

	if o.Dynamic {
		// The driver's node, registered as its kubelet would: external-
		// provisioner refuses to provision for a topology-aware driver
		// that no CSINode lists, and both provisioners should see the same.
		if err := devcsi.RegisterNode(ctx, client, devcsi.DefaultName, "bench-node"); err != nil {
			return nil, err
		}
		policy := corev1.PersistentVolumeReclaimDelete
		mode := storagev1.VolumeBindingImmediate
		if _, err := client.StorageV1().StorageClasses().Create(ctx, &storagev1.StorageClass{
			ObjectMeta: metav1.ObjectMeta{Name: "bench"}, Provisioner: devcsi.DefaultName,
			ReclaimPolicy: &policy, VolumeBindingMode: &mode,
		}, metav1.CreateOptions{}); err != nil {
			return nil, err
		}
	} else {
		fmt.Fprintf(o.Out, "creating %d volumes...\n", o.N)
		if err := parallel(ctx, o.N, o.Clients, func(i int) error {
			_, err := client.CoreV1().PersistentVolumes().Create(ctx, volume(i), metav1.CreateOptions{})
			return err
		}); err != nil {
			return nil, fmt.Errorf("create volumes: %w", err)
		}
		// Let the binder make every volume Available before claims arrive.
		if err := waitVolumesAvailable(ctx, client, o.N); err != nil {
			return nil, fmt.Errorf("%w (binder log: %s)", err, binder.LogPath)
		}
	}

	// The apiserver may close a watch under load (a slow reader); the retry
	// watcher resumes from the last resourceVersion without losing events.
	list, err := client.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	w, err := watchtools.NewRetryWatcherWithContext(ctx, list.ResourceVersion, &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return client.CoreV1().PersistentVolumeClaims(ns).Watch(ctx, opts)
		},
	})
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	created := make([]time.Time, o.N)
	var createdMu sync.Mutex

	fmt.Fprintf(o.Out, "creating %d claims and waiting until all are Bound...\n", o.N)
	start := time.Now()
	profiles := make(chan error, 2)
	if o.ProfileDir != "" && o.KCM == "" {
		seconds := max(2, o.N/300)
		go func() { profiles <- profile(ctx, binderDebug, filepath.Join(o.ProfileDir, "binder.pprof"), seconds) }()
		go func() { profiles <- profile(ctx, watcherDebug, filepath.Join(o.ProfileDir, "watcher.pprof"), seconds) }()
	} else {
		profiles <- nil
		profiles <- nil
	}
	createErr := make(chan error, 1)
	go func() {
		createErr <- parallel(ctx, o.N, o.Clients, func(i int) error {
			createdMu.Lock()
			created[i] = time.Now()
			createdMu.Unlock()
			_, err := client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, claim(ns, i), metav1.CreateOptions{})
			return err
		})
	}()
	var createWindow time.Duration
	latencies := make([]time.Duration, 0, o.N)
	boundSeen := map[string]bool{}
	timeout := time.After(time.Duration(o.N)*100*time.Millisecond + 2*time.Minute)
	for len(boundSeen) < o.N {
		select {
		case err := <-createErr:
			if err != nil {
				return nil, fmt.Errorf("create claims: %w", err)
			}
			createWindow = time.Since(start)
			createErr = nil
		case ev, ok := <-w.ResultChan():
			if !ok {
				return nil, errors.New("claim watch closed")
			}
			if ev.Type != watch.Modified && ev.Type != watch.Added {
				continue
			}
			c, ok := ev.Object.(*corev1.PersistentVolumeClaim)
			if !ok || c.Status.Phase != corev1.ClaimBound || boundSeen[c.Name] {
				continue
			}
			now := time.Now()
			boundSeen[c.Name] = true
			i, _ := strconv.Atoi(strings.TrimPrefix(c.Name, "claim-"))
			createdMu.Lock()
			latencies = append(latencies, now.Sub(created[i]))
			createdMu.Unlock()
		case <-timeout:
			return nil, fmt.Errorf("only %d of %d claims Bound before the timeout (binder log: %s)", len(boundSeen), o.N, binder.LogPath)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	elapsed := time.Since(start)
	sort.Slice(latencies, func(i, j int) bool { return latencies[i] < latencies[j] })
	r := &Result{
		N:                  o.N,
		Elapsed:            elapsed,
		BindsPerSecond:     float64(o.N) / elapsed.Seconds(),
		P50:                latencies[len(latencies)/2],
		P99:                latencies[(len(latencies)*99)/100],
		Max:                latencies[len(latencies)-1],
		CreateClaimsWindow: createWindow,
	}
	for range 2 {
		if err := <-profiles; err != nil {
			fmt.Fprintf(o.Out, "profile: %v\n", err)
		}
	}
	if o.ProfileDir != "" && o.KCM == "" {
		for name, addr := range map[string]string{"binder": binderDebug, "watcher": watcherDebug} {
			if err := fetch(ctx, "http://"+addr+"/debug/pprof/heap", filepath.Join(o.ProfileDir, name+".heap")); err != nil {
				fmt.Fprintf(o.Out, "heap profile: %v\n", err)
			}
		}
	}
	r.Binder = "volplane"
	if o.KCM != "" {
		r.Binder = "kube-controller-manager"
	}
	if o.ExternalProvisioner != "" {
		r.Binder = "kube-controller-manager + external-provisioner"
	}
	r.BinderPeakRSS, r.BinderCPU = binder.Usage()
	if watcher != nil {
		r.WatcherPeakRSS, r.WatcherCPU = watcher.Usage()
	}
	if o.Dynamic {
		r.Dynamic = true
		r.ProvisionerPeakRSS, r.ProvisionerCPU = provisioner.Usage()
		_, r.DriverCPU = driver.Usage()
	}
	return r, nil
}

// Print writes the result as the README shows it.
func (r *Result) Print(w io.Writer) {
	fmt.Fprintf(w, "binder:                %s\n", r.Binder)
	if r.Dynamic {
		fmt.Fprintf(w, "mode:                  dynamic provisioning (dev CSI driver)\n")
		fmt.Fprintf(w, "claims:                %d\n", r.N)
	} else {
		fmt.Fprintf(w, "mode:                  static binding\n")
		fmt.Fprintf(w, "pairs:                 %d\n", r.N)
	}
	fmt.Fprintf(w, "elapsed:               %s (claims created within %s)\n", r.Elapsed.Round(time.Millisecond), r.CreateClaimsWindow.Round(time.Millisecond))
	if r.Dynamic {
		fmt.Fprintf(w, "volumes/s:             %.1f\n", r.BindsPerSecond)
	} else {
		fmt.Fprintf(w, "binds/s:               %.1f\n", r.BindsPerSecond)
	}
	fmt.Fprintf(w, "create-to-Bound p50:   %s\n", r.P50.Round(time.Millisecond))
	fmt.Fprintf(w, "create-to-Bound p99:   %s\n", r.P99.Round(time.Millisecond))
	fmt.Fprintf(w, "create-to-Bound max:   %s\n", r.Max.Round(time.Millisecond))
	fmt.Fprintf(w, "binder peak RSS:       %.1f MiB\n", float64(r.BinderPeakRSS)/(1<<20))
	fmt.Fprintf(w, "binder CPU time:       %s\n", r.BinderCPU.Round(time.Millisecond))
	if r.Binder == "volplane" {
		fmt.Fprintf(w, "watcher CPU time:      %s\n", r.WatcherCPU.Round(time.Millisecond))
		fmt.Fprintf(w, "watcher peak RSS:      %.1f MiB\n", float64(r.WatcherPeakRSS)/(1<<20))
	}
	if r.Dynamic {
		fmt.Fprintf(w, "provisioner CPU time:  %s\n", r.ProvisionerCPU.Round(time.Millisecond))
		fmt.Fprintf(w, "provisioner peak RSS:  %.1f MiB\n", float64(r.ProvisionerPeakRSS)/(1<<20))
		fmt.Fprintf(w, "CSI driver CPU time:   %s\n", r.DriverCPU.Round(time.Millisecond))
	}
}

// startProvisioning runs the dev CSI driver and a provisioner serving it
// (volplane's, or csi-provisioner when externalProvisioner names its
// binary, with client QPS qps), and waits until the provisioner is ready.
// addr is volplane's provisioner's address, "" for csi-provisioner.
func startProvisioning(ctx context.Context, dir, binDir string, env *devenv.Env, certs map[string]grpcutil.TLSFiles, externalProvisioner string, qps int) (driver, provisioner *devenv.Process, addr string, err error) {
	path := filepath.Join(dir, "csi.sock")
	sock := "unix://" + path
	driver, err = devenv.StartProcess(dir, "volplane-csi", filepath.Join(binDir, "volplane-csi"),
		"--endpoint", sock, "--root-dir", filepath.Join(dir, "csi"), "--node-id", "bench-node", "--log-level", "warn")
	if err != nil {
		return nil, nil, "", err
	}
	if err := devenv.WaitCSIServing(ctx, sock, time.Minute); err != nil {
		driver.Stop()
		return nil, nil, "", fmt.Errorf("dev CSI driver: %w (log: %s)", err, driver.LogPath)
	}
	if externalProvisioner != "" {
		if qps <= 0 {
			qps = 5 // csi-provisioner's default
		}
		provisioner, err = devenv.StartProcess(dir, "csi-provisioner", externalProvisioner,
			"--csi-address", path, "--kubeconfig", env.Kubeconfig, "--leader-election=false",
			"--kube-api-qps", strconv.Itoa(qps), "--kube-api-burst", strconv.Itoa(qps), "--v=1")
		if err != nil {
			driver.Stop()
			return nil, nil, "", err
		}
		return driver, provisioner, "", nil
	}
	if addr, err = devenv.FreeAddr(); err != nil {
		driver.Stop()
		return nil, nil, "", err
	}
	provisioner, err = devenv.StartProcess(dir, "provisioner", filepath.Join(binDir, "provisioner"),
		append([]string{"--kubeconfig", env.Kubeconfig, "--etcd-endpoints", strings.Join(env.EtcdEndpoints, ","),
			"--listen", addr, "--csi-endpoint", sock, "--log-level", "warn"}, devenv.TLSArgs(certs["provisioner"])...)...)
	if err != nil {
		driver.Stop()
		return nil, nil, "", err
	}
	if err := devenv.WaitServing(ctx, addr, "", certs["bench"], 2*time.Minute); err != nil {
		provisioner.Stop()
		driver.Stop()
		return nil, nil, "", fmt.Errorf("provisioner: %w (logs: %s, %s)", err, provisioner.LogPath, driver.LogPath)
	}
	return driver, provisioner, addr, nil
}

func volume(i int) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bench-pv-%06d", i)},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              "bench",
			PersistentVolumeSource: corev1.PersistentVolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: fmt.Sprintf("/tmp/bench/%d", i)},
			},
		},
	}
}

func claim(ns string, i int) *corev1.PersistentVolumeClaim {
	cls := "bench"
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("claim-%d", i)},
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

// waitVolumesAvailable waits until n volumes are Available.
func waitVolumesAvailable(ctx context.Context, client kubernetes.Interface, n int) error {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		list, err := client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{ResourceVersion: "0"})
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
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// startKCM runs kube-controller-manager with only its PV binder.
func startKCM(dir, bin, kubeconfig string, qps int) (*devenv.Process, error) {
	if qps <= 0 {
		qps = 20 // kube-controller-manager's default
	}
	return devenv.StartProcess(dir, "kube-controller-manager", bin,
		"--kubeconfig", kubeconfig,
		"--controllers", "persistentvolume-binder-controller",
		"--kube-api-qps", strconv.Itoa(qps), "--kube-api-burst", strconv.Itoa(qps),
		"--kube-api-content-type", "application/vnd.kubernetes.protobuf",
		"--leader-elect=false", "--secure-port=0", "--v=1")
}

// profile saves a CPU profile of the process serving pprof at addr.
func profile(ctx context.Context, addr, path string, seconds int) error {
	return fetch(ctx, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, seconds), path)
}

// fetch saves what url answers into path.
func fetch(ctx context.Context, url, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
