package deploy_test

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

const composeDir = "compose"

// composeFile is the part of deploy/compose/docker-compose.yml the test
// reads.
type composeFile struct {
	Services map[string]composeService `yaml:"services"`
}

type composeService struct {
	Build       struct{ Context string } `yaml:"build"`
	Image       string                   `yaml:"image"`
	Command     []string                 `yaml:"command"`
	Environment envList                  `yaml:"environment"`
	Volumes     []string                 `yaml:"volumes"`
	Ports       []string                 `yaml:"ports"`
	DependsOn   []string                 `yaml:"depends_on"`
}

// envList is a service's environment, written as a map or as a list of
// KEY=value.
type envList map[string]string

func (e *envList) UnmarshalYAML(n *yaml.Node) error {
	*e = envList{}
	if n.Kind == yaml.SequenceNode {
		var list []string
		if err := n.Decode(&list); err != nil {
			return err
		}
		for _, kv := range list {
			k, v, _ := strings.Cut(kv, "=")
			(*e)[k] = v
		}
		return nil
	}
	return n.Decode((*map[string]string)(e))
}

// mounts returns a service's bind mounts: the path in the container to
// the path on the host, relative to the test's directory.
func (s composeService) mounts(t *testing.T, name string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, v := range s.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) < 2 || !strings.HasPrefix(parts[0], ".") {
			continue // a named volume
		}
		host := filepath.Join(composeDir, parts[0])
		if _, err := os.Stat(host); err != nil {
			t.Errorf("compose: %s: volume %s: %v", name, v, err)
		}
		out[parts[1]] = host
	}
	return out
}

// hostPath returns the file on the host that a service sees at p, through
// its bind mounts.
func hostPath(t *testing.T, service string, mounts map[string]string, p string) string {
	t.Helper()
	for dst, src := range mounts {
		if p == dst {
			return src
		}
		if rest, ok := strings.CutPrefix(p, strings.TrimSuffix(dst, "/")+"/"); ok {
			return filepath.Join(src, filepath.FromSlash(rest))
		}
	}
	t.Fatalf("compose: %s: %s is in no volume of the service", service, p)
	return ""
}

// containerPorts returns the container's side of each port mapping.
func containerPorts(ports []string) []string {
	var out []string
	for _, p := range ports {
		p = strings.TrimSuffix(p, "/tcp")
		out = append(out, p[strings.LastIndex(p, ":")+1:])
	}
	return out
}

func readYAML(t *testing.T, file string, v any) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
}

// walk calls fn on every mapping in v, depth first.
func walk(v any, fn func(map[string]any)) {
	switch v := v.(type) {
	case map[string]any:
		fn(v)
		for _, x := range v {
			walk(x, fn)
		}
	case []any:
		for _, x := range v {
			walk(x, fn)
		}
	}
}

func TestCompose(t *testing.T) {
	var c composeFile
	readYAML(t, filepath.Join(composeDir, "docker-compose.yml"), &c)
	for _, want := range []string{"sluice", "redis", "envoy", "upstream", "prometheus", "grafana"} {
		if _, ok := c.Services[want]; !ok {
			t.Errorf("compose: no service %s", want)
		}
	}
	for name, s := range c.Services {
		for _, d := range s.DependsOn {
			if _, ok := c.Services[d]; !ok {
				t.Errorf("compose: %s depends on %s: no such service", name, d)
			}
		}
	}

	// Sluice: the image's command and environment, then the service's.
	sl := c.Services["sluice"]
	if _, err := os.Stat(filepath.Join(composeDir, sl.Build.Context, "Dockerfile")); err != nil {
		t.Errorf("compose: sluice's build context %s: %v", sl.Build.Context, err)
	}
	if len(sl.Command) == 0 || sl.Command[0] != "serve" {
		t.Fatalf("compose: sluice's command %q: want serve and its flags", sl.Command)
	}
	env := readDockerfile(t).env
	for k, v := range sl.Environment {
		env[k] = v
	}
	settings := serveFlags(t).settings(t, invocation{where: "compose: sluice", args: sl.Command[1:], env: env})
	httpPort, grpcPort := listenPorts(t, "compose: sluice", settings)
	if got := containerPorts(sl.Ports); !slices.Contains(got, httpPort) || !slices.Contains(got, grpcPort) {
		t.Errorf("compose: sluice publishes %q, want its HTTP and gRPC ports %s and %s", got, httpPort, grpcPort)
	}
	checkStore(t, "compose: sluice", settings["store"], func(host string) (string, bool) {
		_, ok := c.Services[host]
		return "6379", ok
	})
	mounts := sl.mounts(t, "sluice")
	if settings["config"] == "" {
		t.Fatal("compose: sluice has no --config")
	}
	configFile := hostPath(t, "sluice", mounts, settings["config"])
	data, err := os.ReadFile(configFile)
	if err != nil {
		t.Fatal(err)
	}
	validateConfig(t, "compose: "+configFile, filepath.Base(configFile), data)
	var policy struct{ Domain string }
	readYAML(t, configFile, &policy)

	checkEnvoy(t, c, policy.Domain, grpcPort)
	checkPrometheus(t, c, httpPort)
	checkGrafana(t, c)
	composeConfig(t)
}

// checkStore checks that a store URL names a host of the deployment, at
// the port it serves (service returns it, and whether the host is one).
func checkStore(t *testing.T, where, store string, service func(host string) (port string, ok bool)) {
	t.Helper()
	u, err := url.Parse(store)
	if err != nil || u.Scheme != "redis" {
		t.Errorf("%s: --store=%s: want a redis:// URL (%v)", where, store, err)
		return
	}
	port, ok := service(u.Hostname())
	if !ok {
		t.Errorf("%s: --store=%s: no service %s", where, store, u.Hostname())
	} else if u.Port() != port {
		t.Errorf("%s: --store=%s: %s serves port %s", where, store, u.Hostname(), port)
	}
}

// checkEnvoy checks envoy.yaml: its rate limit filter asks Sluice's gRPC
// port over HTTP/2 for the policy's domain, and its routes go to a
// service's port.
func checkEnvoy(t *testing.T, c composeFile, domain, grpcPort string) {
	t.Helper()
	ev := c.Services["envoy"]
	var cfg map[string]any
	readYAML(t, hostPath(t, "envoy", ev.mounts(t, "envoy"), "/etc/envoy/envoy.yaml"), &cfg)

	type cluster struct {
		addr  string
		http2 bool
	}
	clusters := map[string]cluster{}
	var rlCluster, rlDomain string
	var routes, listeners []string
	walk(cfg, func(m map[string]any) {
		if cs, ok := m["clusters"].([]any); ok {
			for _, x := range cs {
				cm, _ := x.(map[string]any)
				var cl cluster
				walk(cm, func(m map[string]any) {
					if sa, ok := m["socket_address"].(map[string]any); ok {
						cl.addr = net.JoinHostPort(fmt.Sprint(sa["address"]), fmt.Sprint(sa["port_value"]))
					}
					_, h2 := m["http2_protocol_options"]
					cl.http2 = cl.http2 || h2
				})
				clusters[fmt.Sprint(cm["name"])] = cl
			}
		}
		if typ, _ := m["@type"].(string); strings.HasSuffix(typ, "ratelimit.v3.RateLimit") {
			rlDomain, _ = m["domain"].(string)
			walk(m, func(m map[string]any) {
				if g, ok := m["envoy_grpc"].(map[string]any); ok {
					rlCluster, _ = g["cluster_name"].(string)
				}
			})
		}
		if r, ok := m["route"].(map[string]any); ok {
			if name, ok := r["cluster"].(string); ok {
				routes = append(routes, name)
			}
		}
		if ls, ok := m["listeners"].([]any); ok {
			for _, l := range ls {
				walk(l, func(m map[string]any) {
					if sa, ok := m["socket_address"].(map[string]any); ok {
						listeners = append(listeners, fmt.Sprint(sa["port_value"]))
					}
				})
			}
		}
	})
	if rlDomain != domain {
		t.Errorf("envoy.yaml: the rate limit filter's domain %q, want the policy's %q", rlDomain, domain)
	}
	if want := net.JoinHostPort("sluice", grpcPort); clusters[rlCluster].addr != want || !clusters[rlCluster].http2 {
		t.Errorf("envoy.yaml: the rate limit service's cluster %q is %+v, want %s over HTTP/2", rlCluster, clusters[rlCluster], want)
	}
	if len(routes) == 0 {
		t.Error("envoy.yaml: no route")
	}
	for _, r := range routes {
		host, port, _ := net.SplitHostPort(clusters[r].addr)
		s, ok := c.Services[host]
		if !ok || !strings.Contains(strings.Join(s.Command, " "), ":"+port) {
			t.Errorf("envoy.yaml: route to cluster %s at %s: no service listening there", r, clusters[r].addr)
		}
	}
	published := containerPorts(ev.Ports)
	for _, l := range listeners {
		if !slices.Contains(published, l) {
			t.Errorf("envoy.yaml: listener port %s is not published (%q)", l, published)
		}
	}
}

// checkPrometheus checks prometheus.yml: it scrapes Sluice's metrics and
// loads Sluice's rules, mounted from deploy/prometheus.
func checkPrometheus(t *testing.T, c composeFile, httpPort string) {
	t.Helper()
	p := c.Services["prometheus"]
	mounts := p.mounts(t, "prometheus")
	file := hostPath(t, "prometheus", mounts, "/etc/prometheus/prometheus.yml")
	var cfg struct {
		RuleFiles     []string `yaml:"rule_files"`
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			MetricsPath   string `yaml:"metrics_path"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	readYAML(t, file, &cfg)
	scraped := false
	for _, sc := range cfg.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			if slices.Contains(st.Targets, net.JoinHostPort("sluice", httpPort)) {
				scraped = sc.MetricsPath == "" || sc.MetricsPath == "/metrics"
			}
		}
	}
	if !scraped {
		t.Errorf("%s: no job scrapes sluice:%s/metrics", file, httpPort)
	}
	rules := false
	for _, rf := range cfg.RuleFiles {
		src := hostPath(t, "prometheus", mounts, rf)
		rules = rules || filepath.Clean(src) == filepath.Clean(rulesFile)
	}
	if !rules {
		t.Errorf("%s: rule_files %q: none is %s", file, cfg.RuleFiles, rulesFile)
	}
	if promtool, err := exec.LookPath("promtool"); err != nil {
		t.Log("promtool not installed: `promtool check config` not run")
	} else if out, err := exec.Command(promtool, "check", "config", "--syntax-only", file).CombinedOutput(); err != nil {
		t.Errorf("promtool check config --syntax-only %s: %v\n%s", file, err, out)
	}
}

// checkGrafana checks that Grafana is provisioned with a Prometheus data
// source of the compose file and Sluice's dashboard.
func checkGrafana(t *testing.T, c composeFile) {
	t.Helper()
	g := c.Services["grafana"]
	mounts := g.mounts(t, "grafana")
	prov := hostPath(t, "grafana", mounts, "/etc/grafana/provisioning")
	var ds struct {
		Datasources []struct {
			Type, URL string
			IsDefault bool `yaml:"isDefault"`
		}
	}
	readYAML(t, filepath.Join(prov, "datasources", "prometheus.yaml"), &ds)
	if len(ds.Datasources) != 1 || ds.Datasources[0].Type != "prometheus" || !ds.Datasources[0].IsDefault {
		t.Errorf("grafana: data sources %+v: want Prometheus, the default", ds.Datasources)
	} else if u, err := url.Parse(ds.Datasources[0].URL); err != nil || u.Port() != "9090" || c.Services[u.Hostname()].Image == "" {
		t.Errorf("grafana: data source %s: not the compose file's Prometheus", ds.Datasources[0].URL)
	}
	var dash struct {
		Providers []struct {
			Options struct{ Path string }
		}
	}
	readYAML(t, filepath.Join(prov, "dashboards", "sluice.yaml"), &dash)
	if len(dash.Providers) != 1 {
		t.Fatalf("grafana: %d dashboard providers, want Sluice's", len(dash.Providers))
	}
	dir := hostPath(t, "grafana", mounts, dash.Providers[0].Options.Path)
	if _, err := os.Stat(filepath.Join(dir, path.Base(dashboardFile))); err != nil {
		t.Errorf("grafana: the dashboards' directory %s has no %s: %v", dir, path.Base(dashboardFile), err)
	}
}

// composeConfig runs `docker compose config`, which parses and checks the
// file without a Docker daemon, or `docker-compose config`, when either is
// installed.
func composeConfig(t *testing.T) {
	t.Helper()
	file := filepath.Join(composeDir, "docker-compose.yml")
	var cmd *exec.Cmd
	if docker, err := exec.LookPath("docker"); err == nil && exec.Command(docker, "compose", "version").Run() == nil {
		cmd = exec.Command(docker, "compose", "-f", file, "config", "--quiet")
	} else if dc, err := exec.LookPath("docker-compose"); err == nil {
		cmd = exec.Command(dc, "-f", file, "config", "--quiet")
	} else {
		t.Log("neither `docker compose` nor docker-compose installed: `docker compose config` not run")
		return
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, out)
	}
}
