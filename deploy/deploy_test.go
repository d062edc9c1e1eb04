package deploy_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/internal/daemon"
	"github.com/sluicehq/sluice/internal/metrics"
)

const (
	rulesFile     = "prometheus/sluice-rules.yml"
	rulesTestFile = "prometheus/sluice-rules.test.yml"
	dashboardFile = "grafana/sluice-dashboard.json"
)

// known returns every metric name a Sluice server exposes: its own
// families (with the _bucket, _sum and _count series of histograms) and
// those of the Go and process collectors.
func known(t *testing.T) map[string]bool {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	out := map[string]bool{}
	for name, kind := range m.Names() {
		out[name] = true
		if kind == metrics.KindHistogram {
			out[name+"_bucket"], out[name+"_sum"], out[name+"_count"] = true, true, true
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		out[mf.GetName()] = true
	}
	for _, name := range daemon.SyncMetricNames() {
		out[name] = true
	}
	return out
}

var (
	metricRef    = regexp.MustCompile(`\b((?:sluice|go|process)_[a-zA-Z0-9_]+)`)
	recordingRef = regexp.MustCompile(`\bsluice:[a-zA-Z0-9_:]+`)
)

type rulesDoc struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Record      string            `yaml:"record"`
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func loadRules(t *testing.T) (*rulesDoc, map[string]bool) {
	t.Helper()
	data, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var doc rulesDoc
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	dec.KnownFields(true)
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	records := map[string]bool{}
	for _, g := range doc.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				records[r.Record] = true
			}
		}
	}
	return &doc, records
}

// checkExpr reports the names expr uses that Sluice does not expose.
func checkExpr(t *testing.T, where, expr string, names, records map[string]bool) {
	t.Helper()
	for _, m := range metricRef.FindAllString(expr, -1) {
		if !names[m] {
			t.Errorf("%s: metric %s is not registered by Sluice", where, m)
		}
	}
	for _, r := range recordingRef.FindAllString(expr, -1) {
		if !records[r] {
			t.Errorf("%s: recording rule %s is not defined in %s", where, r, rulesFile)
		}
	}
}

func TestRules(t *testing.T) {
	names := known(t)
	doc, records := loadRules(t)
	var alerts, burn int
	for _, g := range doc.Groups {
		for _, r := range g.Rules {
			where := g.Name + "/" + r.Record + r.Alert
			if (r.Record == "") == (r.Alert == "") || strings.TrimSpace(r.Expr) == "" {
				t.Errorf("%s: want exactly one of record and alert, and an expr", where)
			}
			checkExpr(t, where, r.Expr, names, records)
			if r.Alert != "" {
				alerts++
				if r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
					t.Errorf("%s: an alert needs a severity label and a summary", where)
				}
				// Multi-window: a burn-rate alert tests two windows.
				if strings.Contains(r.Alert, "BudgetBurn") {
					burn++
					if len(recordingRef.FindAllString(r.Expr, -1)) != 2 || !regexp.MustCompile(`\band\b`).MatchString(r.Expr) {
						t.Errorf("%s: a burn-rate alert must test a long and a short window", where)
					}
				}
			}
		}
	}
	if alerts == 0 || burn < 4 {
		t.Errorf("%d alerts, %d burn-rate alerts: want the multi-window burn-rate alerts", alerts, burn)
	}
}

func TestDashboard(t *testing.T) {
	names := known(t)
	_, records := loadRules(t)
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var titles []string
	types := map[string]bool{}
	exprs := 0
	var walk func(v any, where string)
	walk = func(v any, where string) {
		switch v := v.(type) {
		case map[string]any:
			if title, ok := v["title"].(string); ok {
				where = title
				titles = append(titles, strings.ToLower(title))
			}
			if typ, ok := v["type"].(string); ok {
				types[typ] = true
			}
			for k, x := range v {
				if s, ok := x.(string); ok && (k == "expr" || k == "definition") {
					exprs++
					checkExpr(t, where, s, names, records)
				}
				walk(x, where)
			}
		case []any:
			for _, x := range v {
				walk(x, where)
			}
		}
	}
	walk(dash, "dashboard")
	if exprs < 10 {
		t.Errorf("%d queries in the dashboard", exprs)
	}
	if !types["heatmap"] {
		t.Error("no latency heatmap panel")
	}
	all := strings.Join(titles, "\n")
	for _, want := range []string{"checks per second", "block rate", "latency heatmap", "breaker", "reloads"} {
		if !strings.Contains(all, want) {
			t.Errorf("no panel titled with %q", want)
		}
	}
}

// TestPromtool checks and unit-tests the rules with promtool, when it is
// installed (make deps installs it from the system's packages when it can).
func TestPromtool(t *testing.T) {
	path, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not installed; TestRules checked the rules without it")
	}
	for _, args := range [][]string{{"check", "rules", rulesFile}, {"test", "rules", rulesTestFile}} {
		out, err := exec.Command(path, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// docLink matches a link to a section of Sluice's docs, such as
// docs/operations.md#dashboard-and-alerts.
var docLink = regexp.MustCompile(`docs/([a-zA-Z]+\.md)#([a-z0-9-]+)`)

// anchors returns the anchors of the headings of a Markdown file, as
// GitHub makes them: lower case, spaces to '-', punctuation dropped.
func anchors(t *testing.T, file string) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, line := range strings.Split(string(data), "\n") {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.ToLower(strings.TrimSpace(strings.TrimLeft(line, "#")))
		var b strings.Builder
		for _, r := range title {
			switch {
			case r == ' ':
				b.WriteByte('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
				b.WriteRune(r)
			}
		}
		out[b.String()] = true
	}
	return out
}

// TestRulesLinkDocs checks that the sections of the docs the alerts point
// operators to exist.
func TestRulesLinkDocs(t *testing.T) {
	for _, file := range []string{rulesFile, rulesTestFile} {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		links := docLink.FindAllStringSubmatch(string(data), -1)
		if file == rulesFile && len(links) == 0 {
			t.Errorf("%s: no link to the docs", file)
		}
		for _, m := range links {
			if !anchors(t, "../docs/"+m[1])[m[2]] {
				t.Errorf("%s: %s: no such section", file, m[0])
			}
		}
	}
}
