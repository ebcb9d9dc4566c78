package e2e

import (
	"bytes"
	"fmt"
	"os"
	"sync"
)

// secrets are the secret values tests gave the services (Secret).
var secrets struct {
	mu     sync.Mutex
	values []string
}

// Secret remembers value as secret data a test gives the services (a
// Secret's content that a StorageClass names) and returns it. When the
// package's tests are done, RunTests searches the whole services' log for
// every value remembered, so a secret logged by any path of any test, even
// one that does not look for it, fails the run. Values must be long and
// distinctive enough not to occur in a log by chance.
func Secret(value string) string {
	if len(value) < 8 {
		panic(fmt.Sprintf("e2e.Secret(%q): too short to search a log for", value))
	}
	secrets.mu.Lock()
	defer secrets.mu.Unlock()
	secrets.values = append(secrets.values, value)
	return value
}

// NoSecretsLogged reports whether the services' log holds none of the
// values given to Secret, saying on stderr what it found otherwise. Call it
// once the package's tests are done (RunTests does).
func (c *Cluster) NoSecretsLogged(name string) bool {
	switch leaked, err := c.leakedSecrets(); {
	case err != nil:
		fmt.Fprintf(os.Stderr, "%s: read the services' log for secrets: %v\n", name, err)
		return false
	case len(leaked) > 0:
		fmt.Fprintf(os.Stderr, "%s: %d secret values given to the services are in their log (%s)\n", name, len(leaked), c.LogPath)
		return false
	}
	return true
}

// leakedSecrets returns the remembered secret values the services' log
// holds.
func (c *Cluster) leakedSecrets() ([]string, error) {
	b, err := os.ReadFile(c.LogPath)
	if err != nil {
		return nil, err
	}
	secrets.mu.Lock()
	defer secrets.mu.Unlock()
	var leaked []string
	for _, v := range secrets.values {
		if bytes.Contains(b, []byte(v)) {
			leaked = append(leaked, v)
		}
	}
	return leaked, nil
}
