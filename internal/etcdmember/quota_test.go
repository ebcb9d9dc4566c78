package etcdmember

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/volplane/volplane/pkg/coord"
)

// etcd with a tiny quota, and volplane rewriting a journal record until
// etcd's database passes it: the NOSPACE alarm trips, volplane's
// coordination layer says so (the write's error, Health "etcd: NOSPACE
// alarm", an error in its log), and the member recovers by itself:
// compaction, defragmentation, disarm. Then volplane writes again.
func TestTheNoSpaceAlarmTripsIsReportedAndRecovers(t *testing.T) {
	if testing.Short() {
		t.Skip("runs an etcd member")
	}
	const quota = 4 << 20
	c := newTestCluster(t, 1, func(o *Options) {
		o.QuotaBackendBytes = quota
		// Only the entrypoint's own compaction may help, and it looks
		// every 2s, so the alarm lasts long enough to be seen.
		o.AutoCompactionRetention = "1h"
		o.MaintenancePeriod = 2 * time.Second
	})
	c.start(0)
	cli := c.client()
	eventually(t, time.Minute, func() string { return c.healthy(cli, 1) })

	var vlog logSink
	w := &worker{}
	k, err := coord.NewKeeper(coord.Options{
		Endpoints: c.clientURLs(),
		Security:  coord.Security{CAFile: c.tls.CAFile, CertFile: c.tls.CertFile, KeyFile: c.tls.KeyFile},
		Logger:    slog.New(slog.NewTextHandler(&vlog, nil)), AlarmPeriod: 100 * time.Millisecond,
	}, "provisioner", "provisioner-0", "addr")
	if err != nil {
		t.Fatal(err)
	}
	w.k = k
	ctx := t.Context()
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx) }()
	eventually(t, time.Minute, func() string {
		if !k.Ready() {
			return "no etcd session"
		}
		return ""
	})
	if err := k.Acquire(ctx, "provision", "pv-big", "provisioner-0"); err != nil {
		t.Fatal(err)
	}
	value := bytes.Repeat([]byte("x"), 64<<10)
	var werr error
	writes := 0
	for ; writes < 1000 && werr == nil; writes++ {
		werr = k.Put(ctx, "provision", "pv-big", "provisioner-0", value)
	}
	if !errors.Is(werr, coord.ErrNoSpaceAlarm) || !strings.Contains(werr.Error(), "database space exceeded") {
		t.Fatalf("write %d past the %d-byte quota: %v, want ErrNoSpaceAlarm with etcd's words", writes, quota, werr)
	}
	if err := k.Health(); err == nil || err.Error() != "etcd: NOSPACE alarm" {
		t.Fatalf("Health under the alarm: %v", err)
	}
	eventually(t, 10*time.Second, func() string {
		if len(vlog.lines("level=ERROR", "NOSPACE")) == 0 {
			return "volplane logged no error for the alarm"
		}
		return ""
	})
	t.Logf("volplane's log under the alarm: %s", vlog.lines("level=ERROR", "NOSPACE")[0])

	// The member recovers by itself.
	eventually(t, 2*time.Minute, func() string {
		if err := k.Health(); err != nil {
			return "Health: " + err.Error()
		}
		if err := k.Put(ctx, "provision", "pv-big", "provisioner-0", []byte("small")); err != nil {
			return "a write after the recovery: " + err.Error()
		}
		return ""
	})
	for _, want := range []string{"NOSPACE alarm is raised", "defragmented this member's database", "NOSPACE alarm disarmed"} {
		if len(c.log.lines(want)) == 0 {
			t.Errorf("the member did not log %q", want)
		}
	}
	if len(vlog.lines("alarm cleared")) == 0 {
		t.Error("volplane did not log the alarm cleared")
	}
	code, body := get(t, c.metricsURL(0)+"/metrics")
	for _, m := range []string{"volplane_etcd_member_alarm_disarms_total", "volplane_etcd_member_nospace_alarms_total", "volplane_etcd_member_defragmentations_total", "etcd_mvcc_db_total_size_in_bytes"} {
		if code != http.StatusOK || !regexp.MustCompile(fmt.Sprintf(`(?m)^%s [1-9]`, m)).MatchString(body) {
			t.Errorf("/metrics (%d): no %s above 0", code, m)
		}
	}
	eventually(t, time.Minute, func() string {
		if _, body := get(t, c.metricsURL(0)+"/metrics"); !regexp.MustCompile(`(?m)^volplane_etcd_member_nospace_alarm 0$`).MatchString(body) {
			return "volplane_etcd_member_nospace_alarm is not 0 after the recovery"
		}
		return ""
	})
	st, err := cli.Status(ctx, c.clientURLs()[0])
	if err != nil || st.DbSize >= quota/2 {
		t.Errorf("database after the recovery: %v bytes, %v", st.DbSize, err)
	}
	t.Logf("%d writes of 64 KiB filled the %d-byte quota; database after the recovery: %d bytes", writes, quota, st.DbSize)
}
