-- Generic numeric metrics of a resource (issue 14): CPU utilisation, ingress, latency, request
-- rates, by name, as the contract's `metrics` field carries them. Older rows read an empty map.

ALTER TABLE {db}.resource_usage ADD COLUMN IF NOT EXISTS metrics Map(LowCardinality(String), Float64) AFTER extra;
