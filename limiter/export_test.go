package limiter

// RedisAddrForExamples returns the address of the redis-server TestMain
// starts, which the package's examples use.
func RedisAddrForExamples() string { return redisServer.Addr }
