package devcsi

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Several processes may share one root directory: in a cluster the
// controller part runs next to each provisioner replica and the node part
// in a DaemonSet pod, all with the node's data directory as a hostPath.
// Every call takes the root's lock, state/lock (flock(2): the kernel's,
// so it works across containers of one node), exclusively when it may
// change the state and shared when it only reads it. The lock file also
// holds a generation: a counter every process adds one to when it
// changed the state. A process that finds a generation other than the one
// it last saw reads the state from disk again; one that is alone on its
// root never has to, so a call costs the same with ten volumes or ten
// thousand.
const lockFileName = "lock"

// openLock opens (creating) the root's lock file.
func openLock(root string) (*os.File, error) {
	dir := filepath.Join(root, stateDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, lockFileName), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock file: %w", err)
	}
	return f, nil
}

// acquire takes d.mu and the root's lock, exclusive for a call that may
// change the state, and brings d.st up to date with what other processes
// wrote. The returned release counts this call's changes in the
// generation (telling the other processes to read them) and unlocks.
func (d *Driver) acquire(exclusive bool) (release func(), err error) {
	d.mu.Lock()
	if err := flock(d.lockf, exclusive, false); err != nil {
		d.mu.Unlock()
		return nil, status.Errorf(codes.Internal, "lock %s: %v", d.lockf.Name(), err)
	}
	unlock := func() {
		if err := flock(d.lockf, false, true); err != nil {
			d.log.Warn("could not unlock the root directory", "file", d.lockf.Name(), "error", err)
		}
		d.mu.Unlock()
	}
	gen, err := readGeneration(d.lockf)
	if err == nil && (d.st == nil || gen != d.gen) {
		var st *state
		if st, err = readState(d.root); err == nil {
			d.st, d.gen = st, gen
		}
	}
	if err != nil {
		unlock()
		return nil, status.Errorf(codes.Internal, "read the state under %s: %v", d.root, err)
	}
	return func() {
		if d.st.dirty {
			d.st.dirty = false
			d.gen++
			if err := writeGeneration(d.lockf, d.gen); err != nil {
				// The others may then miss this change until the next one.
				d.log.Warn("could not count a change of the state", "file", d.lockf.Name(), "error", err)
			}
		}
		unlock()
	}, nil
}

// readGeneration reads the lock file's counter (0 in a new file). A write
// torn by a crash reads as some other number, which only makes every
// process read the state again.
func readGeneration(f *os.File) (uint64, error) {
	var b [8]byte
	n, err := f.ReadAt(b[:], 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return 0, fmt.Errorf("read %s: %w", f.Name(), err)
	}
	if n < len(b) {
		return 0, nil
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

func writeGeneration(f *os.File, gen uint64) error {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], gen)
	_, err := f.WriteAt(b[:], 0)
	return err
}
