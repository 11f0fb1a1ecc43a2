-- FOCUS bills (issue 15): one row per charge, as `burnwatch ingest focus` reads it
-- (detector/billing/focus.py names the columns). Money is Decimal, never a float sum.
-- `row_key` is the charge's identity (its dimensions, and which of several identical ones it
-- is), so a re-delivered or restated export of the same period replaces its rows: the view
-- `billing` keeps the newest version of each key among the ingests that committed. An
-- ingest writes its rows, then its line in `billing_ingests`; a kill in between leaves rows
-- nobody reads, so a file is stored whole or not at all.
CREATE TABLE IF NOT EXISTS {db}.billing_charges (
    row_key UInt128,
    ingest_id String,
    version UInt64,
    source String,
    source_row UInt64,
    billing_account_id String,
    billing_account_name String,
    billing_period_start DateTime64(3, 'UTC'),
    billing_period_end DateTime64(3, 'UTC'),
    charge_period_start DateTime64(3, 'UTC'),
    charge_period_end DateTime64(3, 'UTC'),
    billed_cost Decimal(38, 12),
    effective_cost Decimal(38, 12),
    list_cost Nullable(Decimal(38, 12)),
    contracted_cost Nullable(Decimal(38, 12)),
    billing_currency LowCardinality(String),
    resource_id String,
    resource_name String,
    resource_type LowCardinality(String),
    service_category LowCardinality(String),
    service_subcategory LowCardinality(String),
    service_name LowCardinality(String),
    sub_account_id String,
    sub_account_name String,
    provider_name LowCardinality(String),
    publisher_name LowCardinality(String),
    invoice_issuer_name LowCardinality(String),
    region_id LowCardinality(String),
    region_name LowCardinality(String),
    availability_zone LowCardinality(String),
    pricing_category LowCardinality(String),
    commitment_discount_id String,
    commitment_discount_status LowCardinality(String),
    commitment_discount_type LowCardinality(String),
    commitment_discount_category LowCardinality(String),
    commitment_discount_name String,
    charge_category LowCardinality(String),
    charge_class LowCardinality(String),
    charge_description String,
    charge_frequency LowCardinality(String),
    consumed_quantity Nullable(Decimal(38, 12)),
    pricing_quantity Nullable(Decimal(38, 12)),
    consumed_unit LowCardinality(String),
    pricing_unit LowCardinality(String),
    sku_id String,
    sku_price_id String,
    tags Map(String, String),
    x_columns Map(String, String) CODEC(ZSTD(3))
) ENGINE = ReplacingMergeTree(version)
PARTITION BY toYYYYMM(billing_period_start)
ORDER BY (resource_id, charge_period_start, row_key);

CREATE TABLE IF NOT EXISTS {db}.billing_ingests (
    ingest_id String,
    version UInt64,
    at DateTime64(3, 'UTC'),
    files Array(String),
    rows UInt64,
    billed_cost Decimal(38, 12),
    effective_cost Decimal(38, 12)
) ENGINE = MergeTree
ORDER BY version;

CREATE VIEW IF NOT EXISTS {db}.billing AS
SELECT * FROM {db}.billing_charges
WHERE ingest_id IN (SELECT ingest_id FROM {db}.billing_ingests)
ORDER BY row_key, version DESC
LIMIT 1 BY row_key;
