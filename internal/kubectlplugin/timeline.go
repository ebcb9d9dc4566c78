package kubectlplugin

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

func (o *options) timelineCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "timeline pvc NAME [-n NAMESPACE]",
		GroupID: groupRead,
		Short:   "Show the steps volplane took for a claim, and which took the time",
		Long: `Show a claim's timeline as a waterfall: one line per step the binder and the
provisioner took for it (watch: created to seen by the watcher; stream: the
watcher to the binder; queued, each sync and its decision, the
reservation, the provisioning call, CreateVolume with its gRPC code, the
PersistentVolume written, the bind, each backoff and its reason), with its
offset from the first step, its duration, a bar scaled to the whole, the
service and what happened. The longest step is named at the end.
-o json|yaml shows the whole answer (times, trace IDs, replicas).

Route: GET /v1/namespaces/{namespace}/claims/{name}:timeline.`,
		Example: `  kubectl volplane timeline pvc data -n team
  kubectl volplane timeline pvc/data -o yaml`,
		Args:              claimArgs("timeline"),
		ValidArgsFunction: o.completeClaimArgs,
	}
	out := newOutput(cmd, "", false, true)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if err := out.validate(); err != nil {
			return err
		}
		_, name, _ := parseRef(args)
		r, err := o.runner(cmd.Context())
		if err != nil {
			return err
		}
		path := "/v1/namespaces/" + url.PathEscape(r.namespace) + "/claims/" + url.PathEscape(name) + ":timeline"
		ans, err := r.gw.do(cmd.Context(), http.MethodGet, path, url.Values{}, nil)
		if err != nil {
			return err
		}
		switch {
		case out.human():
			return describeTimeline(r.s.Out, ans, out.format() == "wide")
		case out.format() == "name":
			return out.printNames(r.s.Out, kindClaim, ans.obj("claim").str("name"))
		}
		return out.printAnswer(r.s.Out, ans)
	}
	return cmd
}

// timelineSpan is a span of the gateway's answer.
type timelineSpan struct {
	Service   string    `json:"service"`
	Name      string    `json:"name"`
	StartTime time.Time `json:"startTime"`
	EndTime   time.Time `json:"endTime"`
	Code      string    `json:"code"`
	Detail    string    `json:"detail"`
	MemberID  string    `json:"memberId"`
}

// barWidth is the waterfall's width in characters.
const barWidth = 40

// describeTimeline writes the answer as a waterfall; wide adds the
// replica of each step and does not shorten details.
func describeTimeline(w io.Writer, ans *object, wide bool) error {
	raw, err := json.Marshal(ans.get("spans"))
	if err != nil {
		return err
	}
	var spans []timelineSpan
	if string(raw) != "null" {
		if err := json.Unmarshal(raw, &spans); err != nil {
			return fmt.Errorf("the gateway's spans: %w", err)
		}
	}
	claim := ans.obj("claim")
	fmt.Fprintf(w, "Claim %s/%s (%s): ", claim.str("namespace"), claim.str("name"), orDash(claim.str("phase")))
	if len(spans) == 0 {
		fmt.Fprintln(w, "no steps recorded (a claim bound before this binder started, or dropped from the bounded timeline)")
		return writeNotes(w, ans)
	}
	first, last := spans[0].StartTime, spans[0].EndTime
	for _, s := range spans {
		if s.StartTime.Before(first) {
			first = s.StartTime
		}
		if s.EndTime.After(last) {
			last = s.EndTime
		}
	}
	total := last.Sub(first)
	fmt.Fprintf(w, "%d steps in %s\n\n", len(spans), round(total))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	header := "OFFSET\tDURATION\tSERVICE\tSTEP\tWATERFALL\tCODE\tDETAIL"
	if wide {
		header = "OFFSET\tDURATION\tSERVICE\tREPLICA\tSTEP\tWATERFALL\tCODE\tDETAIL"
	}
	fmt.Fprintln(tw, header)
	longest := 0
	for i, s := range spans {
		d := s.EndTime.Sub(s.StartTime)
		if d > spans[longest].EndTime.Sub(spans[longest].StartTime) {
			longest = i
		}
		detail := s.Detail
		if !wide {
			detail = shorten(detail, 60)
		}
		cols := []string{"+" + round(s.StartTime.Sub(first)), round(d), s.Service}
		if wide {
			cols = append(cols, orDash(s.MemberID))
		}
		cols = append(cols, s.Name, bar(s.StartTime.Sub(first), d, total), s.Code, detail)
		fmt.Fprintln(tw, strings.Join(cols, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	l := spans[longest]
	d := l.EndTime.Sub(l.StartTime)
	pct := 100
	if total > 0 {
		pct = int(100 * d / total)
	}
	fmt.Fprintf(w, "\nLongest step: %s %s, %s (%d%% of %s).\n", l.Service, l.Name, round(d), pct, round(total))
	return writeNotes(w, ans)
}

// writeNotes says what the timeline lacks.
func writeNotes(w io.Writer, ans *object) error {
	if n := ans.str("dropped"); n != "" && n != "0" {
		fmt.Fprintf(w, "%s older steps were dropped from the bounded timeline (--timeline-spans-per-claim).\n", n)
	}
	for _, m := range ans.strs("missing") {
		fmt.Fprintf(w, "Missing: %s\n", m)
	}
	return nil
}

// bar draws a step of duration d starting at offset in a waterfall of
// total: at least one mark, so that instant steps show where they are.
func bar(offset, d, total time.Duration) string {
	from, n := 0, barWidth
	if total > 0 {
		from = int(int64(barWidth) * int64(offset) / int64(total))
		n = int(int64(barWidth) * int64(d) / int64(total))
	}
	from = min(max(from, 0), barWidth-1)
	n = min(max(n, 1), barWidth-from)
	return "|" + strings.Repeat("·", from) + strings.Repeat("█", n) + strings.Repeat("·", barWidth-from-n) + "|"
}

// round shows a duration to the millisecond (microseconds below one).
func round(d time.Duration) string {
	if d > 0 && d < time.Millisecond {
		return d.Round(time.Microsecond).String()
	}
	return d.Round(time.Millisecond).String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func shorten(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n-3]) + "..."
	}
	return s
}
