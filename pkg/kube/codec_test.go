package kube_test

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/volplane/volplane/pkg/kube"
)

func TestCodecsRoundTrip(t *testing.T) {
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv", ResourceVersion: "7"},
		Spec: corev1.PersistentVolumeSpec{StorageClassName: "fast", ClaimRef: &corev1.ObjectReference{Namespace: "ns", Name: "c"}}}
	b, err := kube.EncodeProto(pv)
	if err != nil {
		t.Fatal(err)
	}
	back, err := kube.DecodeVolume(b)
	if err != nil || back.Name != "pv" || back.ResourceVersion != "7" || back.Spec.ClaimRef.Name != "c" {
		t.Fatalf("volume round trip: %v %v", back, err)
	}
	if _, err := kube.DecodeClaim([]byte{0xff, 0xff, 0xff}); err == nil {
		t.Fatal("garbage decoded as a claim")
	}
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, Provisioner: "csi.example.com"}
	if b, err = kube.EncodeProto(sc); err != nil {
		t.Fatal(err)
	}
	if got, err := kube.DecodeStorageClass(b); err != nil || got.Provisioner != "csi.example.com" {
		t.Fatalf("class round trip: %v %v", got, err)
	}
	j, err := kube.EncodeJSON(pv)
	if err != nil || !strings.Contains(string(j), `"kind":"PersistentVolume"`) || !strings.Contains(string(j), `"apiVersion":"v1"`) {
		t.Fatalf("JSON: %s %v", j, err)
	}
	if pv.Kind != "" {
		t.Fatal("EncodeJSON set the kind on the caller's object")
	}
}

func TestTuneSpeaksProtobufUnthrottled(t *testing.T) {
	cfg := kube.Tune(&restConfig, kube.ClientOptions{UserAgent: "volplane-test"})
	if cfg.ContentType != "application/vnd.kubernetes.protobuf" || cfg.QPS >= 0 || !strings.HasSuffix(cfg.UserAgent, " volplane-test") {
		t.Fatalf("tuned config: content type %q, QPS %v, user agent %q", cfg.ContentType, cfg.QPS, cfg.UserAgent)
	}
	if cfg = kube.Tune(&restConfig, kube.ClientOptions{QPS: 50, Burst: 10}); cfg.QPS != 50 || cfg.Burst != 50 {
		t.Fatalf("QPS 50: got QPS %v burst %d", cfg.QPS, cfg.Burst)
	}
}

var restConfig = rest.Config{Host: "https://127.0.0.1:6443"}

func TestRateLimits(t *testing.T) {
	for _, tc := range []struct {
		name               string
		qps                float32
		burst              int
		wantQPS            float32
		wantBurst          int
		wantErr, unlimited bool
	}{
		{name: "the service's default, burst twice", wantQPS: 500, wantBurst: 1000},
		{name: "a QPS of the operator's", qps: 20, wantQPS: 20, wantBurst: 40},
		{name: "and a burst", qps: 20, burst: 30, wantQPS: 20, wantBurst: 30},
		{name: "negative: no limit", qps: -1, wantQPS: -1, unlimited: true},
		{name: "negative burst", burst: -1, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			qps, burst := tc.qps, tc.burst
			err := kube.RateLimits(&qps, &burst, 500)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err %v", err)
			}
			if err != nil {
				return
			}
			if qps != tc.wantQPS || burst != tc.wantBurst {
				t.Fatalf("QPS %v burst %d, want %v %d", qps, burst, tc.wantQPS, tc.wantBurst)
			}
			cfg := kube.Tune(&restConfig, kube.ClientOptions{QPS: qps, Burst: burst})
			if tc.unlimited != (cfg.QPS < 0) {
				t.Fatalf("tuned QPS %v", cfg.QPS)
			}
		})
	}
}
