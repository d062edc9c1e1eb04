package testbin

import (
	"os"
	"path/filepath"
	"testing"
)

// The hash covers go.mod, go.sum and the Go files, and nothing else.
func TestHashModule(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/tool\n")
	write("go.sum", "")
	write("main.go", "package main\n")
	first, err := hashModule(dir)
	if err != nil {
		t.Fatal(err)
	}
	write("README", "not part of the build")
	if h, _ := hashModule(dir); h != first {
		t.Errorf("a README changed the hash")
	}
	write("main.go", "package main\n\nfunc main() {}\n")
	if h, _ := hashModule(dir); h == first {
		t.Errorf("a changed main.go kept the hash")
	}
	os.Remove(filepath.Join(dir, "go.sum"))
	if _, err := hashModule(dir); err == nil {
		t.Errorf("no error without go.sum")
	}
}

// Build builds once and returns the cached binary after.
func TestBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a NATS server")
	}
	a, err := Build("internal/tools/nats", ".", "nats-test")
	if err != nil {
		t.Fatal(err)
	}
	b, err := Build("internal/tools/nats", ".", "nats-test")
	if err != nil || a != b {
		t.Fatalf("second Build = %q, %v; want %q", b, err, a)
	}
	if fi, err := os.Stat(a); err != nil || fi.Mode()&0o111 == 0 {
		t.Errorf("%s is not an executable: %v", a, err)
	}
	if _, err := Build("internal/tools/none", ".", "none"); err == nil {
		t.Errorf("Build of a missing module succeeded")
	}
}
