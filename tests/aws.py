"""Local AWS for tests: moto's server mode on 127.0.0.1, and a server that answers every
EC2 request with one error, for what moto does not produce (throttling, 5xx, refusals)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

import boto3
import pytest
from moto.server import ThreadedMotoServer

REGION = "us-east-1"


def session() -> boto3.session.Session:
    """A session with moto's dummy credentials (nothing from the machine's own chain)."""
    return boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing", region_name=REGION)


@pytest.fixture(scope="session")
def moto_url() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def ec2(url: str):  # noqa: ANN201 - boto3's client has no static type
    return session().client("ec2", endpoint_url=url)


def run_instance(url: str) -> str:
    """A running instance in moto; its id."""
    answer = ec2(url).run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1, InstanceType="p4d.24xlarge")
    return str(answer["Instances"][0]["InstanceId"])


def asg_instance(url: str, group: str) -> str:
    """A running instance that moto's Auto Scaling launched for a group of one; its id."""
    client = session().client("autoscaling", endpoint_url=url)
    client.create_launch_configuration(LaunchConfigurationName=group, ImageId="ami-12c6146b",
                                       InstanceType="p4d.24xlarge")  # fmt: skip
    client.create_auto_scaling_group(AutoScalingGroupName=group, LaunchConfigurationName=group, MinSize=1, MaxSize=1,
                                     DesiredCapacity=1, AvailabilityZones=[f"{REGION}a"])  # fmt: skip
    (found,) = client.describe_auto_scaling_groups(AutoScalingGroupNames=[group])["AutoScalingGroups"]
    return str(found["Instances"][0]["InstanceId"])


def state(url: str, instance_id: str) -> str:
    (reservation,) = ec2(url).describe_instances(InstanceIds=[instance_id])["Reservations"]
    return str(reservation["Instances"][0]["State"]["Name"])


class Ec2Errors:
    """Answers every request with ``status`` and EC2's error document for ``code``; counts them."""

    def __init__(self, status: int, code: str, failing: str = "") -> None:
        """``failing``: the one action that gets the error (``StopInstances``); the others are answered as EC2
        answers a ``DescribeInstances`` of a running instance with no tags. Default: every action fails."""
        self.status, self.code, self.requests = status, code, 0
        self.actions: list[str] = []
        """Each request's ``Action`` (``DescribeInstances``, ``StopInstances``), in order."""
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                form = parse_qs(self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode())
                outer.requests += 1
                outer.actions += form.get("Action", ["?"])
                if failing and form.get("Action", [""])[0] != failing:
                    ids = [v[0] for k, v in form.items() if k.startswith("InstanceId.")]
                    items = "".join(f"<item><instanceId>{i}</instanceId><instanceState><code>16</code><name>running"
                                    "</name></instanceState><tagSet/></item>" for i in ids)  # fmt: skip
                    body = (f"<?xml version='1.0' encoding='UTF-8'?><DescribeInstancesResponse><requestId>r-1</requestId>"
                            f"<reservationSet><item><reservationId>r-0</reservationId><instancesSet>{items}</instancesSet>"
                            f"</item></reservationSet></DescribeInstancesResponse>").encode()  # fmt: skip
                    self.send_response(200)
                    self.send_header("Content-Type", "text/xml")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                body = (f"<?xml version='1.0' encoding='UTF-8'?><Response><Errors><Error><Code>{outer.code}</Code>"
                        f"<Message>refused by the test server</Message></Error></Errors>"
                        f"<RequestID>r-1</RequestID></Response>").encode()  # fmt: skip
                self.send_response(outer.status)
                self.send_header("Content-Type", "text/xml")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
