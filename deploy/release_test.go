package deploy_test

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

const (
	dockerfilePath   = "../Dockerfile"
	dockerignorePath = "../.dockerignore"
	goreleaserPath   = "../.goreleaser.yaml"
	changelogPath    = "../CHANGELOG.md"
)

// dockerfile is what the tests read of a Dockerfile: each stage's base
// image, and the final stage's environment, ports, user and command.
type dockerfile struct {
	from       []string
	env        map[string]string
	expose     []string
	user       string
	copies     []string // the final stage's COPY instructions' arguments
	entrypoint []string
	cmd        []string
	runs       []string
}

func readDockerfile(t *testing.T) dockerfile {
	t.Helper()
	data, err := os.ReadFile(dockerfilePath)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	var cur strings.Builder
	for _, line := range strings.Split(string(data), "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") || trimmed == "" && cur.Len() == 0 {
			continue
		}
		if s, ok := strings.CutSuffix(trimmed, `\`); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(trimmed)
		lines = append(lines, cur.String())
		cur.Reset()
	}
	var d dockerfile
	array := func(where, s string) []string {
		var out []string
		if err := json.Unmarshal([]byte(s), &out); err != nil {
			t.Errorf("Dockerfile: %s %s: want the exec form, a JSON array: %v", where, s, err)
		}
		return out
	}
	for _, line := range lines {
		op, rest, _ := strings.Cut(line, " ")
		rest = strings.TrimSpace(rest)
		switch strings.ToUpper(op) {
		case "FROM":
			d.from = append(d.from, strings.Fields(rest)[0])
			d.env, d.expose, d.user, d.copies, d.entrypoint, d.cmd = map[string]string{}, nil, "", nil, nil, nil
		case "ENV":
			for _, kv := range strings.Fields(rest) {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					t.Errorf("Dockerfile: ENV %s: want KEY=value", rest)
				}
				d.env[k] = v
			}
		case "EXPOSE":
			d.expose = append(d.expose, strings.Fields(rest)...)
		case "USER":
			d.user = rest
		case "COPY":
			d.copies = append(d.copies, rest)
		case "ENTRYPOINT":
			d.entrypoint = array(op, rest)
		case "CMD":
			d.cmd = array(op, rest)
		case "RUN":
			d.runs = append(d.runs, rest)
		}
	}
	return d
}

func TestDockerfile(t *testing.T) {
	d := readDockerfile(t)
	if len(d.from) < 2 || !strings.HasPrefix(d.from[0], "golang:1.26") {
		t.Errorf("stages from %q: want a golang:1.26 build stage, then the image's", d.from)
	}
	final := d.from[len(d.from)-1]
	if !(strings.HasPrefix(final, "gcr.io/distroless/static") && strings.HasSuffix(final, ":nonroot") || final == "scratch") {
		t.Errorf("final image %s: want distroless/static:nonroot or scratch", final)
	}
	if u, _, _ := strings.Cut(d.user, ":"); u == "" || u == "0" || u == "root" {
		t.Errorf("USER %q: want a non-root user", d.user)
	}
	build := ""
	for _, r := range d.runs {
		if strings.Contains(r, "go build") {
			build = r
		}
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "./cmd/sluice"} {
		if !strings.Contains(build, want) {
			t.Errorf("the go build step does not have %s: %s", want, build)
		}
	}
	if len(d.entrypoint) != 1 || len(d.cmd) == 0 || d.cmd[0] != "serve" {
		t.Fatalf("ENTRYPOINT %q CMD %q: want the binary, then serve", d.entrypoint, d.cmd)
	}
	copied := false
	for _, c := range d.copies {
		f := strings.Fields(c)
		copied = copied || strings.HasPrefix(c, "--from=") && f[len(f)-1] == d.entrypoint[0]
	}
	if !copied {
		t.Errorf("ENTRYPOINT %s: no COPY --from the build stage puts the binary there", d.entrypoint[0])
	}

	cli := serveFlags(t)
	s := cli.settings(t, invocation{where: "Dockerfile", args: d.cmd[1:], env: d.env})
	httpPort, grpcPort := listenPorts(t, "Dockerfile", s)
	if want := []string{httpPort, grpcPort}; !slices.Equal(slices.Sorted(slices.Values(d.expose)), slices.Sorted(slices.Values(want))) {
		t.Errorf("EXPOSE %q, want the HTTP and gRPC ports %q", d.expose, want)
	}
}

func TestDockerignore(t *testing.T) {
	data, err := os.ReadFile(dockerignorePath)
	if err != nil {
		t.Fatal(err)
	}
	ignored := func(name string) bool {
		for _, line := range strings.Split(string(data), "\n") {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			if ok, _ := filepath.Match(line, name); ok {
				return true
			}
		}
		return false
	}
	for _, name := range []string{"go.mod", "go.sum", "cmd", "internal", "store", "algorithm", "limiter", "proto"} {
		if ignored(name) {
			t.Errorf(".dockerignore leaves out %s, which the build needs", name)
		}
	}
	if !ignored(".git") {
		t.Error(".dockerignore sends .git to the build")
	}
}

// buildinfoVars returns the import path of internal/buildinfo and the
// package-level string variables the linker's -X may set there.
func buildinfoVars(t *testing.T) (string, map[string]bool) {
	t.Helper()
	mod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^module\s+(\S+)`).FindSubmatch(mod)
	if m == nil {
		t.Fatal("go.mod: no module line")
	}
	files, err := filepath.Glob("../internal/buildinfo/*.go")
	if err != nil {
		t.Fatal(err)
	}
	vars := map[string]bool{}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.VAR {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				if id, ok := vs.Type.(*ast.Ident); ok && id.Name == "string" {
					for _, n := range vs.Names {
						vars[n.Name] = true
					}
				}
			}
		}
	}
	return string(m[1]) + "/internal/buildinfo", vars
}

var linkerX = regexp.MustCompile(`-X[= ]+([\w./-]+)\.(\w+)=`)

// TestLinkerFlags checks that the Dockerfile and the release builds set
// the version, commit and date that internal/buildinfo reads.
func TestLinkerFlags(t *testing.T) {
	pkg, vars := buildinfoVars(t)
	for _, want := range []string{"version", "commit", "date"} {
		if !vars[want] {
			t.Fatalf("internal/buildinfo has no string variable %s: %v", want, vars)
		}
	}
	for _, file := range []string{dockerfilePath, goreleaserPath} {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		set := map[string]bool{}
		for _, m := range linkerX.FindAllStringSubmatch(string(data), -1) {
			if m[1] != pkg || !vars[m[2]] {
				t.Errorf("%s: -X %s.%s: internal/buildinfo (%s) has no such variable", file, m[1], m[2], pkg)
			}
			set[m[2]] = true
		}
		for v := range vars {
			if !set[v] {
				t.Errorf("%s: does not set %s.%s", file, pkg, v)
			}
		}
	}
}

// goreleaserConfig is the part of .goreleaser.yaml the test reads.
type goreleaserConfig struct {
	Version int `yaml:"version"`
	Builds  []struct {
		ID      string   `yaml:"id"`
		Dir     string   `yaml:"dir"`
		Main    string   `yaml:"main"`
		Binary  string   `yaml:"binary"`
		Env     []string `yaml:"env"`
		GOOS    []string `yaml:"goos"`
		GOARCH  []string `yaml:"goarch"`
		Flags   []string `yaml:"flags"`
		Ldflags []string `yaml:"ldflags"`
	} `yaml:"builds"`
	Archives []struct {
		Files []string `yaml:"files"`
	} `yaml:"archives"`
	Checksum struct {
		NameTemplate string `yaml:"name_template"`
	} `yaml:"checksum"`
	SBOMs []struct {
		Artifacts string   `yaml:"artifacts"`
		Cmd       string   `yaml:"cmd"`
		Documents []string `yaml:"documents"`
	} `yaml:"sboms"`
}

func TestGoreleaser(t *testing.T) {
	data, err := os.ReadFile(goreleaserPath)
	if err != nil {
		t.Fatal(err)
	}
	var c goreleaserConfig
	if err := yaml.Unmarshal(data, &c); err != nil {
		t.Fatalf("%s: %v", goreleaserPath, err)
	}
	// Two builds: sluice, and the load generator from the bench module.
	if c.Version != 2 || len(c.Builds) != 2 {
		t.Fatalf("%s: version %d, %d builds: want version 2 and the builds of sluice and sluice-load", goreleaserPath, c.Version, len(c.Builds))
	}
	for i, want := range []struct{ dir, main, binary string }{{"", "./cmd/sluice", "sluice"}, {"bench", "./cmd/sluice-load", "sluice-load"}} {
		b := c.Builds[i]
		if _, err := os.Stat(filepath.Join("..", b.Dir, b.Main)); err != nil || b.Dir != want.dir || b.Main != want.main || b.Binary != want.binary {
			t.Errorf("build dir %q main %q binary %q: want %s in %q as %s (%v)", b.Dir, b.Main, b.Binary, want.main, want.dir, want.binary, err)
		}
		for _, want := range []string{"linux", "darwin"} {
			if !slices.Contains(b.GOOS, want) {
				t.Errorf("%s: goos %q: no %s", b.Binary, b.GOOS, want)
			}
		}
		for _, want := range []string{"amd64", "arm64"} {
			if !slices.Contains(b.GOARCH, want) {
				t.Errorf("%s: goarch %q: no %s", b.Binary, b.GOARCH, want)
			}
		}
		if !slices.Contains(b.Env, "CGO_ENABLED=0") || !slices.Contains(b.Flags, "-trimpath") {
			t.Errorf("%s: env %q flags %q: want a static build (CGO_ENABLED=0) with -trimpath", b.Binary, b.Env, b.Flags)
		}
	}
	if c.Checksum.NameTemplate == "" {
		t.Error("no checksum file")
	}
	// An SBOM of each archive, made by syft (goreleaser's default), one
	// document per archive named after it.
	if len(c.SBOMs) != 1 {
		t.Fatalf("%d sboms sections, want one: an SBOM of each archive", len(c.SBOMs))
	}
	if sb := c.SBOMs[0]; sb.Artifacts != "archive" || sb.Cmd != "" && sb.Cmd != "syft" ||
		len(sb.Documents) != 1 || !strings.Contains(sb.Documents[0], "{{ .ArtifactName }}") {
		t.Errorf("sboms: artifacts %q, cmd %q, documents %q: want an SBOM of each archive by syft, named after it", sb.Artifacts, sb.Cmd, sb.Documents)
	}
	if _, err := exec.LookPath("syft"); err != nil {
		t.Log("syft not installed: a release here would fail at its SBOMs")
	}
	for _, a := range c.Archives {
		for _, pattern := range a.Files {
			if m, _ := filepath.Glob(filepath.Join("..", pattern)); len(m) == 0 {
				t.Errorf("archive file %s: matches nothing", pattern)
			}
		}
	}
	if path, err := exec.LookPath("goreleaser"); err != nil {
		t.Log("goreleaser not installed: `goreleaser check` not run")
	} else {
		cmd := exec.Command(path, "check")
		cmd.Dir = ".."
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("goreleaser check: %v\n%s", err, out)
		}
	}
}

// TestChangelog checks CHANGELOG.md's shape, as Keep a Changelog has it.
func TestChangelog(t *testing.T) {
	data, err := os.ReadFile(changelogPath)
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	for _, want := range []string{"# Changelog\n", "keepachangelog.com", "\n## [Unreleased]\n", "\n### Added\n", "\n[Unreleased]: "} {
		if !strings.Contains(text, want) {
			t.Errorf("CHANGELOG.md has no %q", strings.TrimSpace(want))
		}
	}
	version := regexp.MustCompile(`(?m)^## \[(.+?)\]`)
	for _, m := range version.FindAllStringSubmatch(text, -1) {
		if m[1] != "Unreleased" && !regexp.MustCompile(`^\d+\.\d+\.\d+`).MatchString(m[1]) {
			t.Errorf("CHANGELOG.md: section [%s]: want Unreleased or a version X.Y.Z", m[1])
		}
		if !strings.Contains(text, "\n["+m[1]+"]: ") {
			t.Errorf("CHANGELOG.md: section [%s] has no link", m[1])
		}
	}
}

// TestPackagingLinksDocs checks the links to the docs' sections in the
// packaging files.
func TestPackagingLinksDocs(t *testing.T) {
	files := []string{dockerfilePath, goreleaserPath}
	for _, dir := range []string{"compose", "kubernetes"} {
		filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				files = append(files, path)
			}
			return err
		})
	}
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range docLink.FindAllStringSubmatch(string(data), -1) {
			if !anchors(t, "../docs/"+m[1])[m[2]] {
				t.Errorf("%s: %s: no such section", file, m[0])
			}
		}
	}
	// docs/deploy.md's own links to sections of the other docs.
	data, err := os.ReadFile("../docs/deploy.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mdLink.FindAllStringSubmatch(string(data), -1) {
		if !anchors(t, "../docs/"+m[1])[m[2]] {
			t.Errorf("docs/deploy.md: %s: no such section", m[0])
		}
	}
}

// mdLink matches a Markdown link to a section of a doc beside the one it
// is in, such as (operations.md#metrics).
var mdLink = regexp.MustCompile(`\]\(([a-zA-Z]+\.md)#([a-z0-9-]+)\)`)
