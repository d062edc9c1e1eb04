-- Coarser copies of the rollups, written with them, so that a long range
-- of every client reads thousands of rows rather than millions:
-- analytics_hourly has no client (it answers the summary, the regions, the
-- time series and the top resources), analytics_client_days has no
-- latency (it answers the top clients). Both are additive, as the rollups
-- are, and partitioned by UTC day, kept as long.
CREATE TABLE analytics_hourly (
    hour            timestamptz NOT NULL,
    resource        text        NOT NULL,
    region          text        NOT NULL,
    blocked         boolean     NOT NULL,
    requests        bigint      NOT NULL,
    cost            bigint      NOT NULL,
    latency_sum_us  bigint      NOT NULL,
    latency_buckets bigint[]    NOT NULL
) PARTITION BY RANGE (hour);

CREATE INDEX analytics_hourly_hour ON analytics_hourly (hour);

CREATE TABLE analytics_client_days (
    day      timestamptz NOT NULL,
    client   text        NOT NULL,
    resource text        NOT NULL,
    region   text        NOT NULL,
    blocked  boolean     NOT NULL,
    requests bigint      NOT NULL
) PARTITION BY RANGE (day);

CREATE INDEX analytics_client_days_day ON analytics_client_days (day);

CREATE OR REPLACE FUNCTION analytics_check_parent(parent text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF parent NOT IN ('analytics_rollups', 'analytics_blocked_events', 'analytics_hourly', 'analytics_client_days') THEN
        RAISE EXCEPTION 'not an analytics table: %', parent;
    END IF;
END $$;
