package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Every flag a service binary accepts is named in the README a newcomer
// reads for it: its service's README, or docs/configuration.md for the gateway
// and the dev CSI driver.
func TestEveryFlagIsDocumented(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every binary")
	}
	bin := build(t)
	readmes := map[string][]string{
		"watcher":      {"../services/watcher/README.md"},
		"binder":       {"../services/binder/README.md"},
		"provisioner":  {"../services/provisioner/README.md"},
		"reclaimer":    {"../services/reclaimer/README.md"},
		"gateway":      {"../gateway/README.md", "../docs/configuration.md"},
		"volplane-csi": {"../docs/configuration.md", "../internal/devcsi/README.md"},
	}
	// pflag's usage lines: "      --name type   usage", "  -h, --help"
	// (a wrapped usage's next lines are indented further).
	flagLine := regexp.MustCompile(`(?m)^(?:  -[a-z0-9], |      )--([a-z0-9][a-z0-9-]*)`)
	for name, files := range readmes {
		var docs strings.Builder
		for _, f := range files {
			if b, err := os.ReadFile(f); err == nil {
				docs.Write(b)
			}
		}
		if docs.Len() == 0 {
			t.Errorf("%s: none of %v exists", name, files)
			continue
		}
		out, _ := exec.Command(filepath.Join(bin, name), "--help").CombinedOutput()
		flags := flagLine.FindAllStringSubmatch(string(out), -1)
		if len(flags) < 3 {
			t.Errorf("%s -help lists %d flags:\n%s", name, len(flags), out)
			continue
		}
		for _, f := range flags {
			if f[1] == "help" || f[1] == "version" {
				continue // every binary's, in the top README
			}
			if !strings.Contains(docs.String(), "--"+f[1]) {
				t.Errorf("%s: --%s is not in %v", name, f[1], files)
			}
		}
	}
}

// The README stays short: what volplane is, the two commands, the
// architecture, authentication, the API, configuration and one table of
// figures, with the details in docs/ (the operability issue set 200 lines).
func TestReadmeIsShort(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n > 200 {
		t.Errorf("README.md has %d lines, more than 200: move details to docs/", n)
	}
}
