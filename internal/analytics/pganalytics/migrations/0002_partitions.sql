-- Partition upkeep as functions, so that the service passes days as
-- parameters and never builds an identifier itself. A partition of parent
-- for day D is named parent_pYYYYMMDD and holds [D, D+1) in UTC.

CREATE FUNCTION analytics_check_parent(parent text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF parent NOT IN ('analytics_rollups', 'analytics_blocked_events') THEN
        RAISE EXCEPTION 'not an analytics table: %', parent;
    END IF;
END $$;

-- Creates the partitions of parent for days first_day .. first_day+days-1
-- that do not exist yet; returns how many it created.
CREATE FUNCTION analytics_ensure_partitions(parent text, first_day date, days int) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    d    date;
    name text;
    n    int := 0;
BEGIN
    PERFORM analytics_check_parent(parent);
    FOR i IN 0 .. days - 1 LOOP
        d := first_day + i;
        name := parent || '_p' || to_char(d, 'YYYYMMDD');
        IF to_regclass(name) IS NULL THEN
            EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%L) TO (%L)',
                name, parent,
                d::timestamp AT TIME ZONE 'UTC', (d + 1)::timestamp AT TIME ZONE 'UTC');
            n := n + 1;
        END IF;
    END LOOP;
    RETURN n;
END $$;

-- Drops the partitions of parent for days before before_day; returns how
-- many it dropped.
CREATE FUNCTION analytics_drop_partitions(parent text, before_day date) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    n int := 0;
BEGIN
    PERFORM analytics_check_parent(parent);
    FOR r IN
        SELECT c.relname
        FROM pg_inherits i
        JOIN pg_class c ON c.oid = i.inhrelid
        JOIN pg_class p ON p.oid = i.inhparent
        WHERE p.relname = parent
          AND c.relname ~ ('^' || parent || '_p[0-9]{8}$')
          AND c.relname < parent || '_p' || to_char(before_day, 'YYYYMMDD')
    LOOP
        EXECUTE format('DROP TABLE %I', r.relname);
        n := n + 1;
    END LOOP;
    RETURN n;
END $$;
