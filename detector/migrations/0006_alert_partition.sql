-- Which input partition's key made each alert. With several workers, the one holding a
-- partition delivers the alerts of its keys: after a rebalance, the new holder recovers
-- those stored and not yet posted, and the old one stops posting them, so no post is made
-- twice by two workers. -1: made before this column (delivered by partition 0's holder).
ALTER TABLE {db}.alerts ADD COLUMN IF NOT EXISTS partition Int32 DEFAULT -1 AFTER channel;
