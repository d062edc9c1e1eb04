package daemon

import (
	"github.com/sluicehq/sluice/internal/events"
	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/internal/reserve"
	"github.com/sluicehq/sluice/internal/reserve/redispool"
	"github.com/sluicehq/sluice/store/redis"
)

// newKeeper returns the Keeper of the reservations: its pools in the Redis
// store rs (shared by every instance on that Redis or Redis Cluster, on
// the store's connections), or in process when rs is nil (the memory
// store). On Redis the pools keep the Redis server's time unless the
// daemon has a clock of its own (tests).
func newKeeper(cfg Config, pol func() *policy.Policy, evs *events.Recorder, rs *redis.Store) (*reserve.Keeper, error) {
	kc := reserve.Config{Policy: pol, Now: cfg.Now, Events: evs}
	if rs != nil {
		p, err := redispool.New(redispool.Config{Client: rs.Client(), Prefix: rs.Prefix()})
		if err != nil {
			return nil, err
		}
		kc.Backend = p
	}
	return reserve.New(kc)
}
