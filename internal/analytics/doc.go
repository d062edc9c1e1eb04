// Package analytics counts what the limiter decided, per minute, so that an
// operator can see who is limited, where and how fast the checks answer.
//
// The check path calls Recorder.Record with one Event per decision. Record
// copies the event into a bounded channel and returns: it never blocks and
// never allocates. When the channel is full the oldest event queued is
// dropped and counted (Stats.Dropped), because losing a count is better
// than slowing a check, and the last events tell more than the first.
//
// One background goroutine drains the channel every 10ms and folds events
// into rollups keyed by (minute, client, resource, region, outcome), which
// it publishes every second (and on Flush): a busy key costs one rollup a
// second, not one per event. A rollup
// holds the number of requests, the cost charged, the sum of latencies and
// a Sketch: a fixed array of log-scale latency buckets. Sketches merge by
// adding buckets, so percentiles over any set of minutes, regions or
// clients come from merged sketches, at the price of a bounded relative
// error (a quarter of an octave, about 19%).
//
// Rollups land in two places. The Memory store keeps the last hours
// (24 by default, bounded in rows) and answers Query in process; it is what
// a single instance without a database serves. A Sink (the PostgreSQL one
// lives in package pganalytics) receives the rollups changed since the
// last flush, and the blocked events one by one, every flush interval. A
// flush that fails is kept and retried with the next one; the backlog is
// bounded, and what does not fit is counted (Stats.SinkDroppedRows) as the
// gap in the sink's history.
//
// Besides the checks, the Recorder keeps two lists an operator reads one
// by one. Changes (RecordChange: configurations, control plane changes,
// emergency throttles; the daemon turns its audit events into them) come
// through a second bounded queue that never blocks either. Anomalies come
// from a detector the aggregator runs on the rollups it publishes, as
// their minutes close (see DetectorConfig). Both go to the Memory store
// and, when the Sink is a ListSink, to it, with the same bounded backlog.
//
// Rollups are additive: a minute flushed twice (once early, once when more
// events of it arrived) is two rows whose sums are the minute's counts.
// Both stores answer Query with the same Result, built by the same
// Accumulator from rollup rows.
package analytics
