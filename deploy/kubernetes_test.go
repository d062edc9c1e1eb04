package deploy_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/store/redis/redistest"
)

const kubernetesDir = "kubernetes"

// object is one Kubernetes object of the manifests: its header, and the
// document to decode the rest from.
type object struct {
	file       string
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name   string            `yaml:"name"`
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	node *yaml.Node
}

func (o object) decode(t *testing.T, v any) {
	t.Helper()
	if err := o.node.Decode(v); err != nil {
		t.Fatalf("%s: %s %s: %v", o.file, o.Kind, o.Metadata.Name, err)
	}
}

// manifests returns every object of the YAML files under deploy/kubernetes
// but the kustomizations, by kind and name, and the kustomizations' files.
func manifests(t *testing.T) (map[string]object, map[string][]string) {
	t.Helper()
	objects := map[string]object{}
	kustomizations := map[string][]string{}
	err := filepath.WalkDir(kubernetesDir, func(file string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(file, ".yaml") {
			return err
		}
		data, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		if d.Name() == "kustomization.yaml" {
			var k struct{ Resources []string }
			if err := yaml.Unmarshal(data, &k); err != nil {
				return err
			}
			kustomizations[file] = k.Resources
			return nil
		}
		dec := yaml.NewDecoder(bytes.NewReader(data))
		for {
			var n yaml.Node
			if err := dec.Decode(&n); errors.Is(err, io.EOF) {
				return nil
			} else if err != nil {
				return err
			}
			o := object{file: file, node: &n}
			if err := n.Decode(&o); err != nil {
				return err
			}
			if o.APIVersion == "" || o.Kind == "" || o.Metadata.Name == "" {
				t.Errorf("%s: an object without apiVersion, kind or name", file)
			}
			key := o.Kind + "/" + o.Metadata.Name
			if _, dup := objects[key]; dup {
				t.Errorf("%s: %s twice", file, key)
			}
			objects[key] = o
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return objects, kustomizations
}

type probe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port any    `yaml:"port"`
	} `yaml:"httpGet"`
}

type container struct {
	Name  string   `yaml:"name"`
	Image string   `yaml:"image"`
	Args  []string `yaml:"args"`
	Env   []struct {
		Name  string `yaml:"name"`
		Value string `yaml:"value"`
	} `yaml:"env"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	LivenessProbe   *probe `yaml:"livenessProbe"`
	ReadinessProbe  *probe `yaml:"readinessProbe"`
	StartupProbe    *probe `yaml:"startupProbe"`
	Resources       struct{ Requests, Limits map[string]string }
	SecurityContext struct {
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
		ReadOnlyRootFilesystem   bool  `yaml:"readOnlyRootFilesystem"`
	} `yaml:"securityContext"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		SubPath   string `yaml:"subPath"`
	} `yaml:"volumeMounts"`
}

// port returns the number of the container's port p, a name or a number.
func (c container) port(p any) string {
	for _, cp := range c.Ports {
		if p == cp.Name || p == cp.ContainerPort {
			return strconv.Itoa(cp.ContainerPort)
		}
	}
	return ""
}

type deployment struct {
	Spec struct {
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		Template struct {
			Metadata struct{ Labels map[string]string }
			Spec     struct {
				TerminationGracePeriodSeconds int `yaml:"terminationGracePeriodSeconds"`
				SecurityContext               struct {
					RunAsNonRoot bool `yaml:"runAsNonRoot"`
				} `yaml:"securityContext"`
				Containers []container `yaml:"containers"`
				Volumes    []struct {
					Name      string
					ConfigMap struct{ Name string } `yaml:"configMap"`
				} `yaml:"volumes"`
			}
		}
	}
}

type service struct {
	Spec struct {
		Selector map[string]string `yaml:"selector"`
		Ports    []struct {
			Name       string `yaml:"name"`
			Port       int    `yaml:"port"`
			TargetPort any    `yaml:"targetPort"`
		} `yaml:"ports"`
	}
}

// selects reports whether every label of selector is in labels.
func selects(selector, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return len(selector) > 0
}

// sluiceDeployment returns the manifests' Sluice Deployment, its container
// and the settings of its `sluice serve`.
func sluiceDeployment(t *testing.T, objects map[string]object) (deployment, container, map[string]string) {
	t.Helper()
	o, ok := objects["Deployment/sluice"]
	if !ok {
		t.Fatal("no Deployment sluice")
	}
	var d deployment
	o.decode(t, &d)
	if len(d.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("Deployment sluice: %d containers, want one", len(d.Spec.Template.Spec.Containers))
	}
	c := d.Spec.Template.Spec.Containers[0]
	if len(c.Args) == 0 || c.Args[0] != "serve" {
		t.Fatalf("Deployment sluice: args %q: want serve and its flags", c.Args)
	}
	env := readDockerfile(t).env // the image's
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	return d, c, serveFlags(t).settings(t, invocation{where: "Deployment sluice", args: c.Args[1:], env: env})
}

func TestKubernetes(t *testing.T) {
	objects, kustomizations := manifests(t)
	d, c, settings := sluiceDeployment(t, objects)
	pod := d.Spec.Template
	if !selects(d.Spec.Selector.MatchLabels, pod.Metadata.Labels) {
		t.Errorf("Deployment sluice: selector %v does not select its pods %v", d.Spec.Selector.MatchLabels, pod.Metadata.Labels)
	}

	httpPort, grpcPort := listenPorts(t, "Deployment sluice", settings)
	if c.port("http") != httpPort || c.port("grpc") != grpcPort {
		t.Errorf("Deployment sluice: container ports http %s, grpc %s; sluice listens on %s and %s", c.port("http"), c.port("grpc"), httpPort, grpcPort)
	}
	paths := map[string]bool{}
	for name, p := range map[string]*probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe, "startup": c.StartupProbe} {
		if p == nil || p.HTTPGet == nil {
			t.Errorf("Deployment sluice: no HTTP %s probe", name)
			continue
		}
		paths[p.HTTPGet.Path] = true
		if c.port(p.HTTPGet.Port) != httpPort {
			t.Errorf("Deployment sluice: %s probe on port %v, not the HTTP port %s", name, p.HTTPGet.Port, httpPort)
		}
	}
	if c.LivenessProbe != nil && c.LivenessProbe.HTTPGet != nil && c.LivenessProbe.HTTPGet.Path != "/healthz" ||
		c.ReadinessProbe != nil && c.ReadinessProbe.HTTPGet != nil && c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("Deployment sluice: probes %v: want liveness on /healthz, readiness on /readyz", paths)
	}
	if c.Resources.Requests["cpu"] == "" || c.Resources.Requests["memory"] == "" || c.Resources.Limits["memory"] == "" {
		t.Errorf("Deployment sluice: resources %+v: want CPU and memory requests and a memory limit", c.Resources)
	}
	if !pod.Spec.SecurityContext.RunAsNonRoot || c.SecurityContext.AllowPrivilegeEscalation == nil || *c.SecurityContext.AllowPrivilegeEscalation || !c.SecurityContext.ReadOnlyRootFilesystem {
		t.Error("Deployment sluice: want runAsNonRoot, no privilege escalation and a read-only root file system")
	}
	if grace, err := time.ParseDuration(settings["shutdown-timeout"]); err != nil || time.Duration(pod.Spec.TerminationGracePeriodSeconds)*time.Second <= grace {
		t.Errorf("Deployment sluice: terminationGracePeriodSeconds %d, --shutdown-timeout=%s: want the grace period longer", pod.Spec.TerminationGracePeriodSeconds, settings["shutdown-timeout"])
	}

	// The configuration: a file of a ConfigMap mounted as a directory, so
	// that the kubelet updates it and Sluice reloads it.
	name, data := configMapFile(t, objects, pod.Spec.Volumes, c, settings["config"])
	validateConfig(t, "ConfigMap's "+name, name, data)

	svcs := map[string]service{}
	for _, o := range objects {
		if o.Kind == "Service" {
			var s service
			o.decode(t, &s)
			svcs[o.Metadata.Name] = s
		}
	}
	checkStore(t, "Deployment sluice", settings["store"], func(host string) (string, bool) {
		s, ok := svcs[host]
		if !ok || len(s.Spec.Ports) == 0 {
			return "", false
		}
		return strconv.Itoa(s.Spec.Ports[0].Port), true
	})
	checkServices(t, objects, svcs, pod.Metadata.Labels, c, httpPort, grpcPort)
	checkKustomizations(t, objects, kustomizations)
}

// configMapFile returns the name and contents of the file at configPath in
// container c: a key of a ConfigMap mounted as a directory.
func configMapFile(t *testing.T, objects map[string]object, volumes []struct {
	Name      string
	ConfigMap struct{ Name string } `yaml:"configMap"`
}, c container, configPath string) (string, []byte) {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if path.Dir(configPath) != path.Clean(m.MountPath) {
			continue
		}
		if m.SubPath != "" {
			t.Errorf("Deployment sluice: %s is mounted with subPath: the kubelet never updates it", m.MountPath)
		}
		for _, v := range volumes {
			if v.Name != m.Name {
				continue
			}
			o, ok := objects["ConfigMap/"+v.ConfigMap.Name]
			if !ok {
				t.Fatalf("Deployment sluice: volume %s: no ConfigMap %q", v.Name, v.ConfigMap.Name)
			}
			var cm struct{ Data map[string]string }
			o.decode(t, &cm)
			key := path.Base(configPath)
			data, ok := cm.Data[key]
			if !ok {
				t.Fatalf("ConfigMap %s: no key %s for --config=%s", v.ConfigMap.Name, key, configPath)
			}
			return key, []byte(data)
		}
	}
	t.Fatalf("Deployment sluice: --config=%s is in no ConfigMap volume", configPath)
	return "", nil
}

// checkServices checks that the Services, the PodDisruptionBudget, the
// HorizontalPodAutoscaler and the ServiceMonitor point at Sluice's pods
// and ports.
func checkServices(t *testing.T, objects map[string]object, svcs map[string]service, podLabels map[string]string, c container, httpPort, grpcPort string) {
	t.Helper()
	for _, name := range []string{"sluice", "sluice-headless"} {
		s, ok := svcs[name]
		if !ok {
			t.Errorf("no Service %s", name)
			continue
		}
		if !selects(s.Spec.Selector, podLabels) {
			t.Errorf("Service %s: selector %v does not select Sluice's pods", name, s.Spec.Selector)
		}
		for _, p := range s.Spec.Ports {
			want := map[string]string{"http": httpPort, "grpc": grpcPort}[p.Name]
			if got := c.port(p.TargetPort); got == "" || want != "" && got != want {
				t.Errorf("Service %s: port %s targets %v: want Sluice's %s port %s", name, p.Name, p.TargetPort, p.Name, want)
			}
		}
	}

	var pdb struct {
		Spec struct {
			Selector struct {
				MatchLabels map[string]string `yaml:"matchLabels"`
			} `yaml:"selector"`
		}
	}
	objects["PodDisruptionBudget/sluice"].decode(t, &pdb)
	if !selects(pdb.Spec.Selector.MatchLabels, podLabels) {
		t.Errorf("PodDisruptionBudget sluice: selector %v does not select Sluice's pods", pdb.Spec.Selector.MatchLabels)
	}

	var hpa struct {
		Spec struct {
			ScaleTargetRef struct{ Kind, Name string } `yaml:"scaleTargetRef"`
			MinReplicas    int                         `yaml:"minReplicas"`
			MaxReplicas    int                         `yaml:"maxReplicas"`
		}
	}
	objects["HorizontalPodAutoscaler/sluice"].decode(t, &hpa)
	if hpa.Spec.ScaleTargetRef.Kind != "Deployment" || hpa.Spec.ScaleTargetRef.Name != "sluice" || hpa.Spec.MinReplicas < 2 || hpa.Spec.MaxReplicas < hpa.Spec.MinReplicas {
		t.Errorf("HorizontalPodAutoscaler sluice: %+v: want Deployment sluice, 2 replicas at least", hpa.Spec)
	}

	var sm struct {
		Spec struct {
			Selector struct {
				MatchLabels      map[string]string `yaml:"matchLabels"`
				MatchExpressions []struct {
					Key, Operator string
					Values        []string
				} `yaml:"matchExpressions"`
			}
			Endpoints []struct{ Port, Path string }
		}
	}
	o, ok := objects["ServiceMonitor/sluice"]
	if !ok {
		t.Fatal("no ServiceMonitor sluice")
	}
	o.decode(t, &sm)
	var monitored []string
	for name := range svcs {
		labels := objects["Service/"+name].Metadata.Labels
		ok := selects(sm.Spec.Selector.MatchLabels, labels)
		for _, e := range sm.Spec.Selector.MatchExpressions {
			if e.Operator != "NotIn" {
				t.Fatalf("ServiceMonitor sluice: operator %s: the test knows NotIn only", e.Operator)
			}
			ok = ok && !strings.Contains(" "+strings.Join(e.Values, " ")+" ", " "+labels[e.Key]+" ")
		}
		if ok {
			monitored = append(monitored, name)
		}
	}
	if len(monitored) != 1 || monitored[0] != "sluice" {
		t.Fatalf("ServiceMonitor sluice selects the Services %q, want sluice alone (each pod scraped once)", monitored)
	}
	if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "http" || sm.Spec.Endpoints[0].Path != "/metrics" {
		t.Errorf("ServiceMonitor sluice: endpoints %+v, want /metrics on port http", sm.Spec.Endpoints)
	}
}

// checkKustomizations checks that the kustomizations list files that
// exist, and every manifest file between them.
func checkKustomizations(t *testing.T, objects map[string]object, kustomizations map[string][]string) {
	t.Helper()
	listed := map[string]bool{}
	for k, resources := range kustomizations {
		for _, r := range resources {
			p := filepath.Join(filepath.Dir(k), r)
			if _, err := os.Stat(p); err != nil {
				t.Errorf("%s: resource %s: %v", k, r, err)
			}
			listed[p] = true
		}
	}
	for _, o := range objects {
		if !listed[o.file] {
			t.Errorf("%s: in no kustomization.yaml", o.file)
		}
	}
}

// TestKubernetesProbes starts the binary as the Deployment does, with the
// ConfigMap's configuration and a real Redis in place of the example's, and
// asks the paths of its probes and of the ServiceMonitor.
func TestKubernetesProbes(t *testing.T) {
	objects, _ := manifests(t)
	d, c, settings := sluiceDeployment(t, objects)
	name, data := configMapFile(t, objects, d.Spec.Template.Spec.Volumes, c, settings["config"])
	config := validateConfig(t, "ConfigMap's "+name, name, data)
	redis := redistest.Start(t)

	var env []string
	for _, e := range c.Env {
		if e.Value != "" {
			env = append(env, e.Name+"="+e.Value)
		}
	}
	args := append(c.Args[1:], "--config="+config, "--store=redis://"+redis.Addr)
	base := startSluice(t, args, env)
	for _, p := range []*probe{c.LivenessProbe, c.ReadinessProbe, c.StartupProbe} {
		getOK(t, "Deployment sluice: probe", base, p.HTTPGet.Path)
	}
	getOK(t, "ServiceMonitor sluice", base, "/metrics")
}

// TestKustomize builds both kustomizations with kubectl's kustomize, and
// checks the result with kubeconform, when they are installed.
func TestKustomize(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl not installed: `kubectl kustomize deploy/kubernetes` not run; TestKubernetes checked the manifests without it")
	}
	objects, _ := manifests(t)
	for dir, want := range map[string]int{kubernetesDir: len(objects), kubernetesDir + "/base": len(objects) - 1} {
		out, err := exec.Command(kubectl, "kustomize", dir).Output()
		if err != nil {
			t.Errorf("kubectl kustomize %s: %v\n%s", dir, err, stderrOf(err))
			continue
		}
		kinds := map[string]int{}
		dec := yaml.NewDecoder(bytes.NewReader(out))
		n := 0
		for {
			var o object
			if err := dec.Decode(&o); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("kubectl kustomize %s: %v", dir, err)
			}
			n++
			kinds[o.Kind]++
		}
		if n != want {
			t.Errorf("kubectl kustomize %s: %d objects %v, want %d", dir, n, kinds, want)
		}
		kubeconform(t, dir, out)
	}
}

func kubeconform(t *testing.T, dir string, manifests []byte) {
	t.Helper()
	path, err := exec.LookPath("kubeconform")
	if err != nil {
		t.Logf("kubeconform not installed: %s not checked against the Kubernetes schemas", dir)
		return
	}
	cmd := exec.Command(path, "-strict", "-summary", "-ignore-missing-schemas", "-")
	cmd.Stdin = bytes.NewReader(manifests)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("kubeconform %s: %v\n%s", dir, err, out)
	}
}

func stderrOf(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(ee.Stderr)
	}
	return ""
}
