// Package ui is Sluice's dashboard: one HTML page, its style sheet and two
// small scripts (static/), embedded in the binary and served under /ui/ by
// the daemon. docs/dashboard.md says what the page shows.
//
// The page holds no data of its own. Its script (app.js) reads the
// daemon's JSON APIs on the same origin (/api/v1/analytics,
// /api/v1/policy, /api/v1/events, /internal/sync and /healthz) every two
// seconds, and draws the charts itself as inline SVG (svg.js): there is
// no charting library, and nothing is fetched from anywhere but the
// daemon, so the page works without internet access. The Content Security
// Policy sent with every file says so to the browser too: a request to
// another origin is refused by the browser before it leaves.
//
// The files need no token. When an API answers 401 (the control plane is
// on, and the analytics and the policy are a viewer's to read), the page
// asks for a bearer token and keeps it in the tab's sessionStorage, so it
// is forgotten when the tab closes.
package ui

import (
	"embed"
	"net/http"
	"strings"
)

// Prefix is the path the dashboard is served under.
const Prefix = "/ui/"

//go:embed static
var static embed.FS

// contentSecurityPolicy lets the page load and fetch from its own origin
// only, and run no inline script.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Handler returns the handler of the dashboard's files, for paths under
// Prefix; GET /ui answers with a redirect to /ui/. It answers GET and
// HEAD, and 405 to other methods. It is safe for concurrent use.
func Handler() http.Handler {
	files := http.FileServerFS(static)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "use GET", http.StatusMethodNotAllowed)
			return
		}
		if r.URL.Path == strings.TrimSuffix(Prefix, "/") {
			http.Redirect(w, r, Prefix, http.StatusMovedPermanently)
			return
		}
		h := w.Header()
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		// The files change with the binary: the browser asks again
		// (and gets 304 when they have not changed).
		h.Set("Cache-Control", "no-cache")
		// /ui/x is the embedded static/x. The file server's redirects
		// are relative, so they hold under either name.
		r2 := new(http.Request)
		*r2 = *r
		u := *r.URL
		u.Path = "/static/" + strings.TrimPrefix(r.URL.Path, Prefix)
		u.RawPath = ""
		r2.URL = &u
		files.ServeHTTP(w, r2)
	})
}
