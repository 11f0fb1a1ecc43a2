-- Each saved state's key's latest event time (epoch seconds; 0: saved before this column), beside
-- its snapshot: a worker that loads a partition's states learns which are past the state TTL
-- without reading their snapshots, and its sweeps delete them even if they never speak again
-- (docs/architecture.md, Per-resource state).
ALTER TABLE {db}.detector_state ADD COLUMN IF NOT EXISTS last_t Float64 DEFAULT 0;
