package reclaimer

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
)

// errNoRecyclePrefixes: node-local recycling was allowed no directory.
var errNoRecyclePrefixes = errors.New("node-local recycling is allowed under no directory: list the directories whose volumes this reclaimer may scrub with --recycle-path-prefixes")

// allowedPath returns the directory node-local recycling may scrub for a
// volume's path: the path cleaned and with every symbolic link resolved,
// when that lies strictly below one of prefixes (resolved likewise: a
// prefix itself is never scrubbed). A path that escapes with "..", a
// volume directory that is a link to elsewhere, or /data/x for the prefix
// /database, is refused with an error that says why.
func allowedPath(path string, prefixes []string) (string, error) {
	if len(prefixes) == 0 {
		return "", errNoRecyclePrefixes
	}
	if !filepath.IsAbs(path) {
		return "", fmt.Errorf("path %q is not absolute", path)
	}
	resolved, err := filepath.EvalSymlinks(filepath.Clean(path))
	if err != nil {
		return "", fmt.Errorf("resolve path %q: %w", path, err)
	}
	for _, p := range prefixes {
		root, err := filepath.EvalSymlinks(filepath.Clean(p))
		if err != nil {
			continue // a prefix that does not exist holds nothing
		}
		if below(resolved, root) {
			return resolved, nil
		}
	}
	if resolved != filepath.Clean(path) {
		return "", fmt.Errorf("path %q resolves to %q, which is not below any of --recycle-path-prefixes (%s)", path, resolved, strings.Join(prefixes, ","))
	}
	return "", fmt.Errorf("path %q is not below any of --recycle-path-prefixes (%s)", path, strings.Join(prefixes, ","))
}

// below reports whether the clean absolute path lies strictly inside dir:
// /data/v is below /data, while /data, /database and /data/../etc are not.
func below(path, dir string) bool {
	rel, err := filepath.Rel(dir, path)
	if err != nil || rel == "." || filepath.IsAbs(rel) {
		return false
	}
	return rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

// checkPrefixes validates --recycle-path-prefixes: absolute directories,
// never the root (which would let any path but "/" be scrubbed again).
func checkPrefixes(prefixes []string) error {
	var errs []error
	for _, p := range prefixes {
		switch {
		case !filepath.IsAbs(p):
			errs = append(errs, fmt.Errorf("recycle path prefix %q is not absolute (--recycle-path-prefixes)", p))
		case filepath.Clean(p) == "/":
			errs = append(errs, errors.New("recycle path prefix \"/\" would let any directory be scrubbed: name the directories that hold recyclable volumes (--recycle-path-prefixes)"))
		}
	}
	return errors.Join(errs...)
}
