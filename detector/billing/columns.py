"""The FOCUS columns burnwatch reads, derived from the spec text rather than from memory.

Source: /work/shared/reference/focus-1.2/columns/*.md (FOCUS 1.2, one file per column). For each column the
"Content constraints" table gives the data type, the feature level (Mandatory / Conditional / Recommended) and
whether nulls are allowed, and an "Allowed values" table where the spec lists one.

Versions: every column in NORMALIZED below was introduced at FOCUS 1.0 or earlier (the spec's "Introduced
(version)" field), and the 1.2 text names no renamed or deprecated column, so 1.0, 1.1 and 1.2 exports share
these names; we assume (the reference holds only 1.2) that no rename happened between 1.0 and 1.2. Columns 1.1 and
1.2 added that the normalized table does not carry (CapacityReservationId, SkuMeter, SkuPriceDetails, InvoiceId,
BillingAccountType, PricingCurrency*, ...) land in x_columns like any other column. FOCUS 1.3 names the provider
ServiceProviderName: it fills provider_name when ProviderName is absent (when both are present ProviderName wins
and ServiceProviderName stays in x_columns), and a 1.3 file may then omit the PublisherName it deprecates.

ListCost and ContractedCost are Mandatory in 1.2 but the normalized table keeps them null when absent (the lead's
schema), so READ_REQUIRED leaves them out; everything else Mandatory must be present.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["datetime", "decimal", "string", "json"]
Level = Literal["Mandatory", "Conditional", "Recommended"]


@dataclass(frozen=True)
class Column:
    """One FOCUS column as the spec defines it, and the snake_case name burnwatch stores it under."""

    focus: str
    name: str
    kind: Kind
    level: Level
    nullable: bool
    allowed: frozenset[str] | None = None

    @property
    def mandatory(self) -> bool:
        return self.level == "Mandatory"


# chargecategory.md, chargeclass.md, chargefrequency.md, pricingcategory.md, commitmentdiscountstatus.md,
# commitmentdiscountcategory.md, servicecategory.md, servicesubcategory.md: the "Allowed values" tables.
CHARGE_CATEGORIES = frozenset({"Usage", "Purchase", "Tax", "Credit", "Adjustment"})
CHARGE_CLASSES = frozenset({"Correction"})
CHARGE_FREQUENCIES = frozenset({"One-Time", "Recurring", "Usage-Based"})
PRICING_CATEGORIES = frozenset({"Standard", "Dynamic", "Committed", "Other"})
COMMITMENT_STATUSES = frozenset({"Used", "Unused"})
COMMITMENT_CATEGORIES = frozenset({"Spend", "Usage"})
SERVICE_CATEGORIES = frozenset({
    "AI and Machine Learning", "Analytics", "Business Applications", "Compute", "Databases", "Developer Tools",
    "Multicloud", "Identity", "Integration", "Internet of Things", "Management and Governance", "Media",
    "Migration", "Mobile", "Networking", "Security", "Storage", "Web", "Other",
})
SERVICE_SUBCATEGORIES = frozenset({
    "AI Platforms", "Bots", "Generative AI", "Machine Learning", "Natural Language Processing",
    "Other (AI and Machine Learning)", "Analytics Platforms", "Business Intelligence", "Data Processing", "Search",
    "Streaming Analytics", "Other (Analytics)", "Productivity and Collaboration", "Other (Business Applications)",
    "Containers", "End User Computing", "Quantum Compute", "Serverless Compute", "Virtual Machines",
    "Other (Compute)", "Caching", "Data Warehouses", "Ledger Databases", "NoSQL Databases", "Relational Databases",
    "Time Series Databases", "Other (Databases)", "Developer Platforms", "Continuous Integration and Deployment",
    "Development Environments", "Source Code Management", "Quality Assurance", "Other (Developer Tools)",
    "Identity and Access Management", "Other (Identity)", "API Management", "Messaging", "Workflow Orchestration",
    "Other (Integration)", "IoT Analytics", "IoT Platforms", "Other (Internet of Things)", "Architecture",
    "Compliance", "Cost Management", "Data Governance", "Disaster Recovery", "Endpoint Management", "Observability",
    "Support", "Other (Management and Governance)", "Content Creation", "Gaming", "Media Streaming", "Mixed Reality",
    "Other (Media)", "Data Migration", "Resource Migration", "Other (Migration)", "Other (Mobile)",
    "Multicloud Integration", "Other (Multicloud)", "Application Networking", "Content Delivery",
    "Network Connectivity", "Network Infrastructure", "Network Routing", "Network Security", "Other (Networking)",
    "Secret Management", "Security Posture Management", "Threat Detection and Response", "Other (Security)",
    "Backup Storage", "Block Storage", "File Storage", "Object Storage", "Storage Platforms", "Other (Storage)",
    "Application Platforms", "Other (Web)", "Other (Other)",
})

_M: Level = "Mandatory"
_C: Level = "Conditional"
_R: Level = "Recommended"

# The normalized table's columns in its order (HELPERS.md, issue 15 shared interfaces), with each column's
# constraints as its spec file states them. invoiceissuer.md's Column ID is InvoiceIssuerName, provider.md's
# ProviderName, publisher.md's PublisherName.
NORMALIZED: tuple[Column, ...] = (
    Column("BillingAccountId", "billing_account_id", "string", _M, False),
    Column("BillingAccountName", "billing_account_name", "string", _M, True),
    Column("BillingPeriodStart", "billing_period_start", "datetime", _M, False),
    Column("BillingPeriodEnd", "billing_period_end", "datetime", _M, False),
    Column("ChargePeriodStart", "charge_period_start", "datetime", _M, False),
    Column("ChargePeriodEnd", "charge_period_end", "datetime", _M, False),
    Column("BilledCost", "billed_cost", "decimal", _M, False),
    Column("EffectiveCost", "effective_cost", "decimal", _M, False),
    Column("ListCost", "list_cost", "decimal", _M, False),
    Column("ContractedCost", "contracted_cost", "decimal", _M, False),
    Column("BillingCurrency", "billing_currency", "string", _M, False),
    Column("ResourceId", "resource_id", "string", _C, True),
    Column("ResourceName", "resource_name", "string", _C, True),
    Column("ResourceType", "resource_type", "string", _C, True),
    Column("ServiceCategory", "service_category", "string", _M, False, SERVICE_CATEGORIES),
    Column("ServiceSubcategory", "service_subcategory", "string", _R, False, SERVICE_SUBCATEGORIES),
    Column("ServiceName", "service_name", "string", _M, False),
    Column("SubAccountId", "sub_account_id", "string", _C, True),
    Column("SubAccountName", "sub_account_name", "string", _C, True),
    Column("ProviderName", "provider_name", "string", _M, False),
    Column("PublisherName", "publisher_name", "string", _M, False),
    Column("InvoiceIssuerName", "invoice_issuer_name", "string", _M, False),
    Column("RegionId", "region_id", "string", _C, True),
    Column("RegionName", "region_name", "string", _C, True),
    Column("AvailabilityZone", "availability_zone", "string", _R, True),
    Column("PricingCategory", "pricing_category", "string", _C, True, PRICING_CATEGORIES),
    Column("CommitmentDiscountId", "commitment_discount_id", "string", _C, True),
    Column("CommitmentDiscountStatus", "commitment_discount_status", "string", _C, True, COMMITMENT_STATUSES),
    Column("CommitmentDiscountType", "commitment_discount_type", "string", _C, True),
    Column("CommitmentDiscountCategory", "commitment_discount_category", "string", _C, True, COMMITMENT_CATEGORIES),
    Column("CommitmentDiscountName", "commitment_discount_name", "string", _C, True),
    Column("ChargeCategory", "charge_category", "string", _M, False, CHARGE_CATEGORIES),
    Column("ChargeClass", "charge_class", "string", _M, True, CHARGE_CLASSES),
    Column("ChargeDescription", "charge_description", "string", _M, True),
    Column("ChargeFrequency", "charge_frequency", "string", _R, False, CHARGE_FREQUENCIES),
    Column("ConsumedQuantity", "consumed_quantity", "decimal", _C, True),
    Column("PricingQuantity", "pricing_quantity", "decimal", _M, True),
    Column("ConsumedUnit", "consumed_unit", "string", _C, True),
    Column("PricingUnit", "pricing_unit", "string", _M, True),
    Column("SkuId", "sku_id", "string", _C, True),
    Column("SkuPriceId", "sku_price_id", "string", _C, True),
    Column("Tags", "tags", "json", _C, True),
)

BY_FOCUS: dict[str, Column] = {c.focus: c for c in NORMALIZED}

# FOCUS 1.3's name for the provider; stands in for ProviderName when that is absent.
SERVICE_PROVIDER_NAME = "ServiceProviderName"

# Mandatory columns a file may omit: the costs the normalized table keeps null when absent.
ABSENT_AS_NULL = frozenset({"ListCost", "ContractedCost"})

# Mandatory columns that must be present for a file to be read.
READ_REQUIRED: tuple[str, ...] = tuple(c.focus for c in NORMALIZED if c.mandatory and c.focus not in ABSENT_AS_NULL)

# Columns whose cells must not be empty: the ones every downstream sum and window depends on (spec: Allows nulls
# False). Other non-nullable strings are read as '' when empty rather than refusing the whole bill.
NOT_NULL: frozenset[str] = frozenset({
    "BillingPeriodStart", "BillingPeriodEnd", "ChargePeriodStart", "ChargePeriodEnd",
    "BilledCost", "EffectiveCost", "BillingCurrency", "ChargeCategory",
})
