-- What an operator reads one by one besides the blocked checks: changes
-- (configuration applied or rejected, list entries, control plane changes
-- such as emergency throttles) and the anomalies the detector found.
-- Partitioned by UTC day and kept as long as the rollups.
CREATE TABLE analytics_changes (
    at     timestamptz NOT NULL,
    kind   text        NOT NULL,
    detail text        NOT NULL
) PARTITION BY RANGE (at);

CREATE INDEX analytics_changes_at ON analytics_changes (at);

CREATE TABLE analytics_anomalies (
    minute   timestamptz      NOT NULL,
    kind     text             NOT NULL,
    client   text             NOT NULL,
    resource text             NOT NULL,
    region   text             NOT NULL,
    observed double precision NOT NULL,
    baseline double precision NOT NULL
) PARTITION BY RANGE (minute);

CREATE INDEX analytics_anomalies_minute ON analytics_anomalies (minute);

CREATE OR REPLACE FUNCTION analytics_check_parent(parent text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF parent NOT IN ('analytics_rollups', 'analytics_blocked_events', 'analytics_hourly',
                      'analytics_client_days', 'analytics_client_hours',
                      'analytics_changes', 'analytics_anomalies') THEN
        RAISE EXCEPTION 'not an analytics table: %', parent;
    END IF;
END $$;
