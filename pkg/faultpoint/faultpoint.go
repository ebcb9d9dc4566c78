package faultpoint

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// EnvVar names the fault points a process exits at.
const EnvVar = "VOLPLANE_FAULTPOINT"

// ExitCode is the exit status of a process stopped at a fault point,
// distinct from any exit a service makes on its own (0, 1 and 2), from a
// signal's (128+n) and from Go's panic (2).
const ExitCode = 86

// The fault points placed in volplane's services. Each names the step
// just taken and the one not yet taken.
const (
	// ProvisionerAfterCreateVolume: the CSI volume exists, its
	// PersistentVolume does not; the provisioning journal record is open.
	ProvisionerAfterCreateVolume = "provisioner/after-create-volume"
	// ProvisionerAfterSaveVolume: the PersistentVolume exists; the
	// provisioning journal record is not ended yet.
	ProvisionerAfterSaveVolume = "provisioner/after-save-volume"
	// BinderAfterClaimRef: the volume's claimRef names the claim; the
	// volume's phase is not Bound yet and the claim not bound to it.
	BinderAfterClaimRef = "binder/after-claim-ref"
	// ReclaimerAfterScrub: a Recycle scrubbed the volume's directory;
	// the reclaim record does not say so yet and the volume is not
	// Available.
	ReclaimerAfterScrub = "reclaimer/after-scrub"
	// ReclaimerBeforeDeleteVolume: a Delete journaled that the deletion
	// of the backing volume begins (the reclaim record holds the volume);
	// the provisioner was not asked yet.
	ReclaimerBeforeDeleteVolume = "reclaimer/before-delete-volume"
	// ReclaimerAfterDeleteVolume: a Delete removed the backing volume
	// through the provisioner; the PersistentVolume still exists.
	ReclaimerAfterDeleteVolume = "reclaimer/after-delete-volume"
)

// Points lists every fault point placed in the services.
var Points = []string{
	ProvisionerAfterCreateVolume,
	ProvisionerAfterSaveVolume,
	BinderAfterClaimRef,
	ReclaimerAfterScrub,
	ReclaimerBeforeDeleteVolume,
	ReclaimerAfterDeleteVolume,
}

// armed is the points the process exits at, nil when none: read once.
var armed = parse(os.Getenv(EnvVar))

// exit ends the process; a variable so the package's tests can see it.
var exit = os.Exit

type point struct {
	at   int // the hit that exits, from 1
	hits int
}

type set struct {
	mu     sync.Mutex
	points map[string]*point
}

// parse reads the variable's value: name[:N], comma separated. Malformed
// entries are reported on stderr and skipped.
func parse(v string) *set {
	if strings.TrimSpace(v) == "" {
		return nil
	}
	s := &set{points: map[string]*point{}}
	for _, f := range strings.Split(v, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		name, at := f, 1
		if i := strings.LastIndexByte(f, ':'); i >= 0 {
			n, err := strconv.Atoi(f[i+1:])
			if err != nil || n < 1 {
				fmt.Fprintf(os.Stderr, "%s: %q: the hit count after ':' must be a number from 1; ignored\n", EnvVar, f)
				continue
			}
			name, at = f[:i], n
		}
		if !slices.Contains(Points, name) {
			fmt.Fprintf(os.Stderr, "%s: %q is not a known fault point (known: %s)\n", EnvVar, name, strings.Join(Points, ", "))
		}
		s.points[name] = &point{at: at}
	}
	if len(s.points) == 0 {
		return nil
	}
	return s
}

// Hit marks that the step name was reached. When VOLPLANE_FAULTPOINT names
// it, the named hit exits the process with ExitCode at once.
func Hit(name string) {
	if armed == nil {
		return
	}
	armed.hit(name)
}

func (s *set) hit(name string) {
	s.mu.Lock()
	p := s.points[name]
	if p == nil {
		s.mu.Unlock()
		return
	}
	p.hits++
	n := p.hits
	s.mu.Unlock()
	if n == p.at {
		fmt.Fprintf(os.Stderr, "%s: exiting at %s (hit %d) with status %d\n", EnvVar, name, n, ExitCode)
		exit(ExitCode)
	}
}
