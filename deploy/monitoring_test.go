package deploy

import (
	"encoding/json"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	sigyaml "sigs.k8s.io/yaml"

	// Every volplane process's metrics, registered as they are when it
	// runs (at init).
	_ "github.com/volplane/volplane/gateway"
	_ "github.com/volplane/volplane/internal/etcdmember"
	_ "github.com/volplane/volplane/pkg/coord"
	_ "github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/metrics"
	_ "github.com/volplane/volplane/services/binder"
	_ "github.com/volplane/volplane/services/provisioner"
	_ "github.com/volplane/volplane/services/reclaimer"
	_ "github.com/volplane/volplane/services/watcher"
	"github.com/volplane/volplane/test/harness/manifests"
)

const monitoring = "kubernetes/monitoring"

// registered is every metric name a volplane process registers: the
// services' registry (samples or not) and volplane-etcd-member's
// (client_golang's default registry, with etcd's own).
func registered(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	for _, d := range metrics.Descs() {
		names[metrics.DescName(d)] = true
	}
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "volplane_") {
			names[mf.GetName()] = true
		}
	}
	if len(names) < 20 {
		t.Fatalf("only %d metrics registered: %v", len(names), names)
	}
	return names
}

// documented is every metric name docs/metrics.md lists (in backticks).
func documented(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile("../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, m := range regexp.MustCompile("`([a-z_:][a-z0-9_:]*)`").FindAllStringSubmatch(string(b), -1) {
		names[m[1]] = true
	}
	return names
}

// Every metric a volplane process registers is in docs/metrics.md, but
// the Go runtime's and the process's (go_*, process_*, listed as such).
func TestEveryMetricIsDocumented(t *testing.T) {
	docs := documented(t)
	var missing []string
	for name := range registered(t) {
		if strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_") {
			continue
		}
		if !docs[name] {
			missing = append(missing, name)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("docs/metrics.md does not list %v", missing)
	}
}

// promqlNoise is what an expression holds besides metric names: strings,
// label matchers, range and subquery durations, and the label lists of
// by, without, on, ignoring and group_*.
var (
	promqlString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'`)
	promqlMatchers = regexp.MustCompile(`\{[^}]*\}`)
	promqlRange    = regexp.MustCompile(`\[[^\]]*\]`)
	promqlLabels   = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promqlIdent    = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*`)
	promqlKeywords = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "by": true,
		"without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true, "inf": true, "nan": true, "Inf": true, "NaN": true}
)

// metricNames is a light parse of a PromQL expression: the identifiers
// that are neither functions (followed by "("), keywords, label names nor
// parts of numbers or durations.
func metricNames(expr string) []string {
	e := promqlString.ReplaceAllString(expr, `""`)
	e = promqlMatchers.ReplaceAllString(e, "{}")
	e = promqlRange.ReplaceAllString(e, "[]")
	e = promqlLabels.ReplaceAllString(e, "")
	var names []string
	for _, loc := range promqlIdent.FindAllStringIndex(e, -1) {
		id := e[loc[0]:loc[1]]
		if promqlKeywords[id] {
			continue
		}
		if loc[0] > 0 && (e[loc[0]-1] >= '0' && e[loc[0]-1] <= '9' || e[loc[0]-1] == '.') {
			continue // 1e3, 0.5
		}
		if rest := strings.TrimLeft(e[loc[1]:], " \t\n"); strings.HasPrefix(rest, "(") {
			continue // a function
		}
		names = append(names, id)
	}
	return names
}

func TestMetricNamesParse(t *testing.T) {
	for expr, want := range map[string]string{
		`max by (storage_class) (volplane_binder_oldest_pending_claim_seconds) > 15 * 60`:                                  "volplane_binder_oldest_pending_claim_seconds",
		`histogram_quantile(0.99, sum by (le, verb) (rate(rest_client_request_duration_seconds_bucket{job=~"a-.*"}[5m])))`: "rest_client_request_duration_seconds_bucket",
		`up{job=~"volplane-.*"} == 0 and on (pod) volplane_etcd_session`:                                                   "up volplane_etcd_session",
		`sum without (code) (rate(x_total[1h:5m] offset 1d)) / ignoring (a) group_left (b) y > 1e3 unless z`:               "x_total y z",
	} {
		if got := strings.Join(metricNames(expr), " "); got != want {
			t.Errorf("metricNames(%s) = %q, want %q", expr, got, want)
		}
	}
}

// known reports whether a metric name an expression uses exists: a
// registered or documented metric, or a histogram's series of one.
func known(name string, reg, docs map[string]bool) bool {
	if reg[name] || docs[name] {
		return true
	}
	for _, suffix := range []string{"_bucket", "_count", "_sum"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && (reg[base] || docs[base]) {
			return true
		}
	}
	return false
}

// The monitoring kustomization renders; every alert has a runbook in
// docs/troubleshooting.md, and every metric an alert or a dashboard panel
// names exists.
func TestAlertsAndDashboardNameMetricsThatExist(t *testing.T) {
	_, objs, err := manifests.Render(monitoring)
	if err != nil {
		t.Fatal(err)
	}
	reg, docs := registered(t), documented(t)
	trouble, err := os.ReadFile("../docs/troubleshooting.md")
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	exprs := map[string]string{} // where -> expression
	for _, o := range objs {
		kinds[o.GetKind()]++
		if o.GetNamespace() != "volplane-system" {
			t.Errorf("%s %s in namespace %q, want volplane-system", o.GetKind(), o.GetName(), o.GetNamespace())
		}
		switch o.GetKind() {
		case "PrometheusRule":
			var spec struct {
				Groups []struct {
					Rules []struct {
						Alert, Expr, For string
						Annotations      map[string]string
					}
				}
			}
			b, _ := json.Marshal(o.Object["spec"])
			if err := json.Unmarshal(b, &spec); err != nil {
				t.Fatal(err)
			}
			for _, g := range spec.Groups {
				for _, r := range g.Rules {
					exprs["alert "+r.Alert] = r.Expr
					anchor := "#" + strings.ToLower(r.Alert)
					if !strings.HasSuffix(r.Annotations["runbook_url"], "docs/troubleshooting.md"+anchor) {
						t.Errorf("alert %s: runbook_url %q, want docs/troubleshooting.md%s", r.Alert, r.Annotations["runbook_url"], anchor)
					}
					if !strings.Contains(string(trouble), "## "+r.Alert+"\n") {
						t.Errorf("alert %s has no section in docs/troubleshooting.md", r.Alert)
					}
				}
			}
		case "ConfigMap":
			if o.GetLabels()["grafana_dashboard"] == "" {
				t.Errorf("ConfigMap %s has no grafana_dashboard label: Grafana's sidecar would not load it", o.GetName())
			}
			data, _ := o.Object["data"].(map[string]any)
			for file, text := range data {
				var d struct {
					Panels []struct {
						Title   string
						Targets []struct{ Expr string }
					}
				}
				if err := json.Unmarshal([]byte(text.(string)), &d); err != nil {
					t.Fatalf("dashboard %s: %v", file, err)
				}
				for _, p := range d.Panels {
					for i, tg := range p.Targets {
						exprs["panel "+p.Title+" #"+string(rune('A'+i))] = tg.Expr
					}
				}
			}
		}
	}
	for _, k := range []string{"ServiceMonitor", "PrometheusRule", "ConfigMap", "Service"} {
		if kinds[k] == 0 {
			t.Errorf("the monitoring kustomization has no %s", k)
		}
	}
	alerts := 0
	for where, expr := range exprs {
		if strings.HasPrefix(where, "alert ") {
			alerts++
		}
		names := metricNames(expr)
		if len(names) == 0 {
			t.Errorf("%s: no metric in %q", where, expr)
		}
		for _, n := range names {
			if !known(n, reg, docs) {
				t.Errorf("%s names %s, which no volplane process registers and docs/metrics.md does not list: %s", where, n, expr)
			}
		}
	}
	for _, want := range []string{"VolplaneClaimPendingTooLong", "VolplaneProvisioningFailing", "VolplaneJournalRecordStuck",
		"VolplaneOrphanedVolumes", "VolplaneEtcdSessionLost", "VolplaneSecondBinderActive",
		"VolplaneBinderAbsent", "VolplaneProvisionerAbsent", "VolplaneCertificateExpiring", "VolplaneEtcdBackupTooOld",
		"VolplaneEtcdNoLeader", "VolplaneEtcdDatabaseNearQuota", "VolplaneEtcdMemberWaiting"} {
		if _, ok := exprs["alert "+want]; !ok {
			t.Errorf("no alert %s", want)
		}
	}
}

// The check above catches a misspelt metric.
func TestAlertCheckCatchesUnknownMetric(t *testing.T) {
	reg, docs := registered(t), documented(t)
	for _, n := range metricNames(`sum(rate(volplane_binder_retrys_total[5m])) > 0`) {
		if known(n, reg, docs) {
			t.Errorf("%s passes as a metric", n)
		}
	}
}

// The base applies on clusters without the Prometheus Operator: none of
// its objects is of monitoring.coreos.com.
func TestBaseNeedsNoMonitoringCRDs(t *testing.T) {
	for _, dir := range kustomizations {
		_, objs, err := manifests.Render(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			if strings.HasPrefix(o.GetAPIVersion(), "monitoring.coreos.com/") {
				t.Errorf("%s renders %s %s: the base must apply without the Prometheus Operator's CRDs", dir, o.GetKind(), o.GetName())
			}
		}
	}
}

// ruleGroups is the groups of the rendered PrometheusRule, as JSON values.
func ruleGroups(t *testing.T) []any {
	t.Helper()
	_, objs, err := manifests.Render(monitoring)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetKind() == "PrometheusRule" {
			spec, _ := o.Object["spec"].(map[string]any)
			groups, _ := spec["groups"].([]any)
			return groups
		}
	}
	t.Fatal("the monitoring kustomization has no PrometheusRule")
	return nil
}

// The plain rule file promtool checks and tests (make verify-alerts) is
// the PrometheusRule's groups, unchanged: the one source is
// prometheusrule.yaml, and make fix-alerts writes the plain form.
func TestPlainRulesMatchThePrometheusRule(t *testing.T) {
	b, err := os.ReadFile(monitoring + "/promtool/volplane.rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var plain struct {
		Groups []any `json:"groups"`
	}
	if err := sigyaml.UnmarshalStrict(b, &plain); err != nil {
		t.Fatal(err)
	}
	if want := ruleGroups(t); !reflect.DeepEqual(plain.Groups, want) {
		t.Errorf("%s/promtool/volplane.rules.yaml differs from the PrometheusRule: run make fix-alerts", monitoring)
	}
}

// promtoolTests is the part of promtool's unit test file this test reads.
type promtoolTests struct {
	RuleFiles []string `json:"rule_files"`
	Tests     []struct {
		Name          string `json:"name"`
		AlertRuleTest []struct {
			Alertname string           `json:"alertname"`
			ExpAlerts []map[string]any `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

// Every alert has a promtool unit test where it fires and one where it
// must not (an evaluation expecting no alert of that name; the
// evaluations that fire list every alert exactly, so their other series
// must not fire either).
func TestEveryAlertHasAPromtoolTest(t *testing.T) {
	b, err := os.ReadFile(monitoring + "/promtool/volplane_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var tests promtoolTests
	if err := sigyaml.Unmarshal(b, &tests); err != nil {
		t.Fatal(err)
	}
	if len(tests.RuleFiles) != 1 || tests.RuleFiles[0] != "volplane.rules.yaml" {
		t.Errorf("rule_files %v, want [volplane.rules.yaml]", tests.RuleFiles)
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tg := range tests.Tests {
		for _, a := range tg.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	alerts := 0
	for _, g := range ruleGroups(t) {
		rules, _ := g.(map[string]any)["rules"].([]any)
		for _, r := range rules {
			name, _ := r.(map[string]any)["alert"].(string)
			alerts++
			if !fires[name] {
				t.Errorf("alert %s: no promtool test where it fires", name)
			}
			if !quiet[name] {
				t.Errorf("alert %s: no promtool test where it must not fire", name)
			}
		}
	}
	if alerts < 20 {
		t.Errorf("only %d alerting rules", alerts)
	}
}
