package analytics

import (
	"context"
	"sync"
	"time"
)

// Memory keeps the rollups of the last hours in process and answers Query.
// It is bounded twice: by age (Retention) and by rows (MaxRows); when a new
// row would pass MaxRows, the oldest minute is dropped first. Memory is
// safe for concurrent use.
type Memory struct {
	retention int64 // seconds
	maxRows   int

	mu      sync.Mutex
	minutes map[int64]map[Key]*Rollup // guarded by mu; by minute
	oldest  int64                     // guarded by mu; smallest minute held, when rows > 0
	rows    int                       // guarded by mu
	evicted int64                     // guarded by mu; rows dropped for MaxRows

	// changes and anomalies are in the order they came, at most maxListed
	// of each; guarded by mu.
	changes   []Change
	anomalies []Anomaly
	maxListed int
}

// MemoryConfig shapes a Memory store. The zero value keeps 24 hours and at
// most a million rows.
type MemoryConfig struct {
	// Retention is how long minutes are kept; zero means 24h.
	Retention time.Duration
	// MaxRows bounds the rollups held; zero means 1,000,000 (each is
	// about 450 bytes).
	MaxRows int
	// MaxListed bounds the changes, and the anomalies, held; zero means
	// 10,000 of each. Beyond it the oldest are dropped.
	MaxListed int
}

// NewMemory returns an empty store.
func NewMemory(cfg MemoryConfig) *Memory {
	if cfg.Retention <= 0 {
		cfg.Retention = 24 * time.Hour
	}
	if cfg.MaxRows <= 0 {
		cfg.MaxRows = 1_000_000
	}
	if cfg.MaxListed <= 0 {
		cfg.MaxListed = 10_000
	}
	return &Memory{
		retention: int64(cfg.Retention / time.Second),
		maxRows:   cfg.MaxRows,
		maxListed: cfg.MaxListed,
		minutes:   map[int64]map[Key]*Rollup{},
	}
}

// Add merges rollups into the store, then drops the minutes older than the
// retention before now.
func (m *Memory) Add(now time.Time, rs []Rollup) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range rs {
		m.addLocked(&rs[i])
	}
	m.expireLocked(now.Unix() - m.retention)
}

// AddChanges keeps changes, then drops those older than the retention
// before now, and the oldest beyond MaxListed.
func (m *Memory) AddChanges(now time.Time, cs []Change) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.changes = append(m.changes, cs...)
	cutoff := now.Add(-time.Duration(m.retention) * time.Second)
	i := 0
	for i < len(m.changes) && (m.changes[i].Time.Before(cutoff) || len(m.changes)-i > m.maxListed) {
		i++
	}
	m.changes = append(m.changes[:0], m.changes[i:]...)
}

// AddAnomalies keeps anomalies, then drops those older than the retention
// before now, and the oldest beyond MaxListed.
func (m *Memory) AddAnomalies(now time.Time, as []Anomaly) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.anomalies = append(m.anomalies, as...)
	cutoff := now.Unix() - m.retention
	i := 0
	for i < len(m.anomalies) && (m.anomalies[i].Minute < cutoff || len(m.anomalies)-i > m.maxListed) {
		i++
	}
	m.anomalies = append(m.anomalies[:0], m.anomalies[i:]...)
}

// addLocked merges one rollup. When the store is full, the oldest minute
// makes room, unless the rollup itself is of that minute or older: then
// the rollup is the one dropped. Requires mu held.
func (m *Memory) addLocked(r *Rollup) {
	if have := m.minutes[r.Minute][r.Key]; have != nil {
		have.merge(r)
		return
	}
	for m.rows >= m.maxRows {
		if r.Minute <= m.oldest {
			m.evicted++
			return
		}
		m.evicted += int64(len(m.minutes[m.oldest]))
		m.dropLocked(m.oldest)
	}
	byKey := m.minutes[r.Minute]
	if byKey == nil {
		byKey = map[Key]*Rollup{}
		m.minutes[r.Minute] = byKey
		if m.rows == 0 || r.Minute < m.oldest {
			m.oldest = r.Minute
		}
	}
	c := *r
	byKey[r.Key] = &c
	m.rows++
}

// expireLocked drops the minutes before cutoff. Requires mu held.
func (m *Memory) expireLocked(cutoff int64) {
	for m.rows > 0 && m.oldest < cutoff {
		m.dropLocked(m.oldest)
	}
}

// dropLocked drops one minute and finds the next oldest. Requires mu held.
func (m *Memory) dropLocked(minute int64) {
	m.rows -= len(m.minutes[minute])
	delete(m.minutes, minute)
	if m.rows == 0 {
		return
	}
	first := true
	for k := range m.minutes {
		if first || k < m.oldest {
			m.oldest, first = k, false
		}
	}
}

// Rows returns the number of rollups held and the number dropped to keep
// within MaxRows.
func (m *Memory) Rows() (held int, evicted int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rows, m.evicted
}

// Query sums the rollups f selects. The context is not used: the store
// answers from memory; it is there so that Memory and the PostgreSQL store
// share one signature.
func (m *Memory) Query(_ context.Context, f Filter) (Result, error) {
	if err := f.Validate(); err != nil {
		return Result{}, err
	}
	from, to := f.Start.Unix(), f.End.Unix()
	acc := NewAccumulator(f)
	m.mu.Lock()
	defer m.mu.Unlock()
	acc.Changes = newestChanges(m.changes, f.Start, f.End)
	acc.Anomalies = newestAnomalies(m.anomalies, &f)
	for minute, byKey := range m.minutes {
		if minute < from || minute >= to {
			continue
		}
		for _, r := range byKey {
			if f.matches(&r.Key) {
				acc.Add(r)
			}
		}
	}
	return acc.Result(), nil
}
