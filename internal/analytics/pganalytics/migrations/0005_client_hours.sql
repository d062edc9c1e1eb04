-- The rollups summed by hour without the latencies, for the top clients of
-- a range that starts or ends within a day: its whole days come from
-- analytics_client_days, its first and last hours from here.
CREATE TABLE analytics_client_hours (
    hour     timestamptz NOT NULL,
    client   text        NOT NULL,
    resource text        NOT NULL,
    region   text        NOT NULL,
    blocked  boolean     NOT NULL,
    requests bigint      NOT NULL
) PARTITION BY RANGE (hour);

CREATE INDEX analytics_client_hours_hour ON analytics_client_hours (hour);

CREATE OR REPLACE FUNCTION analytics_check_parent(parent text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF parent NOT IN ('analytics_rollups', 'analytics_blocked_events', 'analytics_hourly',
                      'analytics_client_days', 'analytics_client_hours') THEN
        RAISE EXCEPTION 'not an analytics table: %', parent;
    END IF;
END $$;
