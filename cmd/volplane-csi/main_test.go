package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// The node plugin as its DaemonSet runs it: the process registers with the
// kubelet through the registration directory, exits 0 on SIGTERM (its
// sockets removed) and exits non-zero when the kubelet reports a failed
// registration, so that the kubelet restarts its container, as it does
// node-driver-registrar's.
func TestNodePluginProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "volplane-csi")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		name       string
		registered bool
		wantExit   int
	}{
		{"stopped by SIGTERM", true, 0},
		{"refused by the kubelet", false, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := t.TempDir()
			reg, sock := filepath.Join(d, "registry"), filepath.Join(d, "csi", "csi.sock")
			if err := os.Mkdir(reg, 0o755); err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			cmd := exec.Command(bin, "--mode=node", "--node-id=node-a", "--root-dir="+filepath.Join(d, "root"),
				"--endpoint=unix://"+sock, "--plugin-registration-dir="+reg,
				"--kubelet-registration-path=/var/lib/kubelet/plugins/hostpath.csi.volplane.io/csi.sock")
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			t.Cleanup(func() {
				_ = cmd.Process.Kill()
				if t.Failed() {
					t.Logf("volplane-csi's output:\n%s", out.String())
				}
			})

			regSock := filepath.Join(reg, "hostpath.csi.volplane.io-reg.sock")
			deadline := time.Now().Add(20 * time.Second)
			for {
				c, err := net.Dial("unix", regSock)
				if err == nil {
					c.Close()
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no registration socket: %v", err)
				}
				time.Sleep(20 * time.Millisecond)
			}
			cc, err := grpc.NewClient("unix://"+regSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			kubelet := registerapi.NewRegistrationClient(cc)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			info, err := kubelet.GetInfo(ctx, &registerapi.InfoRequest{})
			if err != nil || info.GetName() != "hostpath.csi.volplane.io" || info.GetEndpoint() != "/var/lib/kubelet/plugins/hostpath.csi.volplane.io/csi.sock" {
				t.Fatalf("GetInfo: %v %v", info, err)
			}
			status := &registerapi.RegistrationStatus{PluginRegistered: tc.registered}
			if !tc.registered {
				status.Error = "RegisterPlugin error -- no handler registered for plugin type: CSIPlugin"
			}
			if _, err := kubelet.NotifyRegistrationStatus(ctx, status); err != nil {
				t.Fatal(err)
			}
			if tc.registered {
				if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
					t.Fatal(err)
				}
			}
			var err2 error
			select {
			case err2 = <-exited:
			case <-time.After(30 * time.Second):
				t.Fatal("volplane-csi did not exit")
			}
			code := 0
			var ee *exec.ExitError
			if errors.As(err2, &ee) {
				code = ee.ExitCode()
			} else if err2 != nil {
				t.Fatal(err2)
			}
			if (code == 0) != (tc.wantExit == 0) {
				t.Fatalf("exit code %d, want %d", code, tc.wantExit)
			}
			for _, s := range []string{regSock, sock} {
				if _, err := os.Lstat(s); !os.IsNotExist(err) {
					t.Errorf("socket %s after exit: %v", s, err)
				}
			}
		})
	}
}
