package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/store/memory"
)

// openStore opens the store rawURL names and returns it with the function
// that closes it.
func openStore(ctx context.Context, rawURL string, now func() time.Time, log *slog.Logger, reg prometheus.Registerer) (engine.Store, func() error, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, nil, fmt.Errorf("daemon: store URL %q: %w", redactURL(rawURL), err)
	}
	switch u.Scheme {
	case "memory":
		s, err := memory.New(memory.Config{Now: now})
		if err != nil {
			return nil, nil, fmt.Errorf("daemon: memory store: %w", err)
		}
		return s, s.Close, nil
	case "redis", "rediss", "redis-cluster", "rediss-cluster":
		return openRedis(ctx, rawURL, log, reg)
	}
	return nil, nil, fmt.Errorf("daemon: store URL %q: unknown scheme %q (want memory://, redis://host:port[/db] or redis-cluster://host:port,host:port,...)", redactURL(rawURL), u.Scheme)
}

// redactURL hides the password of a store URL in logs and errors.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}
