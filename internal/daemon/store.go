package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/store/memory"
)

// openStore opens the store rawURL names and returns it with the function
// that closes it. A Redis store that does not answer is returned pending
// (see openRedis) unless exitOnUnavailable is set.
func openStore(ctx context.Context, rawURL string, now func() time.Time, opts RedisOptions, exitOnUnavailable bool, log *slog.Logger, reg prometheus.Registerer) (engine.Store, func() error, error) {
	// Not url.Parse: its errors quote the URL, password and all.
	scheme, _, _ := strings.Cut(rawURL, "://")
	switch scheme {
	case "memory":
		if err := opts.noTLS(scheme); err != nil {
			return nil, nil, err
		}
		s, err := memory.New(memory.Config{Now: now})
		if err != nil {
			return nil, nil, fmt.Errorf("daemon: memory store: %w", err)
		}
		return s, s.Close, nil
	case "redis", "rediss", "redis-cluster", "rediss-cluster", "redis-sentinel":
		return openRedis(ctx, rawURL, opts, exitOnUnavailable, log, reg)
	}
	return nil, nil, fmt.Errorf("daemon: store URL %q: unknown scheme (want memory://, redis://host:port[/db], redis-cluster://host:port,host:port,... or redis-sentinel://host:port,.../master[/db])", redactURL(rawURL))
}

// redactURL hides the password of a store URL in logs and errors. As the
// Redis store's parser does, it takes everything before the URL's last '@'
// for the user information, so that a password holding an unescaped '/',
// '?' or '#' is hidden too.
func redactURL(raw string) string {
	at := strings.LastIndexByte(raw, '@')
	if at < 0 {
		return raw
	}
	scheme, user, ok := strings.Cut(raw[:at], "://")
	if !ok {
		return "(unparsable URL)"
	}
	if name, _, hasPass := strings.Cut(user, ":"); hasPass {
		user = name + ":xxxxx"
	}
	return scheme + "://" + user + raw[at:]
}
