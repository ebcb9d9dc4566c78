package e2e

import (
	"os"
	"path/filepath"
	"testing"
)

// The end-of-run check finds a remembered secret anywhere in the log, and
// passes a log without one.
func TestNoSecretsLoggedFindsALeak(t *testing.T) {
	c := &Cluster{LogPath: filepath.Join(t.TempDir(), "services.log")}
	v := Secret("unit-test-secret-4a1b")
	if err := os.WriteFile(c.LogPath, []byte("level=INFO msg=\"grpc write\" secrets=***\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if !c.NoSecretsLogged("unit") {
		t.Fatal("a log without the secret was reported")
	}
	if err := os.WriteFile(c.LogPath, []byte("level=DEBUG request={\"password\":\""+v+"\"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if c.NoSecretsLogged("unit") {
		t.Fatal("a log holding the secret passed")
	}
}
