package reservation

import "testing"

// BenchmarkReserveRelease measures a Reserve granted at once and its
// Release, on a pool with nothing queued: the common path.
func BenchmarkReserveRelease(b *testing.B) {
	c := &Config{Capacity: 100, QueueLimit: 64, AgingPeriod: 10 * sec}
	var s State
	now := t0
	b.ReportAllocs()
	for b.Loop() {
		now += 2 // the released record expires before the next
		r, _, err := Reserve(c, &s, now, Ask{Client: "client", Tokens: 10, Duration: 1, Priority: Normal})
		if err != nil || !r.Granted {
			b.Fatalf("got %+v, %v", r, err)
		}
		if _, _, err := Release(c, &s, now, r.ID); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReserveReleaseQueued measures a Reserve that joins a queue of
// 48 backlogged requests of 16 clients, and the Release of the oldest
// grant, which grants the head: the contended path, whose cost grows with
// the queue (the order is computed at each call).
func BenchmarkReserveReleaseQueued(b *testing.B) {
	c := &Config{Capacity: 100, QueueLimit: 64, AgingPeriod: 3600 * sec, MaxDuration: 60 * sec}
	var s State
	now := t0
	clients := make([]string, 16)
	for i := range clients {
		clients[i] = string(rune('a' + i))
	}
	var held []int64
	for i := range 48 + 10 {
		r, fx, err := Reserve(c, &s, now, Ask{Client: clients[i%16], Tokens: 10, Duration: 60 * sec, Priority: Normal})
		if err != nil {
			b.Fatal(err)
		}
		_ = r
		for _, g := range fx.Granted {
			held = append(held, g.ID)
		}
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		now++
		_, fx, err := Release(c, &s, now, held[0])
		if err != nil {
			b.Fatal(err)
		}
		held = held[1:]
		for _, g := range fx.Granted {
			held = append(held, g.ID)
		}
		_, fx, err = Reserve(c, &s, now, Ask{Client: clients[i%16], Tokens: 10, Duration: 60 * sec, Priority: Normal})
		if err != nil {
			b.Fatal(err)
		}
		for _, g := range fx.Granted {
			held = append(held, g.ID)
		}
		i++
		if len(s.Granted) > 1000 {
			// Released records stay until expiry: let them go.
			now += 60 * sec
			fx := Expire(c, &s, now)
			held = held[:0]
			for _, g := range fx.Granted {
				held = append(held, g.ID)
			}
			for _, r := range s.Granted {
				if !r.Released {
					held = append(held, r.ID)
				}
			}
		}
	}
}
