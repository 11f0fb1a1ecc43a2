-- Why an alert was held back (recorded, not posted), as a typed record in its own columns:
-- `held` says which stage (inhibited | silenced | realert; '' = posted), `held_by` on whose
-- account (the silence id, the incident joined, the rule), `silenced` stays the reason for
-- people. Before, the alert manager's memory parsed the kind back out of `silenced`'s
-- text. Rows written before this migration get the columns from that text, once, here.
ALTER TABLE {db}.alerts ADD COLUMN IF NOT EXISTS held LowCardinality(String) DEFAULT multiIf(
    startsWith(silenced, 'realert:'), 'realert', startsWith(silenced, 'joined incident'), 'inhibited',
    silenced != '', 'silenced', '') AFTER silenced;

ALTER TABLE {db}.alerts ADD COLUMN IF NOT EXISTS held_by String DEFAULT multiIf(
    startsWith(silenced, 'realert:'), rule, startsWith(silenced, 'joined incident'),
    JSONExtractString(details, 'joined_alert_id'), '') AFTER held;
