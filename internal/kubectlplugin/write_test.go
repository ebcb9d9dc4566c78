package kubectlplugin

import (
	"errors"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
)

// Each write command sends its route (and body), prints what kubectl
// prints for a write, and shows a viewer's 403 with the role to ask for.
func TestWriteCommands(t *testing.T) {
	for name, tc := range map[string]struct {
		args  []string
		write string // the request
		out   string
	}{
		"sync a claim":             {[]string{"sync", "pvc", "data"}, "POST /v1/namespaces/team/claims/data:sync", "persistentvolumeclaim/data queued for sync\n"},
		"sync a claim, pvc/NAME":   {[]string{"sync", "persistentvolumeclaim/data"}, "POST /v1/namespaces/team/claims/data:sync", "persistentvolumeclaim/data queued for sync\n"},
		"sync a claim, -o name":    {[]string{"sync", "pvc", "data", "-o", "name"}, "POST /v1/namespaces/team/claims/data:sync", "persistentvolumeclaim/data\n"},
		"sync a volume":            {[]string{"sync", "pv", "pv-a"}, "POST /v1/volumes/pv-a:sync", "persistentvolume/pv-a queued for sync\n"},
		"sync a volume, -o json":   {[]string{"sync", "pv/pv-a", "-o", "json"}, "POST /v1/volumes/pv-a:sync", "{}\n"},
		"retry a reclaim":          {[]string{"reclaim", "retry", "pv-a"}, "POST /v1/reclaims/pv-a:retry", "persistentvolume/pv-a reclaim retried\n\nVOLUME   POLICY   STATE     METHOD        CLAIM       ATTEMPTS   AGE      MESSAGE\npv-a     Delete   PENDING   PROVISIONER   team/gone   3          <none>   retry asked\n"},
		"retry, pv/NAME, jsonpath": {[]string{"reclaims", "retry", "persistentvolume/pv-a", "-o", "jsonpath={.reclaim.state}"}, "POST /v1/reclaims/pv-a:retry", "STATE_PENDING"},
		"start a reclaim":          {[]string{"reclaim", "start", "pv-a", "-o", "name"}, `POST /v1/reclaims {"volumeName":"pv-a"}`, "persistentvolume/pv-a\n"},
		"delete a backing volume":  {[]string{"volumes", "delete-backing", "pv-a", "--yes"}, "POST /v1/volumes/pv-a:deleteBacking", "persistentvolume/pv-a backing volume deleted\n"},
		"delete an orphan":         {[]string{"orphans", "delete", "--driver", "fast.csi", "--volume-id", "vol/1", "-y"}, `POST /v1/orphans:delete {"driverName":"fast.csi","volumeId":"vol/1"}`, "backing volume \"vol/1\" of driver fast.csi deleted\n"},
		"delete an orphan, yaml":   {[]string{"orphans", "delete", "--driver", "fast.csi", "--volume-id", "vol/1", "--yes", "-o", "yaml"}, `POST /v1/orphans:delete {"driverName":"fast.csi","volumeId":"vol/1"}`, "orphan:\n  capacityBytes: \"1048576\"\n  driverName: fast.csi\n  kind: ORPHAN_KIND_VOLUME\n  volumeId: vol/1\n"},
	} {
		t.Run(name, func(t *testing.T) {
			f := &fakeGateway{}
			srv := httptest.NewServer(f)
			defer srv.Close()
			out, errOut, err := run(t, srv.URL, tc.args...)
			if err != nil {
				t.Fatalf("%v\n%s", err, errOut)
			}
			if !slices.Equal(f.writes, []string{tc.write}) {
				t.Errorf("sent %q, want %q", f.writes, tc.write)
			}
			if out != tc.out {
				t.Errorf("printed:\n%q\nwant:\n%q", out, tc.out)
			}
			// A viewer is refused by the gateway: its message, and the role.
			_, _, err = run(t, srv.URL, append(tc.args, "--user", "viewer")...)
			var ge *Error
			if !errors.As(err, &ge) || ge.Status != 403 || !strings.Contains(err.Error(), "is forbidden: User \"viewer\"") ||
				!strings.Contains(err.Error(), "needs the volplane-operator ClusterRole") {
				t.Errorf("as a viewer: %v, want the gateway's 403 and the operator role", err)
			}
		})
	}
}

// A command that deletes asks on a terminal (y/N, no is the default) and,
// without one, is refused unless --yes; nothing reaches the gateway
// before a yes.
func TestDeletesAsk(t *testing.T) {
	for name, tc := range map[string]struct {
		terminal bool
		in       string
		args     []string
		sent     bool
		want     string // in the error; "" for success
	}{
		"no terminal":            {false, "y\n", []string{"volumes", "delete-backing", "pv-a"}, false, "standard input is not a terminal to ask at; pass --yes"},
		"no terminal, an orphan": {false, "", []string{"orphans", "delete", "--driver", "fast.csi", "--volume-id", "vol/1"}, false, "pass --yes to delete"},
		"answered no":            {true, "n\n", []string{"volumes", "delete-backing", "pv-a"}, false, "nothing deleted"},
		"answered nothing":       {true, "\n", []string{"orphans", "delete", "--driver", "fast.csi", "--volume-id", "vol/1"}, false, "nothing deleted"},
		"end of input":           {true, "", []string{"volumes", "delete-backing", "pv-a"}, false, "nothing deleted"},
		"answered yes":           {true, "yes\n", []string{"volumes", "delete-backing", "pv-a"}, true, ""},
		"answered Y":             {true, "Y\n", []string{"orphans", "delete", "--driver", "fast.csi", "--volume-id", "vol/1"}, true, ""},
		"--yes, a terminal":      {true, "", []string{"volumes", "delete-backing", "pv-a", "--yes"}, true, ""},
	} {
		t.Run(name, func(t *testing.T) {
			f := &fakeGateway{}
			srv := httptest.NewServer(f)
			defer srv.Close()
			_, errOut, err := runTerminal(t, srv.URL, tc.terminal, tc.in, tc.args...)
			switch {
			case tc.want == "" && err != nil:
				t.Fatal(err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrNotConfirmed)):
				t.Fatalf("error %v, want %q", err, tc.want)
			}
			if got := len(f.writes) > 0; got != tc.sent {
				t.Errorf("sent %q, want a request: %v", f.writes, tc.sent)
			}
			asked := strings.Contains(errOut, "[y/N]: ")
			if asked != (tc.terminal && !slices.Contains(tc.args, "--yes")) {
				t.Errorf("prompt %q", errOut)
			}
		})
	}
	// The question says what is deleted, as the binder knows the volume.
	f := &fakeGateway{}
	srv := httptest.NewServer(f)
	defer srv.Close()
	_, errOut, _ := runTerminal(t, srv.URL, true, "n\n", "volumes", "delete-backing", "pv-a")
	if want := "Delete the backing volume of persistentvolume/pv-a (Failed, 1Gi, Delete, fast.csi, claim team/gone)? Its data is lost for good. [y/N]: "; !strings.Contains(errOut, want) {
		t.Errorf("question %q, want %q", errOut, want)
	}
}

// A deletion the driver has not finished, or refused, is an error with
// its message: the command did not do what it says.
func TestDeleteBackingOutcomes(t *testing.T) {
	srv := httptest.NewServer(&fakeGateway{})
	defer srv.Close()
	for vol, want := range map[string]string{
		"pv-slow": "the backing volume of persistentvolume/pv-slow is not deleted yet: the driver may still be deleting it (DeleteVolume timed out); run the command again later",
		"pv-no":   "the backing volume of persistentvolume/pv-no was not deleted (NoChange): driver said InvalidArgument: no such volume",
	} {
		out, _, err := run(t, srv.URL, "volumes", "delete-backing", vol, "--yes")
		if err == nil || err.Error() != want || out != "" {
			t.Errorf("%s: %v, printed %q; want %q", vol, err, out, want)
		}
	}
}

// Arguments are checked before anything is sent.
func TestWriteUsage(t *testing.T) {
	f := &fakeGateway{}
	srv := httptest.NewServer(f)
	defer srv.Close()
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"sync nothing":           {[]string{"sync"}, "sync needs a claim or a volume"},
		"sync a pod":             {[]string{"sync", "pod", "x"}, `sync syncs claims (pvc) and volumes (pv), not "pod"`},
		"sync a bad name":        {[]string{"sync", "pvc", "Bad_Name"}, `"Bad_Name" is not a claim name`},
		"retry two":              {[]string{"reclaim", "retry", "a", "b"}, "retry needs one volume"},
		"retry a claim":          {[]string{"reclaim", "retry", "pvc/x"}, `retry takes a volume (pv), not "pvc"`},
		"delete no driver":       {[]string{"orphans", "delete", "--volume-id", "x", "--yes"}, "needs --driver and --volume-id"},
		"delete-backing a claim": {[]string{"volumes", "delete-backing", "pvc/x"}, `delete-backing takes a volume (pv)`},
		"orphans delete args":    {[]string{"orphans", "delete", "x"}, "delete takes no arguments"},
		"--yes on sync":          {[]string{"sync", "pvc", "data", "--yes"}, "sync does not take --yes"},
	} {
		t.Run(name, func(t *testing.T) {
			_, _, err := run(t, srv.URL, tc.args...)
			if !IsUsage(err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want a usage error with %q", err, tc.want)
			}
		})
	}
	if len(f.auth) > 0 {
		t.Errorf("%d requests sent for mistakes in the command line", len(f.auth))
	}
}
