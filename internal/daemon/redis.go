package daemon

import (
	"context"
	"fmt"
	"net/url"

	"github.com/sluicehq/sluice/internal/engine"
)

// openRedis opens a Redis or Redis Cluster store.
func openRedis(ctx context.Context, u *url.URL) (engine.Store, func() error, error) {
	return nil, nil, fmt.Errorf("daemon: store %q: Redis stores are not available in this build", u.Redacted())
}
