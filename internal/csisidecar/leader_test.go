package csisidecar

import "testing"

// TestLockNameIsCSIProvisioners: the lock is the one csi-provisioner
// v6.3.0 takes, so that during a swap the two never lead at once. The
// first three cases are csi-lib-utils v0.24.0's own for its sanitizeName.
func TestLockNameIsCSIProvisioners(t *testing.T) {
	for in, want := range map[string]string{
		"test-driver":              "test-driver",
		"test!driver/foo":          "test-driver-foo",
		"driver\\":                 "driver-X",
		"ebs.csi.aws.com":          "ebs-csi-aws-com",
		"hostpath.csi.volplane.io": "hostpath-csi-volplane-io",
		"vendor.example/block.":    "vendor-example-block-X",
	} {
		if got := lockName(in); got != want {
			t.Errorf("lockName(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestLeaderNamespace is csi-lib-utils' order: the flag, $POD_NAMESPACE,
// the ServiceAccount's file, default ($NAMESPACE is not read for the
// lock, as upstream).
func TestLeaderNamespace(t *testing.T) {
	t.Setenv("POD_NAMESPACE", "")
	t.Setenv("NAMESPACE", "ignored")
	if got := leaderNamespace("flagged"); got != "flagged" {
		t.Fatalf("with the flag: %q", got)
	}
	t.Setenv("POD_NAMESPACE", "from-env")
	if got := leaderNamespace(""); got != "from-env" {
		t.Fatalf("with $POD_NAMESPACE: %q", got)
	}
}
