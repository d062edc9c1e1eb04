// Package testbin builds the servers that tests start (etcd, toxiproxy,
// NATS) from the tools modules under internal/tools. Each tools module
// has its own go.mod, which keeps the servers and their dependencies out
// of Sluice's. A binary is built once into the user's cache directory,
// named by a hash of the module's files, so test processes share it and
// a change to the module builds a new one.
package testbin

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
)

var (
	mu    sync.Mutex
	built = map[string]result{} // by module and package: one build per test process
)

type result struct {
	path string
	err  error
}

// Build returns the path of an executable of package pkg ("." for the
// module's own main package) built in the tools module at module, a
// directory relative to the main module's root such as
// "internal/tools/etcd". name names the file in the cache. It builds
// once per process, and not at all when the cache already holds the
// binary of the module's current files. Build is safe for concurrent
// use, also by several test processes at once.
func Build(module, pkg, name string) (string, error) {
	mu.Lock()
	defer mu.Unlock()
	k := module + "\x00" + pkg
	r, ok := built[k]
	if !ok {
		r.path, r.err = build(module, pkg, name)
		built[k] = r
	}
	return r.path, r.err
}

func build(module, pkg, name string) (string, error) {
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("find the main module with `go env GOMOD`: %w", err)
	}
	dir := filepath.Join(filepath.Dir(strings.TrimSpace(string(gomod))), filepath.FromSlash(module))
	sum, err := hashModule(dir)
	if err != nil {
		return "", fmt.Errorf("read the tools module %s: %w", module, err)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	cache = filepath.Join(cache, "sluice")
	name += "-" + sum + "-" + runtime.GOOS + "-" + runtime.GOARCH
	if runtime.GOOS == "windows" {
		name += ".exe"
	}
	bin := filepath.Join(cache, name)
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", fmt.Errorf("create the cache directory: %w", err)
	}
	// Build beside the final name and rename, so that test processes
	// building at the same time never run a half-written file.
	tmp, err := os.CreateTemp(cache, name+".*.tmp")
	if err != nil {
		return "", fmt.Errorf("create the build output: %w", err)
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	cmd := exec.Command("go", "build", "-o", tmp.Name(), pkg)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s in %s: %w\n%s", pkg, module, err, out)
	}
	if err := os.Rename(tmp.Name(), bin); err != nil {
		return "", fmt.Errorf("move the built %s into the cache: %w", name, err)
	}
	return bin, nil
}

// hashModule returns a short hash of the module's go.mod, go.sum and the
// Go files at its root, in name order.
func hashModule(dir string) (string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return "", err
	}
	files = append(files, filepath.Join(dir, "go.mod"), filepath.Join(dir, "go.sum"))
	slices.SortFunc(files, func(a, b string) int { return strings.Compare(filepath.Base(a), filepath.Base(b)) })
	h := sha256.New()
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}
