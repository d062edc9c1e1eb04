// Package filestore is the control plane's embedded store: the keys of one
// Sluice instance in a local data directory, durable across restarts, with
// an in-process watch. Only one process may use a directory at a time.
package filestore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/atomicfile"
	"github.com/sluicehq/sluice/internal/control"
)

// fileName is the store's file in its directory.
const fileName = "control.json"

// historySize is how many changes the store keeps for watches that resume;
// a watch from before them is told the store was compacted.
const historySize = 4096

var errClosed = fmt.Errorf("filestore closed: %w", control.ErrUnavailable)

// Store is a control.Backend in a directory. It is safe for concurrent use.
type Store struct {
	path string

	// mu guards the fields below.
	mu   sync.Mutex
	rev  int64
	kvs  map[string]*entry
	hist []control.Event // changes of revisions histStart and later
	// histStart is the oldest revision whose changes hist holds.
	histStart int64
	// changed is closed and replaced at each commit, waking the watches.
	changed chan struct{}
	closed  bool
}

// entry is one key; ephemeral keys (Register) are not written to disk.
type entry struct {
	kv        control.KV
	ephemeral bool
}

// file is the store's file.
type file struct {
	Revision int64    `json:"revision"`
	Keys     []fileKV `json:"keys"`
}

type fileKV struct {
	Key         string `json:"key"`
	Value       []byte `json:"value"`
	Version     int64  `json:"version"`
	ModRevision int64  `json:"mod_revision"`
}

// Open opens the store in dir, creating dir when it does not exist.
func Open(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("filestore: create %s: %w", dir, err)
	}
	s := &Store{path: filepath.Join(dir, fileName), kvs: map[string]*entry{}, changed: make(chan struct{})}
	b, err := os.ReadFile(s.path)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("filestore: %w", err)
	default:
		var f file
		if err := json.Unmarshal(b, &f); err != nil {
			return nil, fmt.Errorf("filestore: %s: %w", s.path, err)
		}
		s.rev = f.Revision
		for _, k := range f.Keys {
			s.kvs[k.Key] = &entry{kv: control.KV{Key: k.Key, Value: k.Value, Version: k.Version, ModRevision: k.ModRevision}}
		}
	}
	s.histStart = s.rev + 1
	return s, nil
}

// Get implements control.Backend.
func (s *Store) Get(ctx context.Context, prefix string) ([]control.KV, int64, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, fmt.Errorf("filestore: %w: %w", control.ErrUnavailable, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, 0, errClosed
	}
	var out []control.KV
	for k, e := range s.kvs {
		if strings.HasPrefix(k, prefix) {
			out = append(out, e.kv)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, s.rev, nil
}

// Txn implements control.Backend. The new state is on disk (written to a
// temporary file, synced and renamed over the old) before Txn returns.
func (s *Store) Txn(ctx context.Context, ops []control.Op) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("filestore: %w: %w", control.ErrUnavailable, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.commit(ops, false)
}

// commit checks the preconditions of ops and applies them; requires mu held.
func (s *Store) commit(ops []control.Op, ephemeral bool) (int64, error) {
	if s.closed {
		return 0, errClosed
	}
	for _, op := range ops {
		var cur int64
		if e := s.kvs[op.Key]; e != nil {
			cur = e.kv.Version
		}
		if op.IfVersion != control.AnyVersion && op.IfVersion != cur {
			return 0, &control.VersionError{Key: op.Key, Current: cur}
		}
	}
	rev := s.rev + 1
	old := make(map[string]*entry, len(ops))
	var events []control.Event
	for _, op := range ops {
		if _, ok := old[op.Key]; !ok {
			old[op.Key] = s.kvs[op.Key]
		}
		e := s.kvs[op.Key]
		if op.Delete {
			if e == nil {
				continue
			}
			delete(s.kvs, op.Key)
			events = append(events, control.Event{Delete: true, KV: control.KV{Key: op.Key, ModRevision: rev}})
			continue
		}
		n := &entry{kv: control.KV{Key: op.Key, Value: append([]byte(nil), op.Value...), Version: 1, ModRevision: rev}, ephemeral: ephemeral}
		if e != nil {
			n.kv.Version = e.kv.Version + 1
		}
		s.kvs[op.Key] = n
		events = append(events, control.Event{KV: n.kv})
	}
	if err := s.save(rev); err != nil {
		for k, e := range old { // undo: nothing half-written
			if e == nil {
				delete(s.kvs, k)
			} else {
				s.kvs[k] = e
			}
		}
		return 0, err
	}
	s.rev = rev
	s.hist = append(s.hist, events...)
	if n := len(s.hist) - historySize; n > 0 {
		s.histStart = s.hist[n].KV.ModRevision
		for n > 0 && s.hist[n-1].KV.ModRevision == s.histStart {
			n-- // keep whole revisions
		}
		s.hist = append([]control.Event(nil), s.hist[n:]...)
	}
	close(s.changed)
	s.changed = make(chan struct{})
	return rev, nil
}

// save writes the durable keys at revision rev; requires mu held.
func (s *Store) save(rev int64) error {
	f := file{Revision: rev}
	for _, e := range s.kvs {
		if !e.ephemeral {
			f.Keys = append(f.Keys, fileKV{Key: e.kv.Key, Value: e.kv.Value, Version: e.kv.Version, ModRevision: e.kv.ModRevision})
		}
	}
	sort.Slice(f.Keys, func(i, j int) bool { return f.Keys[i].Key < f.Keys[j].Key })
	b, err := json.Marshal(f)
	if err != nil {
		return fmt.Errorf("filestore: %w", err)
	}
	if err := atomicfile.Write(s.path, b); err != nil {
		return fmt.Errorf("filestore: %w: %w", control.ErrUnavailable, err)
	}
	return nil
}

// Watch implements control.Backend.
func (s *Store) Watch(ctx context.Context, prefix string, fromRev int64) <-chan control.WatchResponse {
	ch := make(chan control.WatchResponse, 1)
	go func() {
		defer close(ch)
		next := fromRev
		for {
			s.mu.Lock()
			if s.closed {
				s.mu.Unlock()
				send(ctx, ch, control.WatchResponse{Err: errClosed})
				return
			}
			if next < s.histStart && next <= s.rev {
				rev := s.rev
				s.mu.Unlock()
				send(ctx, ch, control.WatchResponse{Revision: rev, Compacted: true})
				return
			}
			var evs []control.Event
			for _, ev := range s.hist {
				if ev.KV.ModRevision >= next && strings.HasPrefix(ev.KV.Key, prefix) {
					evs = append(evs, ev)
				}
			}
			rev, wake := s.rev, s.changed
			s.mu.Unlock()
			if rev >= next {
				if len(evs) > 0 && !send(ctx, ch, control.WatchResponse{Revision: rev, Events: evs}) {
					return
				}
				next = rev + 1
			}
			select {
			case <-wake:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch
}

func send(ctx context.Context, ch chan<- control.WatchResponse, r control.WatchResponse) bool {
	select {
	case ch <- r:
		return true
	case <-ctx.Done():
		return false
	}
}

// Register implements control.Backend: the key lives in memory only, until
// ctx ends or the process exits; ttl is not needed by one process.
func (s *Store) Register(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	s.mu.Lock()
	e := s.kvs[key]
	_, err := s.commit([]control.Op{{Key: key, Value: value, IfVersion: control.AnyVersion}}, true)
	s.mu.Unlock()
	if err != nil {
		return err
	}
	if e == nil { // first registration: remove the key when ctx ends
		context.AfterFunc(ctx, func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			if !s.closed {
				_, _ = s.commit([]control.Op{{Key: key, Delete: true, IfVersion: control.AnyVersion}}, true)
			}
		})
	}
	return nil
}

// Close implements control.Backend.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		close(s.changed)
	}
	return nil
}
