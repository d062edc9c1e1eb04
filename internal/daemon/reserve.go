package daemon

import (
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/events"
	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/internal/reserve"
	"github.com/sluicehq/sluice/internal/reserve/redispool"
	"github.com/sluicehq/sluice/store/redis"
)

// newKeeper returns the Keeper of the reservations: its pools in the Redis
// store st (shared by every instance on that Redis or Redis Cluster, on
// the store's connections; on a pending store, once it connects), or in
// process on the memory store. On Redis the pools keep the Redis server's
// time unless the daemon has a clock of its own (tests).
func newKeeper(cfg Config, pol func() *policy.Policy, evs *events.Recorder, st engine.Store) (*reserve.Keeper, error) {
	kc := reserve.Config{Policy: pol, Now: cfg.Now, Events: evs}
	switch s := st.(type) {
	case *redis.Store:
		p, err := redispool.New(redispool.Config{Client: s.Client(), Prefix: s.Prefix()})
		if err != nil {
			return nil, err
		}
		kc.Backend = p
	case *pendingRedis:
		kc.Backend = &pendingPools{store: s}
	}
	return reserve.New(kc)
}
