// Command kubectl-volplane is the kubectl plugin for volplane: put it on
// the PATH and run `kubectl volplane claims|volumes|drivers|operations|
// reclaims|orphans|explain|match|sync ...`. It talks to volplane's REST
// gateway with the kubeconfig's credentials; see docs/kubectl-plugin.md.
//
// Run as kubectl_complete-volplane (make build links that name to it), it
// answers kubectl's shell completion of `kubectl volplane ...`.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/cli-runtime/pkg/printers"

	"github.com/volplane/volplane/internal/kubectlplugin"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	s := kubectlplugin.Streams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr, Terminal: printers.IsTerminal(os.Stdin)}
	err := kubectlplugin.Run(ctx, kubectlplugin.Args(os.Args[0], os.Args[1:]), s)
	if err != nil {
		var refusal *kubectlplugin.Error
		if errors.As(err, &refusal) {
			fmt.Fprintln(os.Stderr, err) // "Error from gateway (403 Forbidden): ..."
		} else {
			fmt.Fprintln(os.Stderr, "error:", err)
		}
		os.Exit(1)
	}
}
