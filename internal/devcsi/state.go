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
// publications/<hash of the target>.json, stagings/<hash of the node and
// the staging path>.json), so a change writes one object, whatever the
// number of volumes; state/lock serializes the processes sharing the root
// and counts their changes (store.go). state.json is the older single-file
// layout, still read (and converted) at start.
const (
	legacyStateFile = "state.json"
	stateDir        = "state"
	volumesDir      = "volumes"
	snapshotsDir    = "snapshots"
	publicationsDir = "publications"
	stagingsDir     = "stagings"
	tmpSuffix       = ".tmp"
)

// volume is one volume as the state file records it.
type volume struct {
	ID            string            `json:"id"`
	Name          string            `json:"name"`
	CapacityBytes int64             `json:"capacityBytes"`
	Node          string            `json:"node"` // the topology segment's node
	Parameters    map[string]string `json:"parameters,omitempty"`
	// MutableParameters are those of CreateVolume (a
	// VolumeAttributesClass's), then of the last ControllerModifyVolume.
	MutableParameters map[string]string `json:"mutableParameters,omitempty"`
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

// publication is a volume published at a target path on a node.
type publication struct {
	VolumeID   string      `json:"volumeId"`
	TargetPath string      `json:"targetPath"`
	Readonly   bool        `json:"readonly"`
	Mode       PublishMode `json:"mode"`
	AccessMode int32       `json:"accessMode"` // csi.VolumeCapability_AccessMode_Mode
	// Node is the node ID of the driver that published it (empty in
	// records of older drivers: the node of the driver reading them).
	Node string `json:"node,omitempty"`
	// StagingPath is where the volume was staged and published from;
	// empty when it was published from its directory without staging.
	StagingPath string `json:"stagingPath,omitempty"`
}

// staging is a volume staged on a node: its directory bind-mounted on the
// staging path, which every publication of it on that node then binds.
type staging struct {
	VolumeID    string      `json:"volumeId"`
	Node        string      `json:"node"`
	StagingPath string      `json:"stagingPath"`
	Readonly    bool        `json:"readonly"`
	Mode        PublishMode `json:"mode"`
	AccessMode  int32       `json:"accessMode"`
}

// placeKey names a staging: staging paths are per volume, the same on
// every node (the kubelet derives them from the volume handle), so a root
// shared by several nodes keys them by node too.
type placeKey struct{ node, path string }

// state is everything the driver keeps, each object persisted as JSON when
// it changes (saveVolume, saveSnapshot, savePublication, saveStaging).
// Driver.mu and the root's lock guard it.
type state struct {
	Volumes      map[string]*volume      `json:"volumes"`      // by ID
	Snapshots    map[string]*snapshot    `json:"snapshots"`    // by ID
	Publications map[string]*publication `json:"publications"` // by target path
	Stagings     map[placeKey]*staging   `json:"-"`
	// dirty says an object was written since the root's generation was
	// last counted up (Driver.acquire's release does it).
	dirty bool
}

func newState() *state {
	return &state{Volumes: map[string]*volume{}, Snapshots: map[string]*snapshot{}, Publications: map[string]*publication{},
		Stagings: map[placeKey]*staging{}}
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

// readState reads every record under root's state directory (a missing
// directory is an empty one). It changes nothing on disk: other processes
// may be using the root (Driver.acquire holds its lock).
func readState(root string) (*state, error) {
	st := newState()
	if err := loadRecords(root, volumesDir, func(v *volume) { st.Volumes[v.ID] = v }); err != nil {
		return nil, err
	}
	if err := loadRecords(root, snapshotsDir, func(sn *snapshot) { st.Snapshots[sn.ID] = sn }); err != nil {
		return nil, err
	}
	if err := loadRecords(root, publicationsDir, func(p *publication) { st.Publications[p.TargetPath] = p }); err != nil {
		return nil, err
	}
	if err := loadRecords(root, stagingsDir, func(s *staging) { st.Stagings[placeKey{s.Node, s.StagingPath}] = s }); err != nil {
		return nil, err
	}
	return st, nil
}

// prepareRoot makes root's directories, removes what writes cut short by
// a crash left (temporary files under state/, directories under volumes/
// and snapshots/ the state does not know: an interrupted copy or delete),
// converts an older state.json and makes the directory of every volume
// that lacks one. The root's lock must be held exclusively: with it, no
// other process is between making a directory and recording it.
func (s *state) prepareRoot(root string, log *slog.Logger) error {
	for _, d := range []string{volumesDir, snapshotsDir} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return fmt.Errorf("create %s: %w", d, err)
		}
	}
	for _, kind := range []string{volumesDir, snapshotsDir, publicationsDir, stagingsDir} {
		dir := filepath.Join(root, stateDir, kind)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("create %s/%s: %w", stateDir, kind, err)
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			return fmt.Errorf("read %s: %w", dir, err)
		}
		for _, e := range entries {
			if !strings.HasSuffix(e.Name(), ".json") {
				_ = os.Remove(filepath.Join(dir, e.Name()))
			}
		}
	}
	if err := s.convertLegacy(root); err != nil {
		return err
	}
	for _, d := range []struct {
		dir   string
		known func(string) bool
	}{
		{volumesDir, func(id string) bool { return s.Volumes[id] != nil }},
		{snapshotsDir, func(id string) bool { return s.Snapshots[id] != nil }},
	} {
		entries, err := os.ReadDir(filepath.Join(root, d.dir))
		if err != nil {
			return fmt.Errorf("read %s: %w", d.dir, err)
		}
		for _, e := range entries {
			if d.known(e.Name()) {
				continue
			}
			p := filepath.Join(root, d.dir, e.Name())
			log.Info("removing a directory the state does not know (left by an interrupted operation)", "path", p)
			if err := os.RemoveAll(p); err != nil {
				return fmt.Errorf("remove leftover %s: %w", p, err)
			}
		}
	}
	for id := range s.Volumes {
		if err := os.MkdirAll(filepath.Join(root, volumesDir, id), 0o777); err != nil {
			return fmt.Errorf("volume %s: %w", id, err)
		}
	}
	return nil
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

// loadRecords reads every <kind>/*.json under the state directory into put
// (other files are temporary files of writes, left alone).
func loadRecords[T any](root, kind string, put func(*T)) error {
	dir := filepath.Join(root, stateDir, kind)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", dir, err)
	}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if !strings.HasSuffix(e.Name(), ".json") {
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

// saveVolume, saveSnapshot, savePublication and saveStaging persist one
// object as it is in the state now: written when present, removed when
// gone. The root's lock must be held exclusively.
func (s *state) saveVolume(root, id string) error {
	s.dirty = true
	return saveRecord(root, volumesDir, id, s.Volumes[id])
}

func (s *state) saveSnapshot(root, id string) error {
	s.dirty = true
	return saveRecord(root, snapshotsDir, id, s.Snapshots[id])
}

func (s *state) savePublication(root, target string) error {
	s.dirty = true
	return saveRecord(root, publicationsDir, hashID("pub-", target), s.Publications[target])
}

func (s *state) saveStaging(root string, k placeKey) error {
	s.dirty = true
	return saveRecord(root, stagingsDir, hashID("stage-", k.node+"\x00"+k.path), s.Stagings[k])
}

// saveRecord writes v atomically (a temporary file of its own renamed over
// the old one, so a crashed driver, or another process reading the root,
// finds the old object or the new, never half of one), or removes the file
// when v is nil. It is not fsynced: a dev driver survives its own crash,
// not the machine's, and a sync per call would make it the slowest part of
// every provisioning benchmark.
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
	f, err := os.CreateTemp(filepath.Dir(p), key+".json"+tmpSuffix+"-*")
	if err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	_, err = f.Write(append(b, '\n'))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(f.Name(), p)
	}
	if err != nil {
		_ = os.Remove(f.Name())
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

// dirUsage is the bytes held by regular files under dir (du's apparent
// size) and the number of files and directories there (its inodes).
func dirUsage(dir string) (bytes, entries int64, err error) {
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		entries++
		if d.Type().IsRegular() {
			info, err := d.Info()
			if err != nil {
				return err
			}
			bytes += info.Size()
		}
		return nil
	})
	return bytes, entries, err
}

// validName rejects names that cannot be logged or stored sensibly.
func validName(s string) bool {
	return s != "" && !strings.ContainsRune(s, 0)
}
