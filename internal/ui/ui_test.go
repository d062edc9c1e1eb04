package ui_test

import (
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/ui"
)

func TestHandler(t *testing.T) {
	srv := httptest.NewServer(ui.Handler())
	defer srv.Close()
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	tests := []struct {
		method, path string
		wantStatus   int
		wantType     string // Content-Type prefix
		wantBody     string
		wantLocation string
	}{
		{"GET", "/ui/", 200, "text/html", "<title>Sluice dashboard</title>", ""},
		{"HEAD", "/ui/", 200, "text/html", "", ""},
		{"GET", "/ui/app.js", 200, "text/javascript", "api(", ""},
		{"GET", "/ui/svg.js", 200, "text/javascript", "createElementNS", ""},
		{"GET", "/ui/app.css", 200, "text/css", "--ok", ""},
		{"GET", "/ui", 301, "", "", "/ui/"},
		{"GET", "/ui/index.html", 301, "", "", "./"},
		{"GET", "/ui/nothing.js", 404, "", "", ""},
		{"GET", "/ui/../ui.go", 404, "", "", ""},
		{"POST", "/ui/", 405, "", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			req, err := http.NewRequest(tt.method, srv.URL+tt.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			// Sent as is: the client would clean "/ui/../ui.go".
			req.URL.Opaque = tt.path
			resp, err := noRedirect.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tt.wantStatus {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.wantStatus, body)
			}
			if got := resp.Header.Get("Content-Type"); !strings.HasPrefix(got, tt.wantType) {
				t.Errorf("Content-Type %q, want %q", got, tt.wantType)
			}
			if !strings.Contains(string(body), tt.wantBody) {
				t.Errorf("body does not hold %q", tt.wantBody)
			}
			if got := resp.Header.Get("Location"); got != tt.wantLocation {
				t.Errorf("Location %q, want %q", got, tt.wantLocation)
			}
			if tt.wantStatus == 200 {
				csp := resp.Header.Get("Content-Security-Policy")
				for _, want := range []string{"default-src 'none'", "connect-src 'self'", "script-src 'self'"} {
					if !strings.Contains(csp, want) {
						t.Errorf("Content-Security-Policy %q lacks %q", csp, want)
					}
				}
			}
		})
	}
}

// TestFilesStayLocal checks that the page's files name no other origin (the
// SVG namespace is a name, never fetched) and load nothing but their own
// files, so that the page works without internet access.
func TestFilesStayLocal(t *testing.T) {
	urls := regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}`)
	refs := regexp.MustCompile(`(?i)(src|href)="([^"]*)"`)
	err := fs.WalkDir(os.DirFS("static"), ".", func(path string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		b, err := os.ReadFile(filepath.Join("static", path))
		if err != nil {
			return err
		}
		for _, u := range urls.FindAllString(string(b), -1) {
			if u != "http://www.w3.org" {
				t.Errorf("%s names another origin: %s", path, u)
			}
		}
		for _, m := range refs.FindAllStringSubmatch(string(b), -1) {
			if ref := m[2]; ref != "data:," && strings.ContainsAny(ref, ":/") {
				t.Errorf("%s loads %q, not one of its own files", path, ref)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
