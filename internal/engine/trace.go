package engine

import (
	"context"
	"math/rand/v2"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/store"
)

// This file holds the engine's tracing (Config.Tracer): a span per check,
// batch or request of resolved limits (an Envoy call), started at the
// entry points Check, BatchCheck and StartLimits, and a child span per
// store call, started by the tracedStore decorator. Without a tracer,
// neither exists and a check pays one nil test per entry point.
//
// The check span continues the trace of the request's context: the
// transports hand the engine a context carrying the caller's span (a W3C
// traceparent header, decoded by the daemon), so a gateway's trace shows
// the rate limit decision.
//
// The engine samples before it calls the tracer (sampled): an OpenTelemetry
// SDK asked for a span it does not sample still makes one, with ids, a
// context and two allocations, about as much CPU as the check itself on
// the memory store. A check that is not sampled makes no span and calls
// nothing of the tracer; its context keeps the caller's span, if any, for
// the logs.

// Span and attribute names.
const (
	spanCheck  = "sluice.check"
	spanBatch  = "sluice.check_batch"
	spanLimits = "sluice.should_rate_limit" // resolved limits: Envoy's call
	spanStore  = "sluice.store"

	attrRule      = attribute.Key("sluice.rule")
	attrAllowed   = attribute.Key("sluice.allowed")
	attrSource    = attribute.Key("sluice.source")
	attrResource  = attribute.Key("sluice.resource")
	attrChecks    = attribute.Key("sluice.checks")
	attrDomain    = attribute.Key("sluice.domain")
	attrStoreOp   = attribute.Key("sluice.store.op")
	attrStoreKeys = attribute.Key("sluice.store.keys")
)

// sampled reports whether the check of ctx is traced: when ctx carries a
// span, whether that span is sampled; otherwise with probability e.ratio.
func (e *Engine) sampled(ctx context.Context) bool {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		return sc.IsSampled()
	}
	return e.ratio > 0 && rand.Float64() < e.ratio
}

// serverSpan holds the options of the spans of the entry points, made
// once: an option made per call would allocate.
var serverSpan = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer)}

// tracedCheck is Check in a span.
func (e *Engine) tracedCheck(ctx context.Context, c *Check) (Result, error) {
	ctx, span := e.tracer.Start(ctx, spanCheck, serverSpan...)
	res, err := e.observedCheck(ctx, c)
	if span.IsRecording() {
		if err != nil {
			failed(span, err)
		} else {
			span.SetAttributes(attrRule.String(res.Deciding.Rule), attrAllowed.Bool(res.Allowed),
				attrSource.String(res.Source.String()), attrResource.String(c.Resource))
		}
	}
	span.End()
	return res, err
}

// tracedBatch is BatchCheckInto in a span.
func (e *Engine) tracedBatch(ctx context.Context, checks []Check, mode BatchMode, a *BatchAnswer) error {
	ctx, span := e.tracer.Start(ctx, spanBatch, serverSpan...)
	err := e.observedBatch(ctx, checks, mode, a)
	if span.IsRecording() {
		span.SetAttributes(attrChecks.Int(len(checks)))
		if err != nil {
			failed(span, err)
		} else {
			allowed := true
			for i := range a.Results {
				allowed = allowed && a.Results[i].Allowed
			}
			span.SetAttributes(attrAllowed.Bool(allowed))
		}
	}
	span.End()
	return err
}

// failed marks span as failed with err.
func failed(span trace.Span, err error) {
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
}

// endLimits ends span, the span of one request of resolved limits of
// domain (see limits.go).
func endLimits(span trace.Span, domain string, overLimit bool, err error) {
	if span.IsRecording() {
		span.SetAttributes(attrDomain.String(domain))
		if err != nil {
			failed(span, err)
		} else {
			span.SetAttributes(attrAllowed.Bool(!overLimit))
		}
	}
	span.End()
}

// traceStore returns s making a child span of each call whose context
// carries a recorded span; s itself when t is nil.
func traceStore(s Store, t trace.Tracer) Store {
	if t == nil {
		return s
	}
	return &tracedStore{s: s, t: t}
}

// tracedStore is a Store that traces the calls of the store it wraps.
type tracedStore struct {
	s Store
	t trace.Tracer
}

// Do makes a span of the call when its context's span is recorded: an
// unsampled check's store call costs one context lookup.
func (ts *tracedStore) Do(ctx context.Context, b *store.Batch) error {
	if !trace.SpanFromContext(ctx).IsRecording() {
		return ts.s.Do(ctx, b)
	}
	op := "check"
	switch {
	case b.Once != nil:
		op = "check_all_once"
	case b.All:
		op = "check_all"
	}
	ctx, span := ts.t.Start(ctx, spanStore, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attrStoreOp.String(op), attrStoreKeys.Int(len(b.Reqs))))
	err := ts.s.Do(ctx, b)
	if err != nil {
		failed(span, err)
	}
	span.End()
	return err
}

// Reset implements Store.
func (ts *tracedStore) Reset(ctx context.Context, keys ...string) error {
	return ts.s.Reset(ctx, keys...)
}

// Info implements Store.
func (ts *tracedStore) Info() store.Info { return ts.s.Info() }
