-- Whether a saved state may hold an open episode (1), or surely holds none (0), beside its snapshot:
-- a sweep that reclaims a key quiet past the state TTL reads the snapshots of these alone to resolve
-- what was left open (reason went_silent), not every reclaimed key's. 1 for the states saved before
-- this column: not known, so read (docs/architecture.md, Per-resource state).
ALTER TABLE {db}.detector_state ADD COLUMN IF NOT EXISTS maybe_open UInt8 DEFAULT 1;
