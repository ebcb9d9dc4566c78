package chaos

import (
	"context"
	"fmt"
	"os/exec"
)

// Binaries are the packages of the binaries a cluster runs, as `make
// build` builds them.
var Binaries = []string{
	"github.com/volplane/volplane/services/watcher/cmd/watcher",
	"github.com/volplane/volplane/services/binder/cmd/binder",
	"github.com/volplane/volplane/services/provisioner/cmd/provisioner",
	"github.com/volplane/volplane/services/reclaimer/cmd/reclaimer",
	"github.com/volplane/volplane/gateway/cmd/gateway",
	"github.com/volplane/volplane/cmd/volplane-csi",
	"github.com/volplane/volplane/test/cmd/volplane-etcd",
}

// Build builds Binaries into dir with the go command, for tests that run
// a cluster without `make build`.
func Build(ctx context.Context, dir string) error {
	cmd := exec.CommandContext(ctx, "go", append([]string{"build", "-o", dir + "/"}, Binaries...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %w\n%s", err, out)
	}
	return nil
}
