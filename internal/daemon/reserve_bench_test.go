package daemon_test

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/daemon"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// BenchmarkChecksWithReservations measures HTTP checks per second of a
// daemon on one Redis with reservations off, and on with 100 pools holding
// open reservations (which the sweep visits every second), in alternating
// rounds of the same run: the cost of reservations to the checks that do
// not use them. 32 callers, 1000 client ids, every check allowed. Beside
// checks/s, which a shared machine moves by more than 5% from one round
// to the next, it reports the CPU per check of this process (callers and
// daemon) and of redis-server.
//
//	go test -run '^$' -bench ChecksWithReservations -benchtime 5s ./internal/daemon/
func BenchmarkChecksWithReservations(b *testing.B) {
	const cfg = `version: 1
rules:
  - {id: api, match: {resource: "/api/*"}, limit: 1000000000, window: 1m, algorithm: fixed_window}
`
	srv := redistest.Start(b)
	url := "redis://" + srv.Addr
	for round := 1; round <= 3; round++ {
		for _, on := range []bool{false, true} {
			name := "off"
			if on {
				name = "on"
			}
			b.Run(fmt.Sprintf("%s-%d", name, round), func(b *testing.B) {
				td := start(b, cfg, func(c *daemon.Config) {
					c.StoreURL = url
					c.NoReservations = !on
					c.Now = nil // the Redis server's clock, as in service
				})
				b.Cleanup(benchClient.CloseIdleConnections) // before the daemon's shutdown
				if on {
					for i := range 100 {
						body := fmt.Sprintf(`{"client_id":"r%d","resource":"/api/r%d","tokens_needed":1,"duration_seconds":300}`, i, i)
						if code := send(b, td.base+"/api/v1/reserve", body); code != 200 {
							b.Fatalf("reserve: %d", code)
						}
					}
				}
				var callers atomic.Int64
				b.SetParallelism(16)
				cpu0, redis0 := cpuTime(b), redisCPU(b, srv)
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					i := callers.Add(1)
					for n := i; pb.Next(); n += 7 {
						body := `{"client_id":"k` + strconv.FormatInt(n%1000, 10) + `","resource":"/api/orders"}`
						if code := send(b, td.base+"/api/v1/check", body); code != 200 {
							b.Errorf("check: %d", code)
							return
						}
					}
				})
				b.StopTimer()
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "checks/s")
				b.ReportMetric(float64((cpuTime(b)-cpu0).Microseconds())/float64(b.N), "µs-cpu/check")
				b.ReportMetric(float64((redisCPU(b, srv)-redis0).Microseconds())/float64(b.N), "µs-redis/check")
			})
		}
	}
}

// cpuTime returns the CPU time (user and system) this process has used.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// redisCPU returns the CPU time srv has used (INFO cpu).
func redisCPU(b *testing.B, srv *redistest.Server) time.Duration {
	info, err := srv.Info("cpu")
	if err != nil {
		b.Fatal(err)
	}
	var total time.Duration
	for _, k := range []string{"used_cpu_sys", "used_cpu_user"} {
		sec, err := strconv.ParseFloat(info[k], 64)
		if err != nil {
			b.Fatal(err)
		}
		total += time.Duration(sec * float64(time.Second))
	}
	return total
}

var benchClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

// send posts body to url and returns the status.
func send(b *testing.B, url, body string) int {
	resp, err := benchClient.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		b.Error(err)
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}
