// Plain fixed-window checks on a Redis Cluster: a clock estimate per
// master, and each plain command sent to the master whose clock placed it.

package redis

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice/store"
)

// On a cluster every master has a clock of its own, so the store keeps an
// estimate per master, keyed by its address in the slot map (slotMap),
// started by the first plain-eligible check of a key on it and ended when
// a slot map no longer names it. A check is placed in its window by the
// estimate of the master that the slot map gives its key's slot, and its
// HINCRBY is sent through that node's own client (rueidis.Client.Nodes),
// which follows no redirection: whenever the command would run elsewhere
// (the map is stale: MOVED; the slot is moving and the key has left:
// ASK), the node refuses it before running it, and the check is decided
// again by the script, which the cluster client sends wherever the key
// is. So a plain HINCRBY only ever runs on the master whose clock placed
// its window, and the proof in plain.go holds per key: a key's counts
// live on one node at a time (MIGRATE moves a key whole and atomically),
// where its commands run one after the other.
//
// A master that stops answering fails its plain checks as it fails its
// scripts; once its estimate has aged past clockFresh its checks take the
// scripts, and planPlain reads the slot map again (at most every
// downReread), which names the promoted replica once the cluster has
// failed over.

// masterClock is the estimate of one master's clock, kept across the
// slot maps that name the master. Its reading starts at the first plain
// check of a key on the master (startMasterClock) and ends when gone is
// closed (or the store closes).
type masterClock struct {
	serverClock
	once sync.Once
	gone chan struct{} // closed when a slot map no longer names the master
}

// master is a master of the cluster as a slot map names it.
type master struct {
	addr string
	// client is the node's own client (rueidis.Client.Nodes), which sends
	// every command to that node and follows no MOVED or ASK; nil when the
	// store's client knows no node of that address (no plain checks
	// there).
	client rueidis.Client
	clock  *masterClock
}

// startMasterClock starts reading the clock of the master m, once.
func (s *Store) startMasterClock(m *master) {
	m.clock.once.Do(func() { s.watchClock(m.clock.gone, m.client, &m.clock.serverClock) })
}

// setMasters gives the masters of the slot map m their node clients and
// clocks: the clock of an address the previous map named is kept, those
// of addresses no longer named are stopped. It is called by one goroutine
// at a time (New, then the single read of refreshSlots).
func (s *Store) setMasters(m *slotMap, addrs []string) {
	var nodes map[string]rueidis.Client
	if !s.noPlain {
		nodes = s.client.Nodes()
	}
	old := map[string]*masterClock{}
	if prev := s.slots.Load(); prev != nil {
		for _, pm := range prev.masters {
			old[pm.addr] = pm.clock
		}
	}
	m.masters = make([]master, len(addrs))
	for i, addr := range addrs {
		clk := old[addr]
		if clk == nil {
			clk = &masterClock{gone: make(chan struct{})}
		}
		delete(old, addr)
		m.masters[i] = master{addr: addr, client: nodes[addr], clock: clk}
	}
	for _, clk := range old {
		close(clk.gone)
	}
}

// How soon the slot map is read again after a plain command was
// redirected with MOVED (a read made as the move ended may have asked a
// node that did not know of it yet), or failed without a reply of its
// node.
const (
	movedReread = 100 * time.Millisecond
	downReread  = time.Second
)

// refreshSlotsAfter reads the slot map again, in the background, when the
// last read began more than age before now: after a plain command found
// the map stale (MOVED) or its node unreachable, so that a map gone stale
// is mended within age whatever the traffic, without a read per check.
func (s *Store) refreshSlotsAfter(now time.Time, age time.Duration) {
	if now.UnixNano()-s.slotsTried.Load() > int64(age) {
		s.refreshSlots()
	}
}

// execPlain sends the script calls of groups and the plain commands cmds
// of the checks plain, and returns the replies of both. On a standalone
// server they share one pipeline (execWith). On a cluster each plain
// command goes through the node client of the master whose clock placed
// it (see above), concurrently with the script calls.
func (s *Store) execPlain(ctx context.Context, groups []*group, plain []plainCheck, cmds rueidis.Commands) ([][]int64, []rueidis.RedisResult, error) {
	if !s.cluster || len(cmds) == 0 {
		return s.execWith(ctx, groups, cmds)
	}
	if len(groups) == 0 {
		return nil, doPlain(ctx, plain, cmds), nil
	}
	var replies []rueidis.RedisResult
	done := make(chan struct{})
	go func() {
		replies = doPlain(ctx, plain, cmds)
		close(done)
	}()
	res, _, err := s.execWith(ctx, groups, nil)
	<-done
	return res, replies, err
}

// doPlain sends cmds, the commands of the plain checks plain of a
// cluster, each through the node client of its check's master, one
// pipeline per master, concurrently.
func doPlain(ctx context.Context, plain []plainCheck, cmds rueidis.Commands) []rueidis.RedisResult {
	one := plain[0].m
	for _, pc := range plain[1:] {
		if pc.m != one {
			one = nil
			break
		}
	}
	if one != nil { // the common call: every key on one master
		if len(cmds) == 1 {
			return []rueidis.RedisResult{one.client.Do(ctx, cmds[0])}
		}
		return one.client.DoMulti(ctx, cmds...)
	}
	byMaster := map[*master][]int{}
	for j := range plain {
		byMaster[plain[j].m] = append(byMaster[plain[j].m], j)
	}
	replies := make([]rueidis.RedisResult, len(cmds))
	var wg sync.WaitGroup
	for m, idx := range byMaster {
		wg.Go(func() {
			sub := make(rueidis.Commands, len(idx))
			for k, j := range idx {
				sub[k] = cmds[j]
			}
			for k, r := range m.client.DoMulti(ctx, sub...) {
				replies[idx[k]] = r
			}
		})
	}
	wg.Wait()
	return replies
}

// byMaster returns the indexes of reqs sorted into the calls of
// CheckParts: one per master of a Redis Cluster, by the slot map last read
// (see slotMap), each ascending. It returns nil on a standalone server,
// when the map is unknown, or when every request lies on one master. A
// map gone stale (a slot moved since) misplaces some requests, which the
// client still sends to the right master (a plain command is refused
// there and decided by the script); such a call then waits for two
// masters. A request of a slot no master served goes with the first.
func (s *Store) byMaster(reqs []store.Request) [][]int {
	if !s.cluster || len(reqs) < 2 {
		return nil
	}
	m := s.slots.Load()
	s.refreshSlotsAfter(time.Now(), slotMapAge)
	if m == nil {
		return nil
	}
	var idBuf [8]uint16
	ids := idBuf[:0]                // the masters, in order of first appearance
	which := make([]int, len(reqs)) // the index in ids of each request's master
	for i := range reqs {
		n := m.node[slotOf(redisKey(s.prefix, reqs[i].Key, s.maxKey))]
		if n == 0 && len(ids) > 0 {
			n = ids[0]
		}
		k := slices.Index(ids, n)
		if k < 0 {
			k = len(ids)
			ids = append(ids, n)
		}
		which[i] = k
	}
	if len(ids) == 1 {
		return nil
	}
	// One backing array, cut per master.
	ends := make([]int, len(ids))
	for _, k := range which {
		ends[k]++
	}
	for k := 1; k < len(ends); k++ {
		ends[k] += ends[k-1]
	}
	flat := make([]int, len(reqs))
	parts := make([][]int, len(ids))
	for k := range parts {
		lo := 0
		if k > 0 {
			lo = ends[k-1]
		}
		parts[k] = flat[lo:lo:ends[k]]
	}
	for i, k := range which {
		parts[k] = append(parts[k], i)
	}
	return parts
}
