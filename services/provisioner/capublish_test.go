package provisioner

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/sidecar"
)

// TestCAPublisher: the CA bundle is published at start, again when the
// file changes, and restored when someone else changes the ConfigMap.
func TestCAPublisher(t *testing.T) {
	file := filepath.Join(t.TempDir(), "ca.crt")
	write := func(s string) {
		if err := os.WriteFile(file, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	api := fake.NewClientset()
	pub := &caPublisher{log: discard, client: api, namespace: "volplane-system", file: file}
	get := func() string {
		cm, err := api.CoreV1().ConfigMaps("volplane-system").Get(t.Context(), sidecar.CAConfigMap, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return cm.Data[sidecar.CAConfigMapKey]
	}
	first := "-----BEGIN CERTIFICATE-----\nfirst\n-----END CERTIFICATE-----\n"
	write(first)
	if err := pub.publish(t.Context()); err != nil || get() != first {
		t.Fatalf("published %q, %v", get(), err)
	}
	second := first + "-----BEGIN CERTIFICATE-----\nsecond\n-----END CERTIFICATE-----\n"
	write(second)
	if err := pub.publish(t.Context()); err != nil || get() != second {
		t.Fatalf("after rotation %q, %v", get(), err)
	}
	cm, _ := api.CoreV1().ConfigMaps("volplane-system").Get(t.Context(), sidecar.CAConfigMap, metav1.GetOptions{})
	cm.Data[sidecar.CAConfigMapKey] = "forged"
	if _, err := api.CoreV1().ConfigMaps("volplane-system").Update(t.Context(), cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := pub.publish(t.Context()); err != nil || get() != second {
		t.Fatalf("after a change by someone else %q, %v", get(), err)
	}
	write("not a certificate")
	if err := pub.publish(t.Context()); err == nil || !strings.Contains(err.Error(), "no PEM certificate") || get() != second {
		t.Fatalf("a broken file was published: %q, %v", get(), err)
	}
}

func TestDiscoveryOptions(t *testing.T) {
	files := grpcutil.TLSFiles{CAFile: "ca", CertFile: "crt", KeyFile: "key"}
	for _, tc := range []struct {
		name string
		o    Options
		want string
	}{
		{"no driver at all", Options{}, "no CSI driver to provision with"},
		{"discovery alone", Options{DiscoverSidecars: true}, ""},
		{"discovery in plaintext", Options{DiscoverSidecars: true}, "--discover-sidecars needs the --tls-* files"},
		{"bad namespace", Options{DiscoverSidecars: true, Namespace: "Not_A_Namespace"}, "--namespace"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.o.TLS = files
			if tc.name == "discovery in plaintext" {
				tc.o.TLS = grpcutil.TLSFiles{InsecurePlaintext: true}
			}
			t.Setenv("POD_NAMESPACE", "")
			err := errorsJoined(tc.o.validateDiscovery())
			switch {
			case tc.want == "" && err != "":
				t.Errorf("refused: %s", err)
			case tc.want != "" && !strings.Contains(err, tc.want):
				t.Errorf("got %q, want %q", err, tc.want)
			}
			if tc.want == "" && tc.o.Namespace != DefaultNamespace {
				t.Errorf("namespace %q, want %q", tc.o.Namespace, DefaultNamespace)
			}
		})
	}
}

func errorsJoined(errs []error) string {
	var s []string
	for _, e := range errs {
		s = append(s, e.Error())
	}
	return strings.Join(s, "; ")
}
