package devcsi

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"
)

// The layout under Options.RootDir.
const (
	stateFile    = "state.json"
	volumesDir   = "volumes"
	snapshotsDir = "snapshots"
	tmpSuffix    = ".tmp"
)

// volume is one volume as the state file records it.
type volume struct {
	ID            string            `json:"id"`
	Name          string            `json:"name"`
	CapacityBytes int64             `json:"capacityBytes"`
	Node          string            `json:"node"` // the topology segment's node
	Parameters    map[string]string `json:"parameters,omitempty"`
	// At most one of these: the content source it was made from.
	SourceVolumeID   string    `json:"sourceVolumeId,omitempty"`
	SourceSnapshotID string    `json:"sourceSnapshotId,omitempty"`
	CreatedAt        time.Time `json:"createdAt"`
}

// snapshot is one snapshot: a copy of a volume's directory.
type snapshot struct {
	ID             string            `json:"id"`
	Name           string            `json:"name"`
	SourceVolumeID string            `json:"sourceVolumeId"`
	SizeBytes      int64             `json:"sizeBytes"`
	Parameters     map[string]string `json:"parameters,omitempty"`
	CreatedAt      time.Time         `json:"createdAt"`
}

// publication is a volume published at a target path on this node.
type publication struct {
	VolumeID   string      `json:"volumeId"`
	TargetPath string      `json:"targetPath"`
	Readonly   bool        `json:"readonly"`
	Mode       PublishMode `json:"mode"`
	AccessMode int32       `json:"accessMode"` // csi.VolumeCapability_AccessMode_Mode
}

// state is everything the driver keeps, persisted as JSON after every
// change. Driver.mu guards it.
type state struct {
	Volumes      map[string]*volume      `json:"volumes"`      // by ID
	Snapshots    map[string]*snapshot    `json:"snapshots"`    // by ID
	Publications map[string]*publication `json:"publications"` // by target path
}

func newState() *state {
	return &state{Volumes: map[string]*volume{}, Snapshots: map[string]*snapshot{}, Publications: map[string]*publication{}}
}

// IDs are derived from names so that they are stable: the same name always
// gets the same ID, across restarts and after a delete.
var (
	volumeIDPattern   = regexp.MustCompile(`^vol-[0-9a-f]{32}$`)
	snapshotIDPattern = regexp.MustCompile(`^snap-[0-9a-f]{32}$`)
)

func hashID(prefix, name string) string {
	sum := sha256.Sum256([]byte(name))
	return prefix + hex.EncodeToString(sum[:16])
}

func volumeID(name string) string   { return hashID("vol-", name) }
func snapshotID(name string) string { return hashID("snap-", name) }

func (s *state) volumeByName(name string) *volume {
	return s.Volumes[volumeID(name)]
}

func (s *state) snapshotByName(name string) *snapshot {
	return s.Snapshots[snapshotID(name)]
}

// usedBytes is the capacity given out to volumes.
func (s *state) usedBytes() int64 {
	var n int64
	for _, v := range s.Volumes {
		n += v.CapacityBytes
	}
	return n
}

// sortedVolumeIDs and sortedSnapshotIDs give listings a stable order, which
// paging relies on.
func (s *state) sortedVolumeIDs() []string   { return slices.Sorted(maps.Keys(s.Volumes)) }
func (s *state) sortedSnapshotIDs() []string { return slices.Sorted(maps.Keys(s.Snapshots)) }

// loadState reads root's state file (an absent file is an empty state) and
// removes directories under volumes/ and snapshots/ that the state does not
// know: the leftovers of a copy or a delete cut short by a crash.
func loadState(root string, log *slog.Logger) (*state, error) {
	for _, d := range []string{volumesDir, snapshotsDir} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return nil, fmt.Errorf("create %s: %w", d, err)
		}
	}
	st := newState()
	b, err := os.ReadFile(filepath.Join(root, stateFile))
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("read state: %w", err)
	default:
		if err := json.Unmarshal(b, st); err != nil {
			return nil, fmt.Errorf("read state %s: %w", filepath.Join(root, stateFile), err)
		}
		if st.Volumes == nil {
			st.Volumes = map[string]*volume{}
		}
		if st.Snapshots == nil {
			st.Snapshots = map[string]*snapshot{}
		}
		if st.Publications == nil {
			st.Publications = map[string]*publication{}
		}
	}
	for _, d := range []struct {
		dir   string
		known func(string) bool
	}{
		{volumesDir, func(id string) bool { return st.Volumes[id] != nil }},
		{snapshotsDir, func(id string) bool { return st.Snapshots[id] != nil }},
	} {
		entries, err := os.ReadDir(filepath.Join(root, d.dir))
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", d.dir, err)
		}
		for _, e := range entries {
			if d.known(e.Name()) {
				continue
			}
			p := filepath.Join(root, d.dir, e.Name())
			log.Info("removing a directory the state does not know (left by an interrupted operation)", "path", p)
			if err := os.RemoveAll(p); err != nil {
				return nil, fmt.Errorf("remove leftover %s: %w", p, err)
			}
		}
	}
	for id := range st.Volumes {
		if err := os.MkdirAll(filepath.Join(root, volumesDir, id), 0o777); err != nil {
			return nil, fmt.Errorf("volume %s: %w", id, err)
		}
	}
	return st, nil
}

// save writes the state atomically: a temporary file renamed over the old
// one, so a crashed driver finds the old state or the new, never half of
// one. It is not fsynced: a dev driver survives its own crash, not the
// machine's, and a sync per call would make it the slowest part of every
// provisioning benchmark.
func (s *state) save(root string) error {
	b, err := json.Marshal(s)
	if err != nil {
		return fmt.Errorf("encode state: %w", err)
	}
	p := filepath.Join(root, stateFile)
	tmp := p + tmpSuffix
	f, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	_, err = f.Write(append(b, '\n'))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, p)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("save state: %w", err)
	}
	return nil
}

// copyTree copies the directory src to dst (which must not exist) through a
// temporary directory renamed into place at the end, so dst never holds a
// partial copy. Regular files, directories and symbolic links are copied
// with their permission bits; other files (sockets, devices) are skipped.
func copyTree(src, dst string) error {
	tmp := dst + tmpSuffix
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		to := filepath.Join(tmp, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return os.MkdirAll(to, info.Mode().Perm())
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(link, to)
		case d.Type().IsRegular():
			return copyFile(p, to, info.Mode().Perm())
		}
		return nil
	})
	if err == nil {
		err = os.Rename(tmp, dst)
	}
	if err != nil {
		_ = os.RemoveAll(tmp)
		return fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	return nil
}

func copyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := out.ReadFrom(in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// dirUsage is the bytes held by regular files under dir.
func dirUsage(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			info, err := d.Info()
			if err != nil {
				return err
			}
			n += info.Size()
		}
		return nil
	})
	return n, err
}

// validName rejects names that cannot be logged or stored sensibly.
func validName(s string) bool {
	return s != "" && !strings.ContainsRune(s, 0)
}
