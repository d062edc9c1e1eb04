// Command redisfloor is the reference of the Redis CPU runs in
// docs/PERFORMANCE.md (scripts/redis-cpu-runs.sh): it sends a fixed-window
// check's one command, HINCRBY of a window's field, on keys shaped like
// Sluice's and picked at random (keys read in the order they were written
// would find Redis' memory in its caches, as no real traffic does), each
// with an expiry as Sluice's have, in pipelines of a given size at a given rate, through the
// client Sluice uses (rueidis), and prints the Redis CPU time per command
// (INFO cpu, user + system, before and after). Run at the rate and
// pipeline depth a `sluice serve` run reached, it is the least Redis CPU
// per check a fixed-window check could cost at that load: Redis' cost per
// command falls as it gets busier, for each wake-up, read and write of a
// connection is shared by more commands.
//
//	cd bench && go run ./cmd/redisfloor --addr 127.0.0.1:6379 --rate 27000 --per 10
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:6379", "Redis address host:port")
	rate := flag.Float64("rate", 27000, "commands per second in all")
	per := flag.Int("per", 10, "commands per pipeline")
	callers := flag.Int("callers", 2, "pipelines in flight at once, as the service's gathered store calls")
	keys := flag.Int("keys", 10000, "distinct keys")
	duration := flag.Duration("duration", 8*time.Second, "how long to send")
	flag.Parse()
	if *rate <= 0 || *per < 1 || *callers < 1 || *keys < 1 || *duration <= 0 {
		fmt.Fprintln(os.Stderr, "redisfloor: --rate, --per, --callers, --keys and --duration must be positive")
		os.Exit(2)
	}
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{*addr}, DisableCache: true, AlwaysPipelining: true,
		MaxFlushDelay: 50 * time.Microsecond})
	if err != nil {
		log.Fatalf("redisfloor: %v", err)
	}
	defer c.Close()
	ctx := context.Background()
	// The field is the start of the current minute in µs, as a window of
	// a minute is counted.
	field := strconv.FormatInt(time.Now().Unix()/60*60*1_000_000, 10)
	names := make([]string, *keys)
	for i := range names {
		names[i] = "rl:envoy:load:fw.1m0s:{client_id=load-" + strconv.Itoa(i) + "}"
	}
	// Every key exists with an expiry before the run: Redis looks the
	// expiry of a key up on every read once any key has one.
	for i := 0; i < len(names); i += 1000 {
		var setup rueidis.Commands
		for _, name := range names[i:min(i+1000, len(names))] {
			setup = append(setup, c.B().Hincrby().Key(name).Field(field).Increment(0).Build(),
				c.B().Pexpire().Key(name).Milliseconds(10*60*1000).Build())
		}
		for _, r := range c.DoMulti(ctx, setup...) {
			if err := r.Error(); err != nil {
				log.Fatalf("redisfloor: %v", err)
			}
		}
	}
	cpu0 := redisCPU(ctx, c)
	start := time.Now()
	every := time.Duration(float64(time.Second) * float64(*per) * float64(*callers) / *rate)
	var sent atomic.Int64
	var wg sync.WaitGroup
	for w := range *callers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 1))
			cmds := make(rueidis.Commands, *per)
			for next := start; time.Since(start) < *duration; {
				for i := range cmds {
					k := r.IntN(*keys)
					cmds[i] = c.B().Hincrby().Key(names[k]).Field(field).Increment(1).Build()
				}
				for _, r := range c.DoMulti(ctx, cmds...) {
					if err := r.Error(); err != nil {
						log.Fatalf("redisfloor: %v", err)
					}
				}
				sent.Add(int64(*per))
				next = next.Add(every)
				time.Sleep(time.Until(next))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	used := redisCPU(ctx, c) - cpu0
	n := float64(sent.Load())
	fmt.Printf("%.0f commands/s in pipelines of %d: redis cpu %.2f us/command (busy %.0f%%)\n",
		n/elapsed.Seconds(), *per, used*1e6/n, 100*used/elapsed.Seconds())
}

// redisCPU returns the CPU seconds Redis has used, user and system.
func redisCPU(ctx context.Context, c rueidis.Client) float64 {
	info, err := c.Do(ctx, c.B().Info().Section("cpu").Build()).ToString()
	if err != nil {
		log.Fatalf("redisfloor: INFO cpu: %v", err)
	}
	total := 0.0
	for _, line := range strings.Split(info, "\r\n") {
		for _, name := range []string{"used_cpu_user:", "used_cpu_sys:"} {
			if v, ok := strings.CutPrefix(line, name); ok {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					log.Fatalf("redisfloor: INFO cpu: %s: %v", line, err)
				}
				total += f
			}
		}
	}
	return total
}
