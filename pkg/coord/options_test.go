package coord_test

import (
	"strings"
	"testing"

	"github.com/volplane/volplane/pkg/coord"
)

// The etcd client's security flags: what cannot work is refused before a
// connection is tried, every mistake at once, each naming its flag.
func TestSecurityValidate(t *testing.T) {
	https, http := []string{"https://etcd:2379"}, []string{"http://127.0.0.1:2379"}
	for _, tc := range []struct {
		name      string
		s         coord.Security
		endpoints []string
		want      []string
	}{
		{"plaintext", coord.Security{}, http, nil},
		{"TLS", coord.Security{CAFile: "ca.crt", CertFile: "c.crt", KeyFile: "c.key"}, https, nil},
		{"server verification only", coord.Security{CAFile: "ca.crt"}, https, nil},
		{"password", coord.Security{Username: "u", PasswordFile: "p"}, http, nil},
		{"certificate without key", coord.Security{CAFile: "ca.crt", CertFile: "c.crt"}, https, []string{"--etcd-cert", "--etcd-key"}},
		{"key without certificate", coord.Security{CAFile: "ca.crt", KeyFile: "c.key"}, https, []string{"--etcd-cert", "--etcd-key"}},
		{"TLS on http", coord.Security{CAFile: "ca.crt"}, http, []string{"https://", "--etcd-endpoints"}},
		{"user without password", coord.Security{Username: "u"}, http, []string{"--etcd-password-file"}},
		{"password without user", coord.Security{PasswordFile: "p"}, http, []string{"--etcd-username"}},
		{"all at once", coord.Security{CertFile: "c.crt", Username: "u"}, http, []string{"--etcd-key", "https://", "--etcd-password-file"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.s.Validate(tc.endpoints)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			for _, w := range tc.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("error %v does not say %s", err, w)
				}
			}
		})
	}
}
