package control

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
)

// change is one write of an object with its audit entry.
type change struct {
	object, id, key string
	// ifVersion > 0 requires the object at that version.
	ifVersion int64
	// mustExist: ErrNotFound when the object does not exist.
	mustExist bool
	// validate: the layer the write would make goes through Validate.
	validate bool
	action   string // "" picks create, update or delete
	reason   string
	// next gets the stored object (nil when absent) and returns the new
	// one, its version set to version (nil deletes it).
	next func(cur []byte, version int64) (any, error)
	// extra ops written in the same Txn, given the new version.
	extra func(version int64, value []byte) []Op
}

// written is the outcome of a change.
type written struct {
	value   []byte
	version int64
	created bool
}

// maxRetries bounds the retries of a write that named no version and met a
// concurrent one.
const maxRetries = 8

// write reads the object, makes the change and writes it with its audit
// entry in one Txn conditioned on the version read.
func (p *Plane) write(ctx context.Context, a Actor, c change) (written, error) {
	for range maxRetries {
		w, err := p.writeOnce(ctx, a, c)
		var ve *VersionError
		if errors.As(err, &ve) && ve.Key == c.key && c.ifVersion == 0 {
			continue // someone else wrote between the read and the Txn
		}
		if errors.As(err, &ve) {
			return written{}, &ConflictError{Object: c.object, ID: c.id, Current: ve.Current}
		}
		return w, err
	}
	return written{}, fmt.Errorf("control: %s %q: too many concurrent writes: %w", c.object, c.id, ErrUnavailable)
}

func (p *Plane) writeOnce(ctx context.Context, a Actor, c change) (written, error) {
	cur, err := p.getKey(ctx, c.key)
	if err != nil {
		return written{}, err
	}
	if cur == nil && c.mustExist {
		return written{}, fmt.Errorf("%s %q: %w", c.object, c.id, ErrNotFound)
	}
	var curVersion int64
	var before []byte
	if cur != nil {
		curVersion, before = cur.Version, cur.Value
	}
	if c.ifVersion > 0 && c.ifVersion != curVersion {
		return written{}, &ConflictError{Object: c.object, ID: c.id, Current: curVersion}
	}
	obj, err := c.next(before, curVersion+1)
	if err != nil {
		return written{}, err
	}
	var after []byte
	if obj != nil {
		if after, err = json.Marshal(obj); err != nil {
			return written{}, fmt.Errorf("control: %w", err)
		}
	}
	if c.validate && p.opts.Validate != nil {
		p.mu.Lock()
		state := maps.Clone(p.state)
		if after == nil {
			delete(state, c.key)
		} else {
			state[c.key] = KV{Key: c.key, Value: after, Version: curVersion + 1}
		}
		// The cache decodes the changed key only; the next build finds
		// the key's value changed again (it has no revision yet).
		l := p.layers.build(state, 0, p.opts.Region, p.opts.Now())
		p.mu.Unlock()
		if err := p.opts.Validate(l); err != nil {
			return written{}, err
		}
	}
	e := AuditEntry{Time: p.opts.Now().UTC(), Actor: a, Action: c.action, Object: c.object, ID: c.id,
		Before: before, After: after, Reason: c.reason, Version: curVersion + 1}
	op := Op{Key: c.key, Value: after, IfVersion: curVersion}
	switch {
	case after == nil:
		op.Delete, e.Version = true, curVersion
		if e.Action == "" {
			e.Action = "delete"
		}
	case cur == nil && e.Action == "":
		e.Action = "create"
	case e.Action == "":
		e.Action = "update"
	}
	if cur == nil {
		op.IfVersion = MustNotExist
	}
	eb, err := json.Marshal(e)
	if err != nil {
		return written{}, fmt.Errorf("control: %w", err)
	}
	ops := []Op{op, {Key: auditKey(e), Value: eb, IfVersion: MustNotExist}}
	if c.extra != nil {
		ops = append(ops, c.extra(curVersion+1, after)...)
	}
	rev, err := p.b.Txn(ctx, ops)
	if err != nil {
		return written{}, err
	}
	if p.opts.Audit != nil {
		e.Revision = rev
		p.opts.Audit(e)
	}
	return written{value: after, version: e.Version, created: cur == nil}, nil
}

// getKey reads one key; nil when it does not exist.
func (p *Plane) getKey(ctx context.Context, key string) (*KV, error) {
	kvs, _, err := p.b.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	for i := range kvs {
		if kvs[i].Key == key {
			return &kvs[i], nil
		}
	}
	return nil, nil
}

// list reads the objects under prefix, each decoded with its version set.
func list[T any](ctx context.Context, p *Plane, prefix string, setVersion func(*T, int64)) ([]T, error) {
	kvs, _, err := p.b.Get(ctx, prefix)
	if err != nil {
		return nil, err
	}
	out := make([]T, 0, len(kvs))
	for _, kv := range kvs {
		var v T
		if err := json.Unmarshal(kv.Value, &v); err != nil {
			return nil, fmt.Errorf("control: %s: %w", kv.Key, err)
		}
		if setVersion != nil {
			setVersion(&v, kv.Version)
		}
		out = append(out, v)
	}
	return out, nil
}

// auditKey orders audit entries by time; the random tail keeps two
// entries of one instant apart.
func auditKey(e AuditEntry) string {
	return fmt.Sprintf("%s%020d-%s", prefixAudit, e.Time.UnixNano(), newID()[:8])
}

// newID returns a random id of 16 hex digits.
func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// checkID rejects an id that would not make one key.
func checkID(field, id string) error {
	switch {
	case id == "":
		return &FieldError{Field: field, Msg: "required"}
	case len(id) > 256:
		return &FieldError{Field: field, Msg: "longer than 256 bytes"}
	case strings.ContainsAny(id, "/\x00"):
		return &FieldError{Field: field, Msg: "must not contain '/'"}
	}
	return nil
}

// checkKind checks the kind of an identity.
func checkKind(field, kind string) error {
	if _, ok := dimensions[kind]; !ok {
		return &FieldError{Field: field, Msg: `must be "user", "client" or "api_key"`}
	}
	return nil
}
