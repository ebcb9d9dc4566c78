package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// What the apiserver and etcd count, read from their /metrics before and
// after a measured phase. Each family is summed over the labels a row
// does not show (response codes, groups, versions, scopes).
var (
	// apiserver_request_total by verb and resource[/subresource]: every
	// request every client made, the bench's own included.
	familyAPI = family{metric: "apiserver_request_total", row: func(l labels) string {
		if l["resource"] == "" {
			return "" // /metrics, /readyz, discovery
		}
		r := l["resource"]
		if s := l["subresource"]; s != "" {
			r += "/" + s
		}
		return l["verb"] + " " + r
	}}
	// etcd_requests_total by operation and resource: what the apiserver
	// asked etcd for.
	familyAPIEtcd = family{metric: "etcd_requests_total", row: func(l labels) string {
		return l["operation"] + " " + l["resource"]
	}}
	// apiserver_watch_events_total by resource: events sent to watchers
	// (one per watcher an object change reaches).
	familyWatchEvents = family{metric: "apiserver_watch_events_total", row: func(l labels) string {
		return l["resource"]
	}}
	// apiserver_longrunning_requests{verb="WATCH"} by resource: the watches
	// open at the moment (a gauge).
	familyWatches = family{metric: "apiserver_longrunning_requests", row: func(l labels) string {
		if l["verb"] != "WATCH" {
			return ""
		}
		return l["resource"]
	}}
	// grpc_server_msg_received_total by method on etcd's side: its
	// requests from every client (the apiserver, and volplane's
	// reservations, journal, membership and leases); for streams (Watch,
	// LeaseKeepAlive) the messages received on them.
	familyEtcd = family{metric: "grpc_server_msg_received_total", row: func(l labels) string {
		if !strings.HasPrefix(l["grpc_service"], "etcdserverpb.") {
			return "" // health checks
		}
		return l["grpc_method"]
	}}
)

// labels are one sample's label pairs.
type labels map[string]string

// family sums one metric family into rows; row returns "" for a sample
// it leaves out.
type family struct {
	metric string
	row    func(labels) string
}

// counts are a family's rows and their values at one moment (or the
// difference over a phase).
type counts map[string]float64

// sum adds up f's samples from parsed metrics into rows.
func (f family) sum(mfs map[string]*dto.MetricFamily) counts {
	out := counts{}
	mf := mfs[f.metric]
	if mf == nil {
		return out
	}
	for _, m := range mf.GetMetric() {
		l := labels{}
		for _, p := range m.GetLabel() {
			l[p.GetName()] = p.GetValue()
		}
		row := f.row(l)
		if row == "" {
			continue
		}
		switch {
		case m.GetCounter() != nil:
			out[row] += m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			out[row] += m.GetGauge().GetValue()
		case m.GetUntyped() != nil:
			out[row] += m.GetUntyped().GetValue()
		}
	}
	return out
}

// minus is c - before, row by row, leaving out rows that did not change.
func (c counts) minus(before counts) counts {
	out := counts{}
	for k, v := range c {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// total adds up every row whose key starts with one of prefixes (every
// row with none).
func (c counts) total(prefixes ...string) float64 {
	var sum float64
	for k, v := range c {
		if len(prefixes) == 0 {
			sum += v
			continue
		}
		for _, p := range prefixes {
			if strings.HasPrefix(k, p) {
				sum += v
				break
			}
		}
	}
	return sum
}

// keys are c's rows in order.
func (c counts) keys() []string {
	out := make([]string, 0, len(c))
	for k := range c {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// parseMetrics parses the Prometheus text format.
func parseMetrics(r io.Reader) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(r)
}

// scrape reads url's /metrics with client.
func scrape(ctx context.Context, client *http.Client, url string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/plain")
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return parseMetrics(resp.Body)
}

// Requests are what the apiserver and etcd served over a measured phase,
// in total (divide by the claims for per bind).
type Requests struct {
	// API is apiserver_request_total by "VERB resource[/subresource]".
	API counts
	// APIEtcd is the apiserver's etcd_requests_total by "operation resource".
	APIEtcd counts
	// Etcd is etcd's grpc_server_msg_received_total by method.
	Etcd counts
	// WatchEvents is apiserver_watch_events_total by resource.
	WatchEvents counts
	// Watches are the watches open at the end that were not open before
	// the system under test started, by resource: its own and the
	// bench's one watch of claims.
	Watches counts
}

// snapshot is every counter at one moment.
type snapshot struct {
	api, apiEtcd, etcd, watchEvents, watches counts
}

// metricsReader scrapes the apiserver's and etcd's /metrics.
type metricsReader struct {
	api, etcd       *http.Client
	apiURL, etcdURL string
}

func (m *metricsReader) snapshot(ctx context.Context) (snapshot, error) {
	a, err := scrape(ctx, m.api, m.apiURL+"/metrics")
	if err != nil {
		return snapshot{}, fmt.Errorf("kube-apiserver metrics: %w", err)
	}
	e, err := scrape(ctx, m.etcd, m.etcdURL+"/metrics")
	if err != nil {
		return snapshot{}, fmt.Errorf("etcd metrics: %w", err)
	}
	return snapshot{api: familyAPI.sum(a), apiEtcd: familyAPIEtcd.sum(a), watchEvents: familyWatchEvents.sum(a),
		watches: familyWatches.sum(a), etcd: familyEtcd.sum(e)}, nil
}

// since is what was served between before and s.
func (s snapshot) since(before snapshot) *Requests {
	return &Requests{API: s.api.minus(before.api), APIEtcd: s.apiEtcd.minus(before.apiEtcd), Etcd: s.etcd.minus(before.etcd),
		WatchEvents: s.watchEvents.minus(before.watchEvents), Watches: s.watches}
}

// writes is the number of the apiserver's mutating requests on the
// objects a bind touches, to tell when a run's writes have stopped.
func (s snapshot) writes() float64 {
	var sum float64
	for k, v := range s.api {
		verb, res, _ := strings.Cut(k, " ")
		switch verb {
		case "POST", "PUT", "PATCH", "DELETE":
		default:
			continue
		}
		if strings.HasPrefix(res, "persistentvolume") || res == "events" {
			sum += v
		}
	}
	return sum
}
