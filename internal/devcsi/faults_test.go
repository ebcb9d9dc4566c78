package devcsi_test

import (
	"context"
	"sync"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/volplane/volplane/internal/devcsi"
)

func TestFaultsFailNextWithCode(t *testing.T) {
	d := start(t, devcsi.Options{})
	f := d.Faults()
	f.FailNext("CreateVolume", 2, codes.ResourceExhausted, "disk full")
	for i, want := range []codes.Code{codes.ResourceExhausted, codes.ResourceExhausted, codes.OK} {
		_, err := d.CreateVolume(t.Context(), createReq("v", 0))
		wantCode(t, err, want)
		if i == 0 && err.Error() != "rpc error: code = ResourceExhausted desc = disk full" {
			t.Fatalf("message: %v", err)
		}
	}
	if c, fl, h := f.Calls("CreateVolume"), f.Failed("CreateVolume"), f.Handled("CreateVolume"); c != 3 || fl != 2 || h != 1 {
		t.Fatalf("calls %d, failed %d, handled %d; want 3, 2, 1", c, fl, h)
	}
	// Other methods are untouched; full method names work too.
	if _, err := d.Probe(t.Context(), &csi.ProbeRequest{}); err != nil {
		t.Fatal(err)
	}
	f.FailNext("/csi.v1.Identity/Probe", -1, codes.OK, "")
	for range 3 {
		_, err := d.Probe(t.Context(), &csi.ProbeRequest{})
		wantCode(t, err, codes.Unavailable) // OK means Unavailable
	}
	f.Clear("Probe")
	if _, err := d.Probe(t.Context(), &csi.ProbeRequest{}); err != nil {
		t.Fatalf("after Clear: %v", err)
	}
	if f.Calls("Probe") != 5 {
		t.Fatalf("Probe calls %d, want 5", f.Calls("Probe"))
	}
	f.Reset()
	if f.Calls("Probe") != 0 {
		t.Fatalf("Probe calls after Reset %d", f.Calls("Probe"))
	}
}

func TestFaultsDelay(t *testing.T) {
	d := start(t, devcsi.Options{})
	d.Faults().Delay("GetPluginInfo", 200*time.Millisecond)
	begin := time.Now()
	if _, err := d.GetPluginInfo(t.Context(), &csi.GetPluginInfoRequest{}); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(begin); took < 200*time.Millisecond {
		t.Fatalf("delayed call took %s", took)
	}
	// A caller that gives up first gets DeadlineExceeded.
	d.Faults().Delay("GetPluginInfo", time.Hour)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	_, err := d.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	wantCode(t, err, codes.DeadlineExceeded)
}

func TestFaultsHangThenRelease(t *testing.T) {
	d := start(t, devcsi.Options{})
	f := d.Faults()
	f.HangNext("CreateVolume", -1, devcsi.HangAbandon)
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Go(func() {
			_, errs[i] = d.CreateVolume(t.Context(), createReq("same", 0))
		})
	}
	eventually(t, "three calls hang", func() bool { return f.Hanging("CreateVolume") == 3 })
	if f.Handled("CreateVolume") != 0 {
		t.Fatal("a hanging call reached the driver")
	}
	if n := f.Release("CreateVolume"); n != 3 {
		t.Fatalf("Release released %d calls, want 3", n)
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("call %d after release: %v", i, err)
		}
	}
	// Released means no more hanging.
	if _, err := d.CreateVolume(t.Context(), createReq("next", 0)); err != nil {
		t.Fatal(err)
	}
}

func TestFaultsHangUntilTheCallerGivesUp(t *testing.T) {
	for _, tc := range []struct {
		mode        devcsi.HangMode
		wantCreated bool
	}{
		{devcsi.HangAbandon, false},
		{devcsi.HangComplete, true},
	} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			d := start(t, devcsi.Options{})
			f := d.Faults()
			f.HangNext("CreateVolume", 1, tc.mode)
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			go func() {
				_, err := d.CreateVolume(ctx, createReq("slow", 0))
				done <- err
			}()
			eventually(t, "the call hangs", func() bool { return f.Hanging("CreateVolume") == 1 })
			cancel() // the caller gives up (a provisioner's timeout)
			wantCode(t, <-done, codes.Canceled)
			eventually(t, "the driver sees the caller go", func() bool { return f.Hanging("CreateVolume") == 0 })
			want := 0
			if tc.wantCreated {
				want = 1
				eventually(t, "the work is done in the background", func() bool { return f.Handled("CreateVolume") == 1 })
			}
			list, err := d.ListVolumes(t.Context(), &csi.ListVolumesRequest{})
			if err != nil || len(list.GetEntries()) != want || f.Handled("CreateVolume") != want {
				t.Fatalf("volumes %v (%v), handled %d; want %d", list.GetEntries(), err, f.Handled("CreateVolume"), want)
			}
			// The retry is not hung (count 1) and finds or makes the volume.
			v := mustCreate(t, d, createReq("slow", 0))
			if tc.wantCreated && v.GetVolumeId() != list.GetEntries()[0].GetVolume().GetVolumeId() {
				t.Fatalf("retry made %s, the background call %s", v.GetVolumeId(), list.GetEntries()[0].GetVolume().GetVolumeId())
			}
		})
	}
}

func TestFaultsParse(t *testing.T) {
	for _, tc := range []struct {
		specs []string
		want  devcsi.Fault
	}{
		{[]string{"CreateVolume=delay:2s"}, devcsi.Fault{Delay: 2 * time.Second}},
		{[]string{"CreateVolume=unavailable:2"}, devcsi.Fault{FailCount: 2, Code: codes.Unavailable}},
		{[]string{"CreateVolume=UNAVAILABLE"}, devcsi.Fault{FailCount: 1, Code: codes.Unavailable}},
		{[]string{"CreateVolume=resource_exhausted:*:disk full: try later"},
			devcsi.Fault{FailCount: -1, Code: codes.ResourceExhausted, Message: "disk full: try later"}},
		{[]string{"CreateVolume=hang"}, devcsi.Fault{HangCount: -1, Hang: devcsi.HangAbandon}},
		{[]string{"CreateVolume=hang-complete:1"}, devcsi.Fault{HangCount: 1, Hang: devcsi.HangComplete}},
		{[]string{"/csi.v1.Controller/CreateVolume=delay:1s", "CreateVolume=deadline_exceeded:3"},
			devcsi.Fault{Delay: time.Second, FailCount: 3, Code: codes.DeadlineExceeded}},
	} {
		t.Run(tc.specs[0], func(t *testing.T) {
			var f devcsi.Faults
			for _, s := range tc.specs {
				if err := f.Parse(s); err != nil {
					t.Fatal(err)
				}
			}
			if got := f.Get("CreateVolume"); got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
	for _, bad := range []string{
		"CreateVolume", "=unavailable", "CreateVolume=", "MakeVolume=unavailable", "CreateVolume=explode",
		"CreateVolume=ok", "CreateVolume=delay", "CreateVolume=delay:-1s", "CreateVolume=unavailable:0",
		"CreateVolume=unavailable:many", "CreateVolume=hang:x",
	} {
		t.Run("rejects "+bad, func(t *testing.T) {
			var f devcsi.Faults
			if err := f.Parse(bad); err == nil {
				t.Fatalf("Parse(%q) succeeded: %+v", bad, f.Get("CreateVolume"))
			}
		})
	}
}
