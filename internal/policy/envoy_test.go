package policy

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

func envoyFile(name string) string { return filepath.Join("testdata", "envoy", name) }

func mustLoad(t *testing.T, path string, opts Options) *Policy {
	t.Helper()
	p, err := LoadWith(path, opts)
	if err != nil {
		t.Fatalf("LoadWith(%s): %v", path, err)
	}
	return p
}

// rpu returns the requests per unit of the limit of entries, -1 for none.
func rpu(p *Policy, domain string, entries []DescriptorEntry) int64 {
	if l := p.EnvoyLimit(domain, entries); l != nil {
		return l.RequestsPerUnit
	}
	return -1
}

func TestEnvoyReplacesItselfRejected(t *testing.T) {
	path := envoyFile("replaces_itself.yaml")
	_, err := Load(path)
	if err == nil || !strings.Contains(err.Error(), path+":6:") || !strings.Contains(err.Error(), `"own"`) {
		t.Fatalf("Load: got %v, want an error at %s:6 naming \"own\"", err, path)
	}
}

func TestEnvoyWildcardInTheMiddle(t *testing.T) {
	p := mustLoad(t, envoyFile("wildcards.yaml"), Options{})
	for _, tt := range []struct {
		value string
		want  int64
	}{
		{"/api/v1/orders", 10}, // also /api/* and *: the first in file order wins
		{"/api//orders", 10},   // '*' matches the empty run
		{"/api/v1/users", 40},
		{"abc", 20},
		{"aXXbYYc", 20},
		{"a*b*c", 20},
		{"abcb", 50},
		{"acb", 50},
		{"logo.png", 30},
		{".png", 30},
		{"", 50},
		{"/api/*", 40},
	} {
		if got := rpu(p, "wildcards", entries("path", tt.value)); got != tt.want {
			t.Errorf("path %q: got %d, want %d", tt.value, got, tt.want)
		}
	}
}

// TestEnvoyWildcardIndexAgreesWithLinearScan checks the wildcard index
// against trying every wildcard in file order.
func TestEnvoyWildcardIndexAgreesWithLinearScan(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	word := func(n int) string {
		b := make([]byte, r.IntN(n+1))
		for i := range b {
			b[i] = "ab*"[r.IntN(3)]
		}
		return string(b)
	}
	for range 200 {
		var ix wildcardIndex
		var all []*envoyWildcard
		seen := map[string]bool{}
		for range 1 + r.IntN(12) {
			p := word(5) + "*" + word(3)
			if seen[p] {
				continue
			}
			seen[p] = true
			e := &envoyEntry{}
			ix.add(p, e)
			all = append(all, &envoyWildcard{parts: strings.Split(p, "*"), pattern: p, entry: e})
		}
		for range 50 {
			v := strings.ReplaceAll(word(7), "*", "")
			var want *envoyEntry
			for _, w := range all {
				if w.matches(v) {
					want = w.entry
					break
				}
			}
			if got := ix.match(v); got != want {
				t.Fatalf("value %q among %v: index and linear scan disagree", v, seen)
			}
		}
	}
}

func TestEnvoyNewerKeysAccepted(t *testing.T) {
	p := mustLoad(t, envoyFile("newer_keys.yaml"), Options{})
	files1 := p.EnvoyLimit("newer", entries("tenant", "files1"))
	if files1 == nil || !files1.ValueToMetric {
		t.Fatalf("tenant files1: got %+v, want the value_to_metric limit", files1)
	}
	// share_threshold: every value the wildcard matches counts on one key.
	k1 := string(files1.AppendKey(nil, entries("tenant", "files1")))
	k2 := string(files1.AppendKey(nil, entries("tenant", "files2")))
	if k1 != k2 || !strings.Contains(k1, "tenant=files*") {
		t.Errorf("share_threshold keys: %q and %q, want one key holding the wildcard", k1, k2)
	}
	// Below a shared wildcard, the wildcard's level is shared, not the others.
	nested := p.EnvoyLimit("newer", entries("nested", "x1", "user", "u"))
	if nested == nil || nested.RequestsPerUnit != 7 || nested.UnitName != "month" {
		t.Fatalf("nested: got %+v", nested)
	}
	a := string(nested.AppendKey(nil, entries("nested", "x1", "user", "u")))
	b := string(nested.AppendKey(nil, entries("nested", "x2", "user", "u")))
	c := string(nested.AppendKey(nil, entries("nested", "x2", "user", "v")))
	if a != b || b == c {
		t.Errorf("nested share_threshold keys: %q, %q, %q; want the first two equal, the third apart", a, b, c)
	}
	if q := p.EnvoyLimit("newer", entries("quota", "q")); q == nil || !q.QuotaMode || !q.DetailedMetric {
		t.Errorf("quota: got %+v, want a quota_mode, detailed_metric limit", q)
	}
	if l := p.EnvoyLimit("newer", entries("empty", "e")); l == nil || l.UnitName != "week" {
		t.Errorf("empty (descriptors: null): got %+v, want the weekly limit", l)
	}
	if l := p.EnvoyLimit("newer", entries("yearly", "y")); l == nil || l.Unit != 365*24*time.Hour {
		t.Errorf("yearly: got %+v", l)
	}
}

func TestEnvoyShareThresholdNeedsWildcard(t *testing.T) {
	path := envoyFile("share_without_wildcard.yaml")
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), path+":3:") {
		t.Fatalf("Load: got %v, want an error at %s:3", err, path)
	}
}

func TestEnvoyConfigDirectory(t *testing.T) {
	p := mustLoad(t, envoyFile("dir"), Options{})
	if got := rpu(p, "alpha", entries("user", "u")); got != 1 {
		t.Errorf("alpha: got %d, want 1", got)
	}
	if got := rpu(p, "beta", entries("user", "u")); got != 2 {
		t.Errorf("beta: got %d, want 2", got)
	}
	again := mustLoad(t, envoyFile("dir"), Options{})
	if p.Version != again.Version || p.Version == "" {
		t.Errorf("versions of one directory: %q and %q", p.Version, again.Version)
	}
}

func TestEnvoyMergeDomainConfig(t *testing.T) {
	dir := envoyFile("merge")
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "duplicate domain") ||
		!strings.Contains(err.Error(), filepath.Join(dir, "2.yaml")+":1:") {
		t.Fatalf("Load without merging: got %v, want a duplicate domain error in 2.yaml", err)
	}
	p := mustLoad(t, dir, Options{MergeDomains: true})
	if got := rpu(p, "shared", entries("user", "u")); got != 1 {
		t.Errorf("user: got %d, want 1", got)
	}
	if got := rpu(p, "shared", entries("ip", "i")); got != 2 {
		t.Errorf("ip: got %d, want 2", got)
	}
	// A descriptor held by two files is still a duplicate.
	tmp := t.TempDir()
	for _, name := range []string{"1.yaml", "2.yaml"} {
		data, _ := os.ReadFile(filepath.Join(dir, "1.yaml"))
		os.WriteFile(filepath.Join(tmp, name), data, 0o644)
	}
	if _, err := LoadWith(tmp, Options{MergeDomains: true}); err == nil || !strings.Contains(err.Error(), "duplicate descriptor") {
		t.Errorf("merging one descriptor twice: got %v, want a duplicate descriptor error", err)
	}
}

// deepEnvoy returns a configuration of levels nested descriptors, each
// keyed by an anchored key of keyBytes bytes.
func deepEnvoy(levels, keyBytes int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "domain: d\nx: &k %s\ndescriptors:\n", strings.Repeat("k", keyBytes))
	for i := range levels {
		ind := strings.Repeat("  ", 2*i)
		fmt.Fprintf(&b, "%s  - key: *k\n%s    descriptors:\n", ind, ind)
	}
	return b.String()
}

func TestEnvoyDeepNestingIsBounded(t *testing.T) {
	for _, levels := range []int{400, 1000} {
		src := deepEnvoy(levels, 64<<10)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		start := time.Now()
		_, err := Parse("deep.yaml", []byte(src))
		took := time.Since(start)
		runtime.ReadMemStats(&after)
		if err == nil || !strings.Contains(err.Error(), "deeper than") {
			t.Errorf("%d levels: got %v, want an error saying they nest too deep", levels, err)
		}
		t.Logf("%d levels, %d bytes: rejected in %s, %d MiB allocated", levels, len(src), took, (after.TotalAlloc-before.TotalAlloc)>>20)
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 256<<20 {
			t.Errorf("%d levels (%d bytes): %d MiB allocated, want at most 256", levels, len(src), alloc>>20)
		}
		if took > 10*time.Second && !raceEnabled {
			t.Errorf("%d levels: took %s", levels, took)
		}
	}
	// Within the depth, long names are bounded by the bytes budget.
	src := strings.Replace(deepEnvoy(MaxEnvoyDepth, 1<<20), "domain: d\n", "domain: d\n", 1)
	if _, err := Parse("long.yaml", []byte(src)); err == nil || !strings.Contains(err.Error(), "too large") {
		t.Errorf("%d levels of 1 MiB keys: got %v, want an error saying it is too large", MaxEnvoyDepth, err)
	}
}

func TestErrorsCutLongValues(t *testing.T) {
	long := strings.Repeat("v", 1200<<10)
	src := "domain: d\ndescriptors:\n  - key: k\n    value: " + long + "\n    rate_limit: " + long + "\n" +
		"  - key: k\n    value: " + long + "\n"
	_, err := Parse("long.yaml", []byte(src))
	if err == nil {
		t.Fatal("Parse: no error")
	}
	if n := len(err.Error()); n > 8<<10 {
		t.Errorf("error of %d bytes for a file of %d, want at most 8 KiB: %.300s", n, len(src), err)
	}
	if !strings.Contains(err.Error(), fmt.Sprintf("(%d bytes)", len(long))) {
		t.Errorf("error %.300s: want the cut value's length", err)
	}
}

func TestEnvoyManyWildcardsAreIndexed(t *testing.T) {
	n := 100_000
	if raceEnabled {
		n = 20_000 // the race detector makes yaml.v3 too slow for more
	}
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n")
	for i := range n {
		switch i % 3 {
		case 0:
			fmt.Fprintf(&b, "  - {key: k, value: \"p%d*\", rate_limit: {unit: second, requests_per_unit: 1}}\n", i)
		case 1:
			fmt.Fprintf(&b, "  - {key: k, value: \"*s%d\", rate_limit: {unit: second, requests_per_unit: 2}}\n", i)
		default:
			fmt.Fprintf(&b, "  - {key: k, value: \"m%d*x*y\", rate_limit: {unit: second, requests_per_unit: 3}}\n", i)
		}
	}
	start := time.Now()
	p, err := Parse("many.yaml", []byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	parsed := time.Since(start)
	if parsed > 10*time.Second && !raceEnabled {
		t.Errorf("parsing %d wildcards took %s", n, parsed)
	}
	start = time.Now()
	const lookups = 64 * 100
	for i := range lookups {
		v := fmt.Sprintf("zz%d", i) // matches none
		if i%2 == 0 {
			v = fmt.Sprintf("m%dAxBy", (i*3+2)%n)
		}
		p.EnvoyLimit("d", entries("k", v))
	}
	per := time.Since(start) / lookups
	t.Logf("%d wildcards: parsed in %s, %s per lookup", n, parsed, per)
	if bound := 100 * time.Microsecond; per > bound && !raceEnabled || per > 10*bound {
		t.Errorf("a lookup among %d wildcards takes %s, want it not to scan them", n, per)
	}
	if got := rpu(p, "d", entries("k", "m2AxBy")); got != 3 {
		t.Errorf("m2AxBy: got %d, want 3", got)
	}
	if got := rpu(p, "d", entries("k", "p3000-anything")); got != 1 {
		t.Errorf("p3000-anything: got %d, want 1", got)
	}
	if got := rpu(p, "d", entries("k", "anything-s4")); got != 2 {
		t.Errorf("anything-s4: got %d, want 2", got)
	}
}

// parseMemoryBound is the memory a parse of n bytes may allocate in all:
// the yaml.v3 tree of the file (some hundreds of bytes per byte of the
// worst files, of one-byte scalars), the work budget's entries, and the
// budget of names and values built.
func parseMemoryBound(n int) uint64 {
	return uint64(n)*1024 + maxWork*256 + 2*MaxDecodedBytes
}

// FuzzParseBudget checks that the parser's budgets hold whatever the
// file: the bytes of names and values it builds stay within
// MaxDecodedBytes, the entries it visits within the work budget (and one
// node's entries beyond), and what it allocates within parseMemoryBound.
func FuzzParseBudget(f *testing.F) {
	for _, src := range envoyFiles {
		f.Add([]byte(src))
	}
	for _, name := range []string{"wildcards.yaml", "newer_keys.yaml", "replaces_itself.yaml"} {
		if data, err := os.ReadFile(envoyFile(name)); err == nil {
			f.Add(data)
		}
	}
	f.Add([]byte(deepEnvoy(40, 4<<10)))
	// An alias bomb: 2^40 descriptors once expanded.
	var bomb strings.Builder
	bomb.WriteString("domain: d\ndescriptors:\n  - {key: k0, descriptors: &l0 [{key: a}]}\n")
	for i := 1; i <= 40; i++ {
		fmt.Fprintf(&bomb, "  - {key: k%d, descriptors: &l%d [{key: a, descriptors: *l%d}, {key: b, descriptors: *l%d}]}\n", i, i, i-1, i-1)
	}
	f.Add([]byte(bomb.String()))
	f.Add([]byte("domain: d\nx: &v " + strings.Repeat("v", 4<<10) + "\ndescriptors: &l [{key: *v, value: *v, descriptors: [{key: *v, value: *v}]}]\n"))
	f.Add([]byte("domain: d\ndescriptors:\n  - {key: k, value: \"a*b*\", share_threshold: true, quota_mode: true, descriptors: }\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		d := &decoder{file: "fuzz.yaml"}
		func() {
			defer func() { recover() }() // FuzzParse looks for panics
			parseWith(d, data)
		}()
		runtime.ReadMemStats(&after)
		if d.bytes > MaxDecodedBytes {
			t.Fatalf("%d bytes of names and values built, budget %d", d.bytes, MaxDecodedBytes)
		}
		if d.work > maxWork+len(data)+1 {
			t.Fatalf("%d entries visited, budget %d", d.work, maxWork)
		}
		alloc, bound := after.TotalAlloc-before.TotalAlloc, parseMemoryBound(len(data))
		if testing.Verbose() && alloc > 64<<20 {
			t.Logf("parsing %d bytes allocated %d MiB", len(data), alloc>>20)
		}
		if alloc > bound {
			t.Fatalf("parsing %d bytes allocated %d MiB, bound %d MiB", len(data), alloc>>20, bound>>20)
		}
	})
}
