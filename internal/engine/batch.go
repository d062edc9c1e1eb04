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
//
// The results are allocated for the caller, who keeps them: a caller
// that decides many batches, such as a transport, should call
// BatchCheckInto with answers it reuses.
func (e *Engine) BatchCheck(ctx context.Context, checks []Check, mode BatchMode) ([]Result, error) {
	var a BatchAnswer
	err := e.BatchCheckInto(ctx, checks, mode, &a)
	if err != nil {
		return nil, err
	}
	return a.Results, nil
}

// BatchAnswer is the answer of a batch, with the memory it is written in,
// for a caller to reuse from batch to batch (from a sync.Pool, say)
// instead of having every batch allocate its answer: the results of a
// batch of 1,000 checks take some 240 KB, and their garbage collections
// slow every other check of the process. The zero value is ready to use.
// A BatchAnswer is used by one goroutine at a time.
type BatchAnswer struct {
	// Results holds the result of each check of the last batch, in
	// order; empty after an error. The Results, and the Rules they hold,
	// are valid until the answer is used again.
	Results []Result
	// rules is the memory of the Results' Rules.
	rules []RuleResult
	// held is the turn of a large request begun before it was decoded
	// (Engine.Begin), while holding is set.
	held    share.Turn
	holding bool
}

// Size returns the results and the rule results a holds room for: a pool
// of answers should drop one grown beyond what it means to keep.
func (a *BatchAnswer) Size() (results, rules int) { return cap(a.Results), cap(a.rules) }

// BatchCheckInto is BatchCheck writing the answer into a, whose memory it
// reuses: a.Results holds the results of checks, in order; on error it is
// empty.
func (e *Engine) BatchCheckInto(ctx context.Context, checks []Check, mode BatchMode, a *BatchAnswer) error {
	a.Results, a.rules = a.Results[:0], a.rules[:0]
	var err error
	if e.tracer != nil && e.sampled(ctx) {
		err = e.tracedBatch(ctx, checks, mode, a)
	} else {
		err = e.observedBatch(ctx, checks, mode, a)
	}
	if err != nil {
		a.Results = a.Results[:0]
	}
	return err
}

// observedBatch is BatchCheckInto, untraced.
func (e *Engine) observedBatch(ctx context.Context, checks []Check, mode BatchMode, a *BatchAnswer) error {
	if !e.observing() {
		return e.batch(ctx, checks, mode, a)
	}
	start := time.Now()
	err := e.batch(ctx, checks, mode, a)
	e.observeBatch(ctx, start, checks, a.Results, err)
	return err
}

// ValidateBatch reports the first problem of a batch as a *FieldError: no
// checks, more than MaxBatch, a bad check (Check.Validate, the field named
// as "checks[2].cost") or an unknown mode.
func ValidateBatch(checks []Check, mode BatchMode) error {
	return validateBatch(context.Background(), checks, mode, nil)
}

// validateBatch is ValidateBatch; turn, when not nil, paces it (a
// thousand checks take tens of microseconds to validate).
func validateBatch(ctx context.Context, checks []Check, mode BatchMode, turn *share.Turn) error {
	switch {
	case len(checks) == 0:
		return &FieldError{Field: "checks", Reason: "required: at least one check"}
	case len(checks) > MaxBatch:
		return &FieldError{Field: "checks", Reason: strconv.Itoa(len(checks)) + " checks, the limit is " + strconv.Itoa(MaxBatch)}
	}
	for i := range checks {
		if i%validateSlice == validateSlice-1 {
			turn.Next(ctx)
		}
		if err := checks[i].Validate(); err != nil {
			return InBatch(i, err)
		}
	}
	if mode != BestEffort && mode != AllOrNothing {
		return &FieldError{Field: "mode", Reason: "unknown batch mode"}
	}
	return nil
}

// batch is BatchCheckInto, unobserved. A batch of many checks takes its
// share of the time (see Config.BulkShare), a smaller one counts as a
// small request.
func (e *Engine) batch(ctx context.Context, checks []Check, mode BatchMode, a *BatchAnswer) error {
	if a.holding {
		// Decoded in its turn (Engine.Begin): the turn goes on until
		// a.End, or ends for a batch that turned out small.
		if e.share.Bulk(len(checks)) {
			a.held.Next(ctx)
			return e.batchTurn(ctx, checks, mode, a, &a.held)
		}
		a.End()
	}
	if !e.share.Bulk(len(checks)) {
		small := e.share.StartSmall()
		defer e.share.EndSmall(small)
		return e.batchTurn(ctx, checks, mode, a, nil)
	}
	turn := e.share.StartBulk(ctx)
	defer turn.End()
	return e.batchTurn(ctx, checks, mode, a, &turn)
}

// batchTurn is batch; turn, nil for a small batch, paces its work.
func (e *Engine) batchTurn(ctx context.Context, checks []Check, mode BatchMode, a *BatchAnswer, turn *share.Turn) error {
	if err := validateBatch(ctx, checks, mode, turn); err != nil {
		return err
	}
	a.Results = growResults(a.Results, len(checks))
	switch mode {
	case BestEffort:
		p := e.policy.Load()
		for i := range checks {
			if i%bestEffortSlice == bestEffortSlice-1 {
				turn.Next(ctx)
			}
			r, err := e.checkIn(ctx, p, &checks[i], &a.rules)
			if err != nil {
				var fe *FieldError
				if errors.As(err, &fe) {
					fe.Field = "checks[" + strconv.Itoa(i) + "]." + fe.Field
				}
				return err
			}
			a.Results[i] = r
		}
		return nil
	case AllOrNothing:
		return e.batchAll(ctx, checks, a, turn)
	}
	return &FieldError{Field: "mode", Reason: "unknown batch mode"}
}

// growResults returns out resliced to n results, reallocated when it has
// not the room.
func growResults(out []Result, n int) []Result {
	if cap(out) < n {
		return make([]Result, n)
	}
	return out[:n]
}

// Slices of a bulk request's work, in checks: a bulk batch waits its turn
// (share.Turn.Next) between them. Each check of a best-effort batch is a
// store call of its own.
const (
	planSlice       = 64
	validateSlice   = 512
	bestEffortSlice = 8
)

// batchAll decides an all-or-nothing batch into a, whose Results have
// room for every check.
func (e *Engine) batchAll(ctx context.Context, checks []Check, a *BatchAnswer, turn *share.Turn) error {
	p := e.policy.Load()
	out := a.Results
	denied := false
	s := e.getScratch()
	defer e.putScratch(s)
	s.decided = growBools(s.decided, len(checks))
	decided := s.decided
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
			return InBatch(i, err)
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
		return nil
	}
	allowed := true
	if len(s.items) > 0 {
		e.finishKeys(s)
		// Finishing the keys of many checks, and planning their merge
		// (fitsAtomic, or the store call's), take a slice each.
		turn.Next(ctx)
		if work, ok := e.fitsAtomic(s, now); !ok && len(checks) > 1 {
			return &FieldError{Field: "checks", Reason: "an all_or_nothing batch of " + strconv.Itoa(len(checks)) +
				" checks takes " + strconv.Itoa(work) + " units of store work, the limit is " + strconv.Itoa(e.maxAtomic) +
				": send fewer checks in one batch, or mode best_effort"}
		}
		turn.Next(ctx)
		s.call.turn = turn // pauses while waiting on the store
		allowed = e.run(ctx, s, now, true)
	}
	start := 0
	if cap(a.rules) < len(s.items) {
		a.rules = make([]RuleResult, len(s.items))
	}
	rules := a.rules[:len(s.items)] // the batch's rule results, in one slice
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
	return nil
}

// growBools returns b resliced to n values, all false.
func growBools(b []bool, n int) []bool {
	if cap(b) < n {
		return make([]bool, n)
	}
	b = b[:n]
	clear(b)
	return b
}
