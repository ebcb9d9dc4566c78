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

// The layout under Options.RootDir. The state is one small JSON file per
// object under state/ (volumes/<id>.json, snapshots/<id>.json,
// publications/<hash of the target>.json), so a change writes one object,
// whatever the number of volumes. state.json is the older single-file
// layout, still read (and converted) at start.
const (
	legacyStateFile = "state.json"
	stateDir        = "state"
	volumesDir      = "volumes"
	snapshotsDir    = "snapshots"
	publicationsDir = "publications"
	tmpSuffix       = ".tmp"
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

// state is everything the driver keeps, each object persisted as JSON when
// it changes (saveVolume, saveSnapshot, savePublication). Driver.mu guards
// it.
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
	for _, kind := range []string{volumesDir, snapshotsDir, publicationsDir} {
		if err := os.MkdirAll(filepath.Join(root, stateDir, kind), 0o755); err != nil {
			return nil, fmt.Errorf("create %s/%s: %w", stateDir, kind, err)
		}
	}
	if err := loadRecords(root, volumesDir, func(v *volume) { st.Volumes[v.ID] = v }); err != nil {
		return nil, err
	}
	if err := loadRecords(root, snapshotsDir, func(sn *snapshot) { st.Snapshots[sn.ID] = sn }); err != nil {
		return nil, err
	}
	if err := loadRecords(root, publicationsDir, func(p *publication) { st.Publications[p.TargetPath] = p }); err != nil {
		return nil, err
	}
	if err := st.convertLegacy(root); err != nil {
		return nil, err
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

// convertLegacy folds a single-file state.json of an older driver into the
// per-object layout and removes it.
func (s *state) convertLegacy(root string) error {
	p := filepath.Join(root, legacyStateFile)
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read state: %w", err)
	}
	old := newState()
	if err := json.Unmarshal(b, old); err != nil {
		return fmt.Errorf("read state %s: %w", p, err)
	}
	for id, v := range old.Volumes {
		s.Volumes[id] = v
		if err := s.saveVolume(root, id); err != nil {
			return err
		}
	}
	for id, sn := range old.Snapshots {
		s.Snapshots[id] = sn
		if err := s.saveSnapshot(root, id); err != nil {
			return err
		}
	}
	for t, pub := range old.Publications {
		s.Publications[t] = pub
		if err := s.savePublication(root, t); err != nil {
			return err
		}
	}
	return os.Remove(p)
}

// loadRecords reads every <kind>/*.json under the state directory into put;
// temporary files of a write cut short are removed.
func loadRecords[T any](root, kind string, put func(*T)) error {
	dir := filepath.Join(root, stateDir, kind)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read %s: %w", dir, err)
	}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if !strings.HasSuffix(e.Name(), ".json") {
			_ = os.Remove(p)
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return fmt.Errorf("read state: %w", err)
		}
		v := new(T)
		if err := json.Unmarshal(b, v); err != nil {
			return fmt.Errorf("read state %s: %w", p, err)
		}
		put(v)
	}
	return nil
}

// saveVolume, saveSnapshot and savePublication persist one object as it is
// in the state now: written when present, removed when gone.
func (s *state) saveVolume(root, id string) error {
	return saveRecord(root, volumesDir, id, s.Volumes[id])
}

func (s *state) saveSnapshot(root, id string) error {
	return saveRecord(root, snapshotsDir, id, s.Snapshots[id])
}

func (s *state) savePublication(root, target string) error {
	return saveRecord(root, publicationsDir, hashID("pub-", target), s.Publications[target])
}

// saveRecord writes v atomically (a temporary file renamed over the old
// one, so a crashed driver finds the old object or the new, never half of
// one), or removes the file when v is nil. It is not fsynced: a dev driver
// survives its own crash, not the machine's, and a sync per call would make
// it the slowest part of every provisioning benchmark.
func saveRecord[T any](root, kind, key string, v *T) error {
	p := filepath.Join(root, stateDir, kind, key+".json")
	if v == nil {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("save state: %w", err)
		}
		return nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode state: %w", err)
	}
	tmp := p + tmpSuffix
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("save state: %w", err)
	}
	if err := os.Rename(tmp, p); err != nil {
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
