package standalone

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/test/harness/devenv"
	"github.com/volplane/volplane/test/harness/e2e"
)

// The parity of external-provisioner v6.3.0's flags: each flag is given to
// csi-provisioner v6.3.0 and to volplane's standalone provisioner
// replicas, on the same dev driver beside the same
// kube-controller-manager; a proxy in front of the driver records the
// CreateVolume requests each sends, and the requests, PVs, volumes and
// Events are compared, beyond what must differ (names, UIDs, handles).

// flagCase is one flag, or one behaviour, run on both provisioners.
type flagCase struct {
	name  string
	flags []string // on both command lines
	modes []corev1.PersistentVolumeAccessMode
	// clone: the claim clones a bound claim, and the driver's answer
	// loses its content source on the way back (the proxy drops it).
	clone bool
	// check is what the flag must do, "" when it did.
	check func(m flagMade) string
}

// flagMade is what one provisioner made for a flagCase.
type flagMade struct {
	made
	creates []*csi.CreateVolumeRequest
	deletes int
}

var flagCases = []flagCase{
	{name: "volume-name-uuid-length", flags: []string{"--volume-name-uuid-length=8"}, check: func(m flagMade) string {
		if !regexp.MustCompile(`^pvc-[0-9a-f]{8}$`).MatchString(m.pv.Name) {
			return "PV " + m.pv.Name + " is not pvc-<8 characters>"
		}
		return ""
	}},
	{name: "immediate-topology=false", flags: []string{"--immediate-topology=false"}, check: func(m flagMade) string {
		if r := m.creates[0].GetAccessibilityRequirements(); r != nil {
			return fmt.Sprintf("topology asked: %v", r)
		}
		return ""
	}},
	{name: "controller-publish-readonly", flags: []string{"--controller-publish-readonly"}, modes: []corev1.PersistentVolumeAccessMode{corev1.ReadOnlyMany},
		check: func(m flagMade) string {
			if !m.pv.Spec.CSI.ReadOnly {
				return "spec.csi.readOnly is false"
			}
			return ""
		}},
	{name: "feature-gates=Topology=false", flags: []string{"--feature-gates=Topology=false"}, check: func(m flagMade) string {
		if r := m.creates[0].GetAccessibilityRequirements(); r != nil || m.pv.Spec.NodeAffinity != nil {
			return fmt.Sprintf("topology asked %v, node affinity %v", r, m.pv.Spec.NodeAffinity)
		}
		return ""
	}},
	{name: "volume-content-source-missing", clone: true, check: func(m flagMade) string {
		if m.deletes == 0 || !slices.Contains(m.events, "ProvisioningFailed: volume content source missing") {
			return fmt.Sprintf("%d DeleteVolume calls, events %q", m.deletes, m.events)
		}
		return ""
	}},
}

// parityFlags runs every flagCase on csi-provisioner v6.3.0 and on
// volplane, through the recording proxy.
func (x *env) parityFlags() {
	bin := findCSIProvisioner()
	if bin == "" {
		x.t.Skip("no csi-provisioner v6.3.0 (VOLPLANE_CSI_PROVISIONER)")
	}
	proxy := x.interpose()
	defer x.restoreDriver(proxy)
	t := x.t
	for i, fc := range flagCases {
		x.t = t
		ps := x.c.Replicas("provisioner")
		for _, r := range ps {
			r.Stop()
		}
		ep := x.startCSIProvisioner(bin, fc.flags...)
		theirs := x.flagRun(proxy, fc, fmt.Sprintf("fl%d-ep", i))
		ep.Stop()
		x.restartProvisioners(fc.flags...)
		ours := x.flagRun(proxy, fc, fmt.Sprintf("fl%d-vp", i))
		x.restartProvisioners()
		for _, d := range diffFlagMade(theirs, ours) {
			t.Errorf("%s: %s", fc.name, d)
		}
		for who, m := range map[string]flagMade{"external-provisioner": theirs, "volplane": ours} {
			if why := fc.check(m); why != "" {
				t.Errorf("%s: %s did not honour it: %s", fc.name, who, why)
			}
		}
		t.Logf("%s: external-provisioner and volplane sent the same CreateVolume %s and made the same PV and Events %q",
			fc.name, prototext.Format(normalRequest(ours.creates[0])), ours.events)
	}
}

// restartProvisioners restarts volplane's provisioner replicas with args
// added to their command line, and waits until they serve.
func (x *env) restartProvisioners(args ...string) {
	x.t.Helper()
	for _, r := range x.c.Replicas("provisioner") {
		r.Stop()
		if err := r.StartWithArgs(args...); err != nil {
			x.t.Fatal(err)
		}
		if err := x.c.WaitServing(x.t.Context(), r, 2*time.Minute); err != nil {
			x.t.Fatal(err)
		}
	}
}

// flagRun makes the flagCase's claim name with whichever provisioner runs
// and returns what it made: for a clone, once its ProvisioningFailed is
// out (the claim then deleted, so that the next provisioner leaves it).
func (x *env) flagRun(proxy *csiProxy, fc flagCase, name string) flagMade {
	x.t.Helper()
	var m flagMade
	component := "^" + devcsi.DefaultName + "_"
	if !fc.clone {
		cl := x.flagClaim(name, fc.modes, "")
		got := e2e.ClaimPhase(x.t, x.c.Client, namespace, name, corev1.ClaimBound, 2*time.Minute)
		m.pv = e2e.VolumePhase(x.t, x.c.Client, got.Spec.VolumeName, corev1.VolumeBound, time.Minute)
		vols, err := x.c.CSIVolumeStates()
		if err != nil {
			x.t.Fatal(err)
		}
		m.volume = vols[m.pv.Spec.CSI.VolumeHandle]
		m.events = x.flagEvents(cl, m.pv.Name, component, "ProvisioningSucceeded")
		m.creates = proxy.createsFor(m.pv.Name)
		return m
	}
	src := x.flagClaim(name+"-src", nil, "")
	e2e.ClaimPhase(x.t, x.c.Client, namespace, src.Name, corev1.ClaimBound, 2*time.Minute)
	proxy.setDropSource(true)
	defer proxy.setDropSource(false)
	before := proxy.deleteCount()
	cl := x.flagClaim(name, nil, src.Name)
	vol := "pvc-" + string(cl.UID)
	m.events = x.flagEvents(cl, vol, component, "ProvisioningFailed")
	m.creates, m.deletes = proxy.createsFor(vol), proxy.deleteCount()-before
	x.deleteClaim(cl)
	e2e.Eventually(x.t, time.Minute, func() string {
		if _, err := x.c.Client.CoreV1().PersistentVolumeClaims(namespace).Get(x.t.Context(), cl.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Sprintf("clone claim still there: %v", err)
		}
		return ""
	})
	return m
}

// flagClaim creates a claim of classDelete with modes (default RWO),
// cloning the claim source when given.
func (x *env) flagClaim(name string, modes []corev1.PersistentVolumeAccessMode, source string) *corev1.PersistentVolumeClaim {
	x.t.Helper()
	c := e2e.Claim(namespace, name, "1Gi", classDelete)
	if len(modes) > 0 {
		c.Spec.AccessModes = modes
	}
	if source != "" {
		c.Spec.DataSource = &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: source}
	}
	cl, err := x.c.Client.CoreV1().PersistentVolumeClaims(namespace).Create(x.t.Context(), c, metav1.CreateOptions{})
	if err != nil {
		x.t.Fatal(err)
	}
	return cl
}

// flagEvents waits for the claim's event of reason from component and
// returns its events from component, names and UIDs replaced, each once,
// sorted.
func (x *env) flagEvents(cl *corev1.PersistentVolumeClaim, volume, component, reason string) []string {
	x.t.Helper()
	var out []string
	re := regexp.MustCompile(component)
	e2e.Eventually(x.t, 2*time.Minute, func() string {
		evs, err := e2e.Events(x.c.Client, namespace, "PersistentVolumeClaim", cl.Name)
		if err != nil {
			return err.Error()
		}
		out = nil
		rep := strings.NewReplacer(volume, "VOLUME", cl.Name, "NAME", string(cl.UID), "UID")
		for _, e := range evs {
			if line := e.Reason + ": " + rep.Replace(e.Message); re.MatchString(e.Source.Component) && !slices.Contains(out, line) {
				out = append(out, line)
			}
		}
		slices.Sort(out)
		if !slices.ContainsFunc(out, func(l string) bool { return strings.HasPrefix(l, reason+": ") }) {
			return fmt.Sprintf("no %s event on %s yet: %q", reason, cl.Name, out)
		}
		return ""
	})
	return out
}

// diffFlagMade lists how ours differs from theirs: the PV and volume as
// diffMade compares them (when bound), the Events, and the first
// CreateVolume request without its name and source volume ID.
func diffFlagMade(theirs, ours flagMade) []string {
	var out []string
	if theirs.pv != nil && ours.pv != nil {
		out = diffMade(theirs.made, ours.made)
	} else if !slices.Equal(theirs.events, ours.events) {
		out = append(out, fmt.Sprintf("Events differ: external-provisioner %q, volplane %q", theirs.events, ours.events))
	}
	if len(theirs.creates) == 0 || len(ours.creates) == 0 {
		return append(out, fmt.Sprintf("CreateVolume requests: external-provisioner %d, volplane %d", len(theirs.creates), len(ours.creates)))
	}
	if a, b := normalRequest(theirs.creates[0]), normalRequest(ours.creates[0]); !proto.Equal(a, b) {
		out = append(out, fmt.Sprintf("CreateVolume differs:\nexternal-provisioner: %s\nvolplane: %s", prototext.Format(a), prototext.Format(b)))
	}
	return out
}

// normalRequest is a CreateVolume request without its name, secrets and
// source volume's ID.
func normalRequest(r *csi.CreateVolumeRequest) *csi.CreateVolumeRequest {
	n := proto.Clone(r).(*csi.CreateVolumeRequest)
	n.Name, n.Secrets = "", nil
	if v := n.GetVolumeContentSource().GetVolume(); v != nil {
		v.VolumeId = "SOURCE"
	}
	return n
}

// interpose restarts the dev driver on a socket of its own and puts the
// recording proxy on the driver's address, where both provisioners dial.
func (x *env) interpose() *csiProxy {
	x.t.Helper()
	outer := strings.TrimPrefix(x.c.CSI.Addr, "unix://")
	inner := "unix://" + filepath.Join(filepath.Dir(outer), "inner.sock")
	x.c.CSI.Stop()
	if err := x.c.CSI.StartWithArgs("--endpoint", inner); err != nil {
		x.t.Fatal(err)
	}
	if err := devenv.WaitCSIServing(x.t.Context(), inner, time.Minute); err != nil {
		x.t.Fatal(err)
	}
	_ = os.Remove(outer)
	p, err := startCSIProxy(outer, inner)
	if err != nil {
		x.t.Fatal(err)
	}
	if err := devenv.WaitCSIServing(x.t.Context(), x.c.CSI.Addr, time.Minute); err != nil {
		x.t.Fatal(err)
	}
	return p
}

// restoreDriver removes the proxy and runs the dev driver on its address
// again.
func (x *env) restoreDriver(p *csiProxy) {
	p.stop()
	x.c.CSI.Stop()
	if err := x.c.CSI.Start(); err != nil {
		x.t.Fatal(err)
	}
	if err := devenv.WaitCSIServing(context.Background(), x.c.CSI.Addr, time.Minute); err != nil {
		x.t.Fatal(err)
	}
}

// csiProxy passes every call through to a CSI driver, keeping the
// CreateVolume requests and counting DeleteVolume calls; with dropSource
// it removes the content source of CreateVolume answers.
type csiProxy struct {
	srv     *grpc.Server
	backend *grpc.ClientConn

	mu         sync.Mutex
	creates    []*csi.CreateVolumeRequest
	deletes    int
	dropSource bool
}

// rawCodec moves messages as bytes.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }
func (rawCodec) Unmarshal(b []byte, v any) error {
	*v.(*[]byte) = append([]byte(nil), b...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

// startCSIProxy serves the proxy of the driver at backend on the unix
// socket path.
func startCSIProxy(path, backend string) (*csiProxy, error) {
	cc, err := grpcutil.DialCSI(backend)
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		cc.Close()
		return nil, err
	}
	p := &csiProxy{backend: cc}
	p.srv = grpc.NewServer(grpc.ForceServerCodec(rawCodec{}), grpc.UnknownServiceHandler(p.handle))
	go func() { _ = p.srv.Serve(lis) }()
	return p, nil
}

func (p *csiProxy) stop() {
	p.srv.Stop()
	p.backend.Close()
}

// handle passes one unary call through.
func (p *csiProxy) handle(_ any, stream grpc.ServerStream) error {
	method, _ := grpc.MethodFromServerStream(stream)
	var req, resp []byte
	if err := stream.RecvMsg(&req); err != nil {
		return err
	}
	p.record(method, req)
	if err := p.backend.Invoke(stream.Context(), method, &req, &resp, grpc.ForceCodec(rawCodec{})); err != nil {
		return err
	}
	return stream.SendMsg(p.rewrite(method, resp))
}

func (p *csiProxy) record(method string, req []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case strings.HasSuffix(method, "/CreateVolume"):
		r := &csi.CreateVolumeRequest{}
		if proto.Unmarshal(req, r) == nil {
			p.creates = append(p.creates, r)
		}
	case strings.HasSuffix(method, "/DeleteVolume"):
		p.deletes++
	}
}

// rewrite drops a CreateVolume answer's content source with dropSource.
func (p *csiProxy) rewrite(method string, resp []byte) *[]byte {
	p.mu.Lock()
	drop := p.dropSource
	p.mu.Unlock()
	if !drop || !strings.HasSuffix(method, "/CreateVolume") {
		return &resp
	}
	r := &csi.CreateVolumeResponse{}
	if proto.Unmarshal(resp, r) != nil {
		return &resp
	}
	r.GetVolume().ContentSource = nil
	b, err := proto.Marshal(r)
	if err != nil {
		return &resp
	}
	return &b
}

func (p *csiProxy) setDropSource(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropSource = on
}

func (p *csiProxy) deleteCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.deletes
}

// createsFor are the CreateVolume requests for the volume name.
func (p *csiProxy) createsFor(name string) []*csi.CreateVolumeRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []*csi.CreateVolumeRequest
	for _, r := range p.creates {
		if r.GetName() == name {
			out = append(out, r)
		}
	}
	return out
}
