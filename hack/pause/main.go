// Command pause is the process of every pod sandbox of the local cluster
// (make cluster): it holds the pod's namespaces, reaps the zombies it
// inherits as the pod's PID 1, and exits 0 on SIGTERM or SIGINT. It is
// static and packed FROM scratch (hack/cluster/images.sh) because no
// registry serves the usual pause image here.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		reap()
	}
}

// reap collects every exited child without blocking.
func reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
