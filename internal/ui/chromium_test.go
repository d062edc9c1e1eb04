package ui_test

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// browser is one tab of a headless Chromium, and what its pages did: the
// URLs they requested, those off loopback, and their errors.
type browser struct {
	ctx context.Context // the tab's chromedp context

	mu                      sync.Mutex
	requests, outside, errs []string
}

// newBrowser starts Chromium with one tab that records its requests and
// errors, and stops it (and waits for it) when the test ends. Without a
// Chromium, it skips the test (see findChromium).
func newBrowser(t *testing.T) *browser {
	t.Helper()
	path := findChromium(t)
	ctx, cancel := chromedp.NewExecAllocator(context.Background(), browserOptions(t, path)...)
	t.Cleanup(cancel) // ends Chromium and waits for it, before its TempDir goes
	ctx, cancelTab := chromedp.NewContext(ctx, chromedp.WithLogf(t.Logf))
	t.Cleanup(cancelTab)
	ctx, cancelTime := context.WithTimeout(ctx, 90*time.Second)
	t.Cleanup(cancelTime)
	b := &browser{ctx: ctx}
	if err := chromedp.Listen(ctx, b.record); err != nil {
		t.Fatalf("starting Chromium: %v", err)
	}
	if _, err := chromedp.Call(ctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(ctx, runtime.Enable, cdp.Empty{}); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(ctx, cdplog.Enable, cdp.Empty{}); err != nil {
		t.Fatal(err)
	}
	return b
}

// record keeps what ev says of a request or an error. It runs in the
// tab's reading loop, so it only appends.
func (b *browser) record(ev any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch e := ev.(type) {
	case *network.EventRequestWillBeSent:
		b.requests = append(b.requests, e.Request.URL)
		if !loopback(e.Request.URL) {
			b.outside = append(b.outside, e.Request.URL)
		}
	case *network.EventWebSocketCreated:
		if !loopback(e.URL) {
			b.outside = append(b.outside, e.URL)
		}
	case *runtime.EventExceptionThrown:
		d := e.ExceptionDetails
		msg := d.Text
		if d.Exception != nil {
			msg += " " + d.Exception.Description
		}
		b.errs = append(b.errs, msg)
	case *runtime.EventConsoleAPICalled:
		if e.Type == runtime.ConsoleAPICalledTypeError {
			b.errs = append(b.errs, "console.error: "+consoleText(e))
		}
	case *cdplog.EventEntryAdded:
		// Security (a Content Security Policy violation) and the like;
		// not the network's, which logs the 401 the page is meant to
		// meet.
		if e.Entry.Level == cdplog.EntryLevelError && e.Entry.Source != cdplog.EntrySourceNetwork {
			b.errs = append(b.errs, fmt.Sprintf("%s: %s", e.Entry.Source, e.Entry.Text))
		}
	}
}

// checkClean fails the test when a page requested anything off loopback
// or threw an error, or made fewer than min requests (its files and the
// APIs it reads).
func (b *browser) checkClean(t *testing.T, min int) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.outside) > 0 {
		t.Errorf("the page made requests off loopback: %q", b.outside)
	}
	if len(b.requests) < min {
		t.Errorf("the page made %d requests, want %d at least: %q", len(b.requests), min, b.requests)
	}
	if len(b.errs) > 0 {
		t.Errorf("the page threw errors: %q", b.errs)
	}
}

// findChromium returns the path of a Chromium or Chrome, installing
// Debian's chromium package with scripts/ensure-chromium.sh (as make deps
// does) when none is found; it skips the test only when that fails too.
func findChromium(t *testing.T) string {
	t.Helper()
	find := func() string {
		for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless-shell"} {
			if p, err := exec.LookPath(name); err == nil {
				return p
			}
		}
		return ""
	}
	if p := find(); p != "" {
		return p
	}
	out, err := exec.Command("bash", filepath.Join(repoRoot, "scripts", "ensure-chromium.sh")).CombinedOutput()
	if p := find(); p != "" {
		return p
	}
	t.Skipf("no Chromium found (chromium, chromium-browser, google-chrome) and scripts/ensure-chromium.sh could not install it (%v):\n%s", err, out)
	return ""
}

// browserOptions runs Chromium headless with a user data directory of its
// own, without the sandbox as root (which it refuses otherwise), and with
// its own background traffic (updates, safe browsing) off.
func browserOptions(t *testing.T, path string) []chromedp.ExecAllocatorOption {
	opts := append(slices.Clone(chromedp.DefaultExecAllocatorOptions[:]),
		chromedp.ExecPath(path),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-domain-reliability", true),
		chromedp.Flag("no-pings", true),
	)
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox)
	}
	return opts
}

// loopback reports whether the URL u stays on this machine: a loopback
// host, or no network at all (data:, blob:, about:).
func loopback(u string) bool {
	p, err := url.Parse(u)
	if err != nil {
		return false
	}
	switch p.Scheme {
	case "data", "blob", "about":
		return true
	case "http", "https", "ws", "wss":
	default:
		return false
	}
	h := p.Hostname()
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

func consoleText(e *runtime.EventConsoleAPICalled) string {
	var parts []string
	for _, a := range e.Args {
		if len(a.Value) > 0 {
			parts = append(parts, string(a.Value))
		} else {
			parts = append(parts, a.Description)
		}
	}
	return strings.Join(parts, " ")
}

func TestLoopback(t *testing.T) {
	for u, want := range map[string]bool{
		"http://127.0.0.1:8080/ui/":     true,
		"http://localhost:1/x":          true,
		"http://[::1]:8080/":            true,
		"ws://127.0.0.2:9/":             true,
		"data:image/png;base64,AAAA":    true,
		"https://example.com/x.png":     false,
		"http://10.0.0.1/":              false,
		"http://127.0.0.1.example.com/": false,
		"chrome-extension://abc/x.js":   false,
		"//cdn.example.com/lib.js":      false,
	} {
		if got := loopback(u); got != want {
			t.Errorf("loopback(%q) = %v, want %v", u, got, want)
		}
	}
}

// repoRoot is the repository's root, found before any test changes
// directory.
var repoRoot = func() string {
	dir, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		panic(err)
	}
	return dir
}()
