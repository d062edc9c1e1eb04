// Batches of checks: BatchCheck, and BatchCheckInto with its reusable
// answer. An all-or-nothing batch goes to the store in one call; a batch
// of many checks takes its share of the time (package share), in slices.

package engine

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/internal/share"
)

// InBatch returns err, an error of the i-th check of a batch, with its
// field named with the check's index ("checks[2].cost"); other errors are
// returned as they are. Decoders call it on the error path, so that a
// batch's checks are validated without building names.
func InBatch(i int, err error) error {
	var fe *FieldError
	if !errors.As(err, &fe) {
		return err
	}
	return &FieldError{Field: "checks[" + strconv.Itoa(i) + "]." + fe.Field, Reason: fe.Reason}
}

// MaxBatch bounds the checks of one batch (see check.go for a check's
// bounds).
const MaxBatch = 1000

// BatchMode says how a batch of checks is decided.
type BatchMode uint8

// The batch modes.
const (
	// AllOrNothing allows every check or consumes nothing.
	AllOrNothing BatchMode = iota + 1
	// BestEffort decides each check on its own.
	BestEffort
)

// BatchCheck decides several checks in mode. In AllOrNothing mode the
// enforcing rules of every check go to the store in one all-or-nothing
// call (store.Batch.All): every check is allowed, or none is and nothing
// is consumed; a deny-listed check denies the batch. Idempotency keys apply in BestEffort mode only
// (each check is then an ordinary Check). A bad check fails the whole
// batch with a *FieldError naming it, such as "checks[2].client_id".
func (e *Engine) BatchCheck(ctx context.Context, checks []Check, mode BatchMode) ([]Result, error) {
	if e.tracer != nil && e.sampled(ctx) {
		return e.tracedBatch(ctx, checks, mode)
	}
	return e.observedBatch(ctx, checks, mode)
}

// observedBatch is BatchCheck, untraced.
func (e *Engine) observedBatch(ctx context.Context, checks []Check, mode BatchMode) ([]Result, error) {
	if !e.observing() {
		return e.batch(ctx, checks, mode)
	}
	start := time.Now()
	out, err := e.batch(ctx, checks, mode)
	e.observeBatch(ctx, start, checks, out, err)
	return out, err
}

// ValidateBatch reports the first problem of a batch as a *FieldError: no
// checks, more than MaxBatch, a bad check (Check.Validate, the field named
// as "checks[2].cost") or an unknown mode.
func ValidateBatch(checks []Check, mode BatchMode) error {
	switch {
	case len(checks) == 0:
		return &FieldError{Field: "checks", Reason: "required: at least one check"}
	case len(checks) > MaxBatch:
		return &FieldError{Field: "checks", Reason: strconv.Itoa(len(checks)) + " checks, the limit is " + strconv.Itoa(MaxBatch)}
	}
	for i := range checks {
		if err := checks[i].Validate(); err != nil {
			return InBatch(i, err)
		}
	}
	if mode != BestEffort && mode != AllOrNothing {
		return &FieldError{Field: "mode", Reason: "unknown batch mode"}
	}
	return nil
}

// batch is BatchCheck, unobserved. A batch of many checks takes its
// share of the time (see Config.BulkShare), a smaller one counts as a
// small request.
func (e *Engine) batch(ctx context.Context, checks []Check, mode BatchMode) ([]Result, error) {
	if !e.share.Bulk(len(checks)) {
		small := e.share.StartSmall()
		defer e.share.EndSmall(small)
		return e.batchTurn(ctx, checks, mode, nil)
	}
	turn := e.share.StartBulk(ctx)
	defer turn.End()
	return e.batchTurn(ctx, checks, mode, &turn)
}

// batchTurn is batch; turn, nil for a small batch, paces its work.
func (e *Engine) batchTurn(ctx context.Context, checks []Check, mode BatchMode, turn *share.Turn) ([]Result, error) {
	if err := ValidateBatch(checks, mode); err != nil {
		return nil, err
	}
	switch mode {
	case BestEffort:
		out := make([]Result, len(checks))
		for i := range checks {
			if i%bestEffortSlice == bestEffortSlice-1 {
				turn.Next(ctx)
			}
			r, err := e.check(ctx, e.policy.Load(), &checks[i])
			if err != nil {
				var fe *FieldError
				if errors.As(err, &fe) {
					fe.Field = "checks[" + strconv.Itoa(i) + "]." + fe.Field
				}
				return nil, err
			}
			out[i] = r
		}
		return out, nil
	case AllOrNothing:
		return e.batchAll(ctx, checks, turn)
	}
	return nil, &FieldError{Field: "mode", Reason: "unknown batch mode"}
}

// Slices of a bulk request's work, in checks: a bulk batch waits its turn
// (share.Turn.Next) between them. Each check of a best-effort batch is a
// store call of its own.
const (
	planSlice       = 64
	bestEffortSlice = 8
)

func (e *Engine) batchAll(ctx context.Context, checks []Check, turn *share.Turn) ([]Result, error) {
	p := e.policy.Load()
	out := make([]Result, len(checks))
	decided := make([]bool, len(checks))
	denied := false
	s := e.getScratch()
	defer e.putScratch(s)
	var now time.Time
	for i := range checks {
		if i%planSlice == planSlice-1 {
			turn.Next(ctx)
		}
		c := &checks[i]
		if now.IsZero() {
			now = c.Now
		}
		q := request(c)
		if r, ok := listed(p, &q); ok {
			out[i], decided[i] = r, true
			if !r.Allowed {
				denied = true
			}
			continue
		}
		if err := e.plan(s, p, c, &q, i, ""); err != nil {
			return nil, InBatch(i, err)
		}
	}
	if denied {
		// A deny-listed check denies the batch: nothing goes to the store.
		for i := range out {
			if !decided[i] {
				out[i] = Result{Allowed: false, Source: SourceDenyList, Deciding: RuleResult{Rule: "deny_list", Source: SourceDenyList}}
			}
			out[i].Allowed = false
		}
		return out, nil
	}
	allowed := true
	if len(s.items) > 0 {
		e.finishKeys(s)
		if work, ok := e.fitsAtomic(s, now); !ok && len(checks) > 1 {
			return nil, &FieldError{Field: "checks", Reason: "an all_or_nothing batch of " + strconv.Itoa(len(checks)) +
				" checks takes " + strconv.Itoa(work) + " units of store work, the limit is " + strconv.Itoa(e.maxAtomic) +
				": send fewer checks in one batch, or mode best_effort"}
		}
		s.call.turn = turn // pauses while waiting on the store
		allowed = e.run(ctx, s, now, true)
	}
	start := 0
	rules := make([]RuleResult, len(s.items)) // one allocation for the batch
	for i := range checks {
		if i%planSlice == planSlice-1 {
			turn.Next(ctx)
		}
		if decided[i] {
			continue
		}
		end := start
		for end < len(s.items) && s.items[end].check == i {
			end++
		}
		if end == start {
			out[i] = Result{Allowed: true, Source: SourceNoRule, Deciding: RuleResult{Allowed: true, Source: SourceNoRule}}
		} else {
			out[i] = assembleIn(rules[start:end:end], s.items[start:end], allowed)
		}
		start = end
	}
	if !allowed {
		for i := range out {
			out[i].Allowed = false
		}
	}
	return out, nil
}
