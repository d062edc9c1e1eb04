-- Per-minute rollups, one row per (minute, client, resource, region,
-- outcome) and flush: rows are additive, so a minute flushed twice is two
-- rows whose sums are its counts. Partitioned by UTC day so that retention
-- drops whole tables instead of deleting rows.
CREATE TABLE analytics_rollups (
    minute          timestamptz NOT NULL,
    client          text        NOT NULL,
    resource        text        NOT NULL,
    region          text        NOT NULL,
    blocked         boolean     NOT NULL,
    requests        bigint      NOT NULL,
    cost            bigint      NOT NULL,
    latency_sum_us  bigint      NOT NULL,
    -- The latency sketch: counts of log-scale buckets, a quarter of an
    -- octave wide, in microseconds.
    latency_buckets bigint[]    NOT NULL
) PARTITION BY RANGE (minute);

CREATE INDEX analytics_rollups_minute ON analytics_rollups (minute);

-- Blocked checks one by one, with the rule and the reason.
CREATE TABLE analytics_blocked_events (
    at         timestamptz NOT NULL,
    client     text        NOT NULL,
    resource   text        NOT NULL,
    region     text        NOT NULL,
    rule       text        NOT NULL,
    reason     text        NOT NULL,
    cost       bigint      NOT NULL,
    latency_us bigint      NOT NULL
) PARTITION BY RANGE (at);

CREATE INDEX analytics_blocked_events_at ON analytics_blocked_events (at);
