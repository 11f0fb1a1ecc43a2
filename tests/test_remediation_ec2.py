"""``stop_instance`` on EC2: boto3 against moto's server mode, and against a local server
answering EC2's errors (which are retried, which are refusals)."""

from __future__ import annotations

import pytest

from detector.remediation.base import Call, NotApplicable, Target
from detector.remediation.ec2 import API, StopInstance
from tests import aws
from tests.aws import REGION, Ec2Errors, asg_instance, ec2, run_instance, session, state

moto_url = aws.moto_url  # the fixture: moto's server on 127.0.0.1


def target(resource_id: str, **kw) -> Target:
    kw.setdefault("resource_type", "gpu_instance")
    kw.setdefault("region", REGION)
    return Target(resource_id=resource_id, **kw)


def test_plan_is_the_call_and_touches_nothing(moto_url):
    instance = run_instance(moto_url)
    call = StopInstance(endpoint_url=moto_url, session=session()).plan(target(instance))
    assert call == Call(api=API, request={"InstanceIds": [instance]}, endpoint=REGION)
    assert state(moto_url, instance) == "running"
    tagged = StopInstance().plan(target("gpu-host-007", tags={"instance_id": instance}))
    assert tagged.request == {"InstanceIds": [instance]}  # a host named otherwise, its instance id in a tag


@pytest.mark.parametrize(
    "resource, reason",
    [
        (target("gpu-host-007"), "not an EC2 instance id"),
        (target("i-0123456789abcdef0", region=""), "no AWS region"),
        (target("i-0123456789abcdef0", region="us-east-1; rm -rf /"), "no AWS region"),
        (target("jupyter-alice", resource_type="notebook"), "is a notebook, not an EC2 instance"),
    ],
    ids=["host-name", "no-region", "hostile-region", "notebook"],
)
def test_not_applicable(resource, reason):
    with pytest.raises(NotApplicable, match=reason):
        StopInstance().plan(resource)


def test_execute_stops_the_instance(moto_url):
    instance = run_instance(moto_url)
    stopper = StopInstance(endpoint_url=moto_url, session=session())
    call = stopper.plan(target(instance))
    outcome = stopper.execute(call)
    assert outcome.ok and instance in outcome.detail
    assert state(moto_url, instance) in ("stopping", "stopped")
    found = stopper.observe(call)
    assert found is not None and found.ok and "after a restart" in found.detail


def test_an_auto_scaling_groups_instance_is_not_stopped(moto_url):
    """The group would count it unhealthy, terminate it and launch another: the waste goes on and the
    instance is lost. Its alert's tags may not say so (an exporter's tags are its own): the instance's
    tags in EC2 do, read just before the call."""
    instance = asg_instance(moto_url, "train-gpus")
    stopper = StopInstance(endpoint_url=moto_url, session=session())
    outcome = stopper.execute(stopper.plan(target(instance)))
    assert not outcome.ok and not outcome.retryable
    assert "Auto Scaling group 'train-gpus'" in outcome.detail and "desired capacity" in outcome.detail
    assert state(moto_url, instance) == "running"


@pytest.mark.parametrize("key, value, said", [
    ("karpenter.sh/nodepool", "gpu", ["Karpenter node pool 'gpu'", "kubectl delete node"]),
    ("aws:ec2:fleet-id", "fleet-0123", ["EC2 Fleet 'fleet-0123'", "modify-fleet"]),
    ("aws:ec2spot:fleet-request-id", "sfr-0123", ["Spot Fleet request 'sfr-0123'", "modify-spot-fleet-request"]),
    ("aws:elasticmapreduce:job-flow-id", "j-0123", ["EMR cluster 'j-0123'", "resize the instance group"]),
])  # fmt: skip
def test_an_instance_another_service_keeps_running_is_not_stopped(moto_url, key, value, said):
    instance = run_instance(moto_url)
    ec2(moto_url).create_tags(Resources=[instance], Tags=[{"Key": key, "Value": value}])
    stopper = StopInstance(endpoint_url=moto_url, session=session())
    outcome = stopper.execute(Call(API, {"InstanceIds": [instance]}, REGION))
    assert not outcome.ok and not outcome.retryable and all(s in outcome.detail for s in said), outcome.detail
    assert state(moto_url, instance) == "running"


def test_an_alert_tagged_with_its_group_is_not_applicable_when_planned():
    """A dry run already says it, with no call to EC2."""
    tagged = target("i-0123456789abcdef0", tags={"aws:autoscaling:groupName": "train-gpus"})
    with pytest.raises(NotApplicable, match="Auto Scaling group 'train-gpus'"):
        StopInstance().plan(tagged)


def test_observe_a_running_instance_says_not_done(moto_url):
    instance = run_instance(moto_url)
    assert StopInstance(endpoint_url=moto_url, session=session()).observe(Call(API, {"InstanceIds": [instance]}, REGION)) is None


def test_an_unknown_instance_is_a_refusal_not_retried(moto_url):
    outcome = StopInstance(endpoint_url=moto_url, session=session()).execute(
        Call(API, {"InstanceIds": ["i-0123456789abcdef0"]}, REGION))
    assert not outcome.ok and not outcome.retryable and outcome.detail.startswith("InvalidInstanceID.NotFound")


@pytest.mark.parametrize(
    "status, code, retryable",
    [(503, "Unavailable", True), (400, "RequestLimitExceeded", True), (500, "InternalError", True),
     (403, "UnauthorizedOperation", False), (400, "IncorrectInstanceState", False)],
)  # fmt: skip
@pytest.mark.parametrize("failing", ["DescribeInstances", "StopInstances"])
def test_errors_are_classified(status, code, retryable, failing):
    """Whichever call gets the error: the instance read first (then no stop is asked for), or the stop."""
    server = Ec2Errors(status, code, failing=failing)
    try:
        outcome = StopInstance(endpoint_url=server.url, session=session()).execute(
            Call(API, {"InstanceIds": ["i-0123456789abcdef0"]}, REGION))
    finally:
        server.close()
    assert not outcome.ok and outcome.retryable is retryable and outcome.detail.startswith(code), outcome.detail
    if failing == "DescribeInstances":
        assert "checking the instance before stopping it" in outcome.detail
        assert server.actions and set(server.actions) == {"DescribeInstances"}
    else:
        assert outcome.detail.endswith("(StopInstances)") and server.actions[0] == "DescribeInstances"
        assert "StopInstances" in server.actions


def test_no_credentials_is_reported_not_retried(moto_url, monkeypatch, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    outcome = StopInstance(endpoint_url=moto_url).execute(Call(API, {"InstanceIds": ["i-0123456789abcdef0"]}, REGION))
    assert not outcome.ok and not outcome.retryable and "no AWS credentials" in outcome.detail


def test_a_request_that_is_not_a_stop_is_refused_before_any_call():
    with pytest.raises(ValueError, match="not a StopInstances request"):
        StopInstance().execute(Call(API, {"InstanceIds": ["i-0123456789abcdef0", "../../etc"]}, REGION))


@pytest.mark.parametrize("where", ["tags", "details"])
def test_an_instance_id_tag_naming_another_instance_is_refused(moto_url, where):
    """The alert's own instance id is the instance: a tag or detail naming another (a stale or copied
    label) must not redirect the stop, and which one is meant cannot be told: neither is stopped."""
    alerted, other = run_instance(moto_url), run_instance(moto_url)
    stopper = StopInstance(endpoint_url=moto_url, session=session())
    with pytest.raises(NotApplicable, match=f"on instance {alerted} but its instance_id .* names instance {other}"):
        stopper.plan(target(alerted, **{where: {"instance_id": other}}))
    same = stopper.plan(target(alerted, **{where: {"instance_id": alerted}}))
    assert same.request == {"InstanceIds": [alerted]}
    junk = stopper.plan(target(alerted, **{where: {"instance_id": "gpu-host-007"}}))  # not an instance id: not read
    assert junk.request == {"InstanceIds": [alerted]}
    with pytest.raises(NotApplicable, match="name different instances"):  # a host named otherwise, two ids
        stopper.plan(target("gpu-host-007", tags={"instance_id": alerted}, details={"instance_id": other}))
    assert state(moto_url, alerted) == state(moto_url, other) == "running"


def test_an_instance_id_tag_never_redirects_an_approved_stop(store, tmp_path, moto_url):
    """End to end: the alert on one instance carrying another's id in a tag is not applicable (said in
    its thread), so there is nothing to approve and both instances keep running."""
    from detector.testing import LocalSlack
    from tests.test_remediation_runner import APPROVER, Wall, click, incident, posted, setup, steps

    alerted, other = run_instance(moto_url), run_instance(moto_url)
    with LocalSlack() as slack:
        runner, handler = setup(store, slack, tmp_path, moto_url, "approve", Wall())
        alert = incident(alerted)
        alert.tags["instance_id"] = other
        posted(store, alert)
        runner.run_once()
        assert [s for s, _ in steps(store)] == ["proposed", "not_applicable", "announced"]
        (message,) = slack.calls("chat.postMessage")
        assert other in message.text_of_blocks() and "cannot be told" in message.text_of_blocks()
        assert click(handler, "burnwatch_approve", APPROVER) == 409  # nothing awaits a decision
        runner.run_once()
    assert state(moto_url, alerted) == state(moto_url, other) == "running"


def test_an_instance_already_stopped_is_a_success_that_saves_nothing(moto_url):
    """Its owner stopped it since the proposal: nothing is left to do, and nothing is saved by burnwatch."""
    instance = run_instance(moto_url)
    ec2(moto_url).stop_instances(InstanceIds=[instance])
    stopper = StopInstance(endpoint_url=moto_url, session=session())
    outcome = stopper.execute(stopper.plan(target(instance)))
    assert outcome.ok and not outcome.saves and "was already stopped" in outcome.detail and instance in outcome.detail
    running = run_instance(moto_url)
    assert stopper.execute(stopper.plan(target(running))).saves


def test_an_instance_stopped_between_the_read_and_the_call_saves_nothing(moto_url):
    """StopInstances' own answer says what it was: stopped by someone else just before the call, its
    PreviousState is not running, so the stop saved nothing."""
    instance = run_instance(moto_url)
    client_session = session()

    def owner_stops_it(**_: object) -> None:  # None: the call then goes on (a value would be its answer)
        ec2(moto_url).stop_instances(InstanceIds=[instance])

    client_session.events.register("before-call.ec2.StopInstances", owner_stops_it)
    stopper = StopInstance(endpoint_url=moto_url, session=client_session)
    outcome = stopper.execute(stopper.plan(target(instance)))
    assert outcome.ok and not outcome.saves and "was already stopped" in outcome.detail


def test_an_approved_stop_of_an_instance_stopped_by_hand_records_no_saving(store, tmp_path, moto_url):
    """End to end: the owner stops the instance after the proposal, an approver then approves. The
    audit's ``succeeded`` row (which the savings query sums) saves 0 $/h, and Slack says it was
    already stopped, not what it saves."""
    from detector.testing import LocalSlack
    from tests.test_remediation_runner import APPROVER, Wall, click, incident, posted, setup

    instance, wall = run_instance(moto_url), Wall()
    with LocalSlack() as slack:
        runner, handler = setup(store, slack, tmp_path, moto_url, "approve", wall)
        posted(store, incident(instance, lasted=4 * 3600))  # its latest event is now
        runner.run_once()
        ec2(moto_url).stop_instances(InstanceIds=[instance])  # the owner, by hand
        wall.t += 120
        assert click(handler, "burnwatch_approve", APPROVER) == 200
        runner.run_once()
        done = slack.calls("chat.update")[-1].text_of_blocks()
    rows = {r["step"]: r for r in store.remediations.steps("a1")}
    assert rows["proposed"]["usd_per_hour"] == 32.77  # the burn rate when proposed
    assert rows["succeeded"]["usd_per_hour"] == 0.0 and "was already stopped" in rows["succeeded"]["result"]
    assert "Done" in done and "was already stopped" in done and "Saves" not in done and "32.77" not in done
