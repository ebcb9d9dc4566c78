// Command kubectl-volplane is the kubectl plugin for volplane: put it on
// the PATH and run `kubectl volplane claims|volumes|drivers|operations|
// reclaims|orphans|explain|match`. It talks to volplane's REST gateway with
// the kubeconfig's credentials; see docs/kubectl-plugin.md.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/volplane/volplane/internal/kubectlplugin"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := kubectlplugin.Run(ctx, os.Args[1:], kubectlplugin.Streams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr})
	if err != nil {
		if kubectlplugin.IsUsage(err) {
			fmt.Fprintln(os.Stderr, "error:", err)
		} else {
			fmt.Fprintln(os.Stderr, err)
		}
		os.Exit(1)
	}
}
