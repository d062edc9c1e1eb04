package control

import (
	"context"
	"fmt"
	"time"
)

// Backend is the store under the control plane: a versioned key-value
// store with all-or-nothing transactions and a watch, such as a local data
// directory (package filestore) or etcd (package etcdstore).
//
// Keys are relative to the adapter's own prefix. Every committed Txn
// advances the store's revision by one; a key's Version is 1 when created
// and one more at each put (like etcd's), and its ModRevision the revision
// of its last put.
//
// A Backend is safe for concurrent use by several goroutines. A store that
// cannot be reached makes every method fail with an error wrapping
// ErrUnavailable, and a Txn that fails that way wrote nothing.
type Backend interface {
	// Get returns the keys under prefix ("" for all) sorted by key, and the
	// store's revision they were read at.
	Get(ctx context.Context, prefix string) ([]KV, int64, error)

	// Txn applies ops all together or not at all and returns the revision
	// it committed. When the precondition of an op fails it writes nothing
	// and returns a *VersionError naming the key and its current version.
	Txn(ctx context.Context, ops []Op) (int64, error)

	// Watch sends the changes under prefix from revision fromRev on, in
	// order, each revision once. When fromRev is older than the store
	// keeps, it sends one response with Compacted set and closes; the
	// caller reads everything again with Get. A response with Err set is
	// the last one. The channel closes when ctx ends; a caller whose watch
	// closed resumes with Watch from the revision after the last one it saw.
	Watch(ctx context.Context, prefix string, fromRev int64) <-chan WatchResponse

	// Register writes key with value for as long as ctx lives and this
	// process runs: the key vanishes at most ttl after the process dies or
	// ctx ends. Calling it again for the same key and the same ctx replaces
	// the value. It returns once the key is written.
	Register(ctx context.Context, key string, value []byte, ttl time.Duration) error

	// Close releases the store's resources; the watches end.
	Close() error
}

// KV is one key of the store.
type KV struct {
	Key         string
	Value       []byte
	Version     int64 // 1 when created, one more at each put
	ModRevision int64 // revision of the last put
}

// Versions of an Op's precondition besides a version number.
const (
	MustNotExist int64 = 0  // the key must not exist
	AnyVersion   int64 = -1 // no precondition
)

// Op is one write of a Txn: a put of Value, or a delete when Delete is set,
// on condition that the key is at IfVersion (MustNotExist, AnyVersion or a
// version).
type Op struct {
	Key       string
	Value     []byte
	Delete    bool
	IfVersion int64
}

// VersionError is a failed precondition of a Txn: Key is at Current (0
// when it does not exist).
type VersionError struct {
	Key     string
	Current int64
}

func (e *VersionError) Error() string {
	return fmt.Sprintf("control: key %q is at version %d", e.Key, e.Current)
}

// Event is one change seen by a watch: a put of KV, or a delete of KV.Key
// when Delete is set (KV.ModRevision is then the revision of the delete).
type Event struct {
	Delete bool
	KV     KV
}

// WatchResponse is a batch of changes of one or more revisions, in order.
type WatchResponse struct {
	// Revision is the store's revision after these events.
	Revision int64
	Events   []Event
	// Compacted says the revision asked for is no longer kept: read
	// everything again.
	Compacted bool
	// Err ends the watch; resume from the revision after the last seen.
	Err error
}
