package devenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/volplane/volplane/pkg/grpcutil"
)

// Process is a child process (a volplane service binary) with its output
// in a log file.
type Process struct {
	Name    string
	LogPath string
	cmd     *exec.Cmd
	done    chan struct{}
}

// StartProcess starts bin with args, its output going to dir/<name>.log.
// The child is in its own process group and is killed if this process
// dies.
func StartProcess(dir, name, bin string, args ...string) (*Process, error) {
	return StartProcessEnv(dir, name, bin, nil, args...)
}

// StartProcessEnv is StartProcess with env (KEY=value) added to this
// process's environment.
func StartProcessEnv(dir, name, bin string, env []string, args ...string) (*Process, error) {
	return StartProcessOn(dir, name, bin, nil, env, args...)
}

// StartProcessOn is StartProcessEnv with the process confined to cpus
// (any CPU when empty).
func StartProcessOn(dir, name, bin string, cpus CPUSet, env []string, args ...string) (*Process, error) {
	logPath := filepath.Join(dir, name+".log")
	lf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	p := &Process{Name: name, LogPath: logPath, cmd: cmd, done: make(chan struct{})}
	if err := startOn(cpus, cmd, func() { lf.Close(); close(p.done) }); err != nil {
		lf.Close()
		return nil, fmt.Errorf("start %s (run `make build` first): %w", bin, err)
	}
	return p, nil
}

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// ExitStatus describes how the process ended ("" while it runs).
func (p *Process) ExitStatus() string {
	select {
	case <-p.done:
		return p.cmd.ProcessState.String()
	default:
		return ""
	}
}

// Stop sends SIGTERM and waits up to 10s, then kills the process.
func (p *Process) Stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// Usage reads the process's peak RSS (VmHWM) and user+system CPU time
// from /proc; it must be called before the process exits.
func (p *Process) Usage() (peakRSS int64, cpu time.Duration) {
	pid := p.cmd.Process.Pid
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmHWM:" {
				kb, _ := strconv.ParseInt(f[1], 10, 64)
				peakRSS = kb << 10
			}
		}
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
		s := string(b)
		if i := strings.LastIndexByte(s, ')'); i > 0 {
			f := strings.Fields(s[i+1:])
			if len(f) > 12 {
				ut, _ := strconv.ParseInt(f[11], 10, 64)
				st, _ := strconv.ParseInt(f[12], 10, 64)
				cpu = time.Duration(ut+st) * time.Second / 100 // USER_HZ is 100 on Linux
			}
		}
	}
	return peakRSS, cpu
}

// PIDUsage reads a process's resident memory now (VmRSS) and its user and
// system CPU time so far, from /proc.
func PIDUsage(pid int) (rss int64, cpu time.Duration, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			rss = kb << 10
		}
	}
	if b, err = os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err != nil {
		return 0, 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	f := strings.Fields(s[i+1:])
	if i < 0 || len(f) <= 12 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return rss, time.Duration(ut+st) * time.Second / 100, nil // USER_HZ is 100 on Linux
}

// WaitServing waits until the volplane service at addr, dialled with tls,
// reports SERVING for service ("" is the whole server).
func WaitServing(ctx context.Context, addr, service string, tls grpcutil.TLSFiles, timeout time.Duration) error {
	cc, err := grpcutil.Dial(addr, tls)
	if err != nil {
		return err
	}
	return waitServing(ctx, cc, addr, service, timeout)
}

// WaitCSIServing waits until the CSI driver at addr (plaintext, usually a
// unix socket) reports SERVING on its health service.
func WaitCSIServing(ctx context.Context, addr string, timeout time.Duration) error {
	cc, err := grpcutil.DialCSI(addr)
	if err != nil {
		return err
	}
	return waitServing(ctx, cc, addr, "", timeout)
}

func waitServing(ctx context.Context, cc *grpc.ClientConn, addr, service string, timeout time.Duration) error {
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	deadline := time.Now().Add(timeout)
	last := "no answer"
	for time.Now().Before(deadline) {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		resp, err := hc.Check(cctx, &healthpb.HealthCheckRequest{Service: service})
		cancel()
		if err == nil && resp.Status == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		if err != nil {
			last = err.Error()
		} else {
			last = resp.Status.String()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s not SERVING within %s: %s", addr, timeout, last)
}

// PID is the child's process ID (also its process group ID).
func (p *Process) PID() int { return p.cmd.Process.Pid }

// TLSArgs are the command-line flags that give a volplane service the
// certificate files f.
func TLSArgs(f grpcutil.TLSFiles) []string {
	return []string{"--tls-ca-file", f.CAFile, "--tls-cert-file", f.CertFile, "--tls-key-file", f.KeyFile}
}
