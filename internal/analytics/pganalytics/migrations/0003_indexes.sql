-- The analytics of one client or one resource over a long range read its
-- rows from these indexes instead of every row of the range. Created on
-- the parent, so every partition, existing and new, has them.
CREATE INDEX analytics_rollups_client_minute ON analytics_rollups (client, minute);
CREATE INDEX analytics_rollups_resource_minute ON analytics_rollups (resource, minute);
