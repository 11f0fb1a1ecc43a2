"""The ``build-or-call`` report over a store filled by the pipeline with the simulator's
model-serving workloads (a week of hourly usage), checked against the price list."""

from __future__ import annotations

import pytest

from detector.llm_costs import compare
from detector.reports import run_report
from detector.simulate import SimConfig
from detector.store import Store
from tests.helpers import fleet_file, store_fleet

ALL = 40 * 86_400.0
PER_8B_REQUEST = (500 * 0.18 + 250 * 0.18) / 1e6
P4D = 32.77


@pytest.fixture(scope="module")
def rows(tmp_path_factory, chdb_client, ruleset):
    cfg = SimConfig(hours=2, training_hosts=0, notebooks=0, inference_endpoints=0, buckets=0, vector_dbs=0,
                    cpu_instances=0, seed=5, choices=1)  # fmt: skip
    path, _ = fleet_file(tmp_path_factory.mktemp("choices") / "fleet.jsonl", cfg, ruleset.pricing)
    chdb_client.command("DROP DATABASE IF EXISTS t_build_or_call")
    store = Store(chdb_client, "t_build_or_call")
    store.migrate()
    store_fleet(store, ruleset, path)
    return {r["resource_id"].split("-", 2)[2]: r for r in run_report(store, "build-or-call", ALL, "", ruleset)}


def test_only_resources_with_a_model_are_listed(rows):
    assert set(rows) == {"light-endpoint", "busy-endpoint", "heavy-api", "small-api"}


def test_a_light_endpoint_costs_more_per_1k_requests_than_the_api(rows):
    r = rows["light-endpoint"]
    assert r["direction"] == "call" and r["verdict"] == "switch" and r["token_source"] == "assumed per request"
    assert r["usd_per_1k_requests"] == pytest.approx(r["usd"] * 1000 / r["requests"], rel=1e-3)
    assert r["alternative_usd_per_1k_requests"] == pytest.approx(PER_8B_REQUEST * 1000, rel=1e-3)
    # The crossover: the endpoint's $1.006 an hour buys this many API requests.
    assert r["crossover_requests_per_h"] == pytest.approx(1.006 / PER_8B_REQUEST, rel=0.01)
    assert rows["busy-endpoint"]["verdict"] == "keep"


def test_heavy_api_spend_would_be_cheaper_self_hosted(rows):
    r = rows["heavy-api"]
    assert r["direction"] == "build" and r["verdict"] == "switch" and r["token_source"] == "measured"
    assert r["self_host_instances"] >= 1
    assert r["alternative_usd"] == pytest.approx(r["self_host_instances"] * P4D * r["hours"], rel=0.01)
    assert rows["small-api"]["verdict"] == "keep"


@pytest.mark.parametrize(
    "row, verdict",
    [
        ({"model": "no-such-model", "resource_type": "inference_endpoint", "usd": 10, "hours": 10}, "not priced"),
        ({"model": "gpt-4o", "resource_type": "llm_api", "usd": 0, "hours": 0, "requests": 0}, "keep"),  # nothing yet
        ({"model": "gpt-4o", "resource_type": "llm_api", "usd": 1e308, "hours": 1, "requests": 1,
          "measured_tokens": 1, "output_tokens": 1e308, "peak_output_per_h": 1e308}, "switch"),  # absurd but finite
    ],
    ids=["unpriced", "empty", "absurd"],
)
def test_rows_the_price_list_cannot_judge_say_so(ruleset, row, verdict):
    assert compare(row, ruleset.pricing, ["llm_api"], (500, 250), 20)["verdict"] == verdict


def test_requests_without_token_counts_are_priced_at_the_assumption(ruleset):
    # An endpoint whose token counter was scraped for half its hours: 1,000 requests an hour,
    # 400 + 200 tokens each where measured. The other half's requests take the rule's 500 + 250,
    # not zero tokens (which would make the API look free).
    row = {"model": "llama-3.1-8b-instruct", "resource_type": "inference_endpoint", "usd": 10.06, "hours": 10,
           "requests": 10_000, "measured_tokens": 1, "input_tokens": 5 * 400_000, "output_tokens": 5 * 200_000,
           "unmeasured_in_requests": 5_000, "unmeasured_out_requests": 5_000, "peak_requests_per_h": 1_000,
           "peak_output_per_h": 200_000, "peak_unmeasured_requests_per_h": 1_000}  # fmt: skip
    out = compare(row, ruleset.pricing, ["llm_api"], (500, 250), 20)
    tokens = 5 * 600_000 + 5_000 * 750
    assert out["alternative_usd"] == pytest.approx(tokens * 0.18 / 1e6, abs=0.01)
    assert out["token_source"] == "partly assumed per request"
    # The same split read from the store: each light-endpoint hour reported no tokens.
    assert compare({**row, "measured_tokens": 0, "unmeasured_in_requests": None, "unmeasured_out_requests": None},
                   ruleset.pricing, ["llm_api"], (500, 250), 20)["token_source"] == "assumed per request"


def test_the_store_splits_requests_with_and_without_token_counts(rows):
    # The simulator's endpoints report no token counts, its API usage reports them.
    light, heavy = rows["light-endpoint"], rows["heavy-api"]
    assert light["token_source"] == "assumed per request" and heavy["token_source"] == "measured"
    assert light["alternative_usd"] == pytest.approx(light["requests"] * PER_8B_REQUEST, abs=0.01)


def test_the_report_reads_the_model_tag_the_rule_names(tmp_path_factory, chdb_client, ruleset):
    # A fleet whose models are tagged `llm` (the rule says model_tag: llm): the report lists them,
    # as the rule alerts on them; with the default tag it would list nothing.
    import dataclasses

    rules = [dataclasses.replace(r, detector=type(r.detector)(name=r.detector.name, severity=r.detector.severity,
                                                             params=r.detector.params.model_copy(update={"model_tag": "llm"}),
                                                             pricing=r.detector.pricing))
             if r.detector.type == "build_or_call" else r for r in ruleset.rules]  # fmt: skip
    relabelled = dataclasses.replace(ruleset, rules=rules)
    cfg = SimConfig(hours=2, training_hosts=0, notebooks=0, inference_endpoints=0, buckets=0, vector_dbs=0,
                    cpu_instances=0, seed=5, choices=1)  # fmt: skip
    path, _ = fleet_file(tmp_path_factory.mktemp("llm") / "fleet.jsonl", cfg, ruleset.pricing)
    path.write_text(path.read_text().replace('"model":', '"llm":'))
    chdb_client.command("DROP DATABASE IF EXISTS t_build_or_call_llm")
    store = Store(chdb_client, "t_build_or_call_llm")
    store.migrate()
    store_fleet(store, ruleset, path)
    listed = {r["resource_id"].split("-", 2)[2] for r in run_report(store, "build-or-call", ALL, "", relabelled)}
    assert listed == {"light-endpoint", "busy-endpoint", "heavy-api", "small-api"}
    assert run_report(store, "build-or-call", ALL, "", ruleset) == []
