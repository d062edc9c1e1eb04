package redis

import "github.com/sluicehq/sluice/internal/keyspace"

// redisKey returns the Redis key of the store key k under prefix: k as it
// is, or a fixed-length form when prefix and k are longer than maxLen (see
// keyspace.Redis, which owns the layout).
func redisKey(prefix, k string, maxLen int) string { return keyspace.Redis(prefix, k, maxLen) }

// slotOf returns the Redis Cluster slot of key.
func slotOf(key string) uint16 { return keyspace.Slot(key) }
