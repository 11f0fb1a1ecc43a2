"""The JupyterHub configuration of the cull_notebook tests (``jupyterhub -f hub_config.py``).

A real hub (its REST API, database, spawner and scopes) on 127.0.0.1; two stand-ins for
what the tests do not exercise: the proxy (routes kept in memory, since the tests call the
hub's API directly and configurable-http-proxy would come from npm) and the single-user
server (``singleuser.py``). Ports, paths and tokens come from the environment the test sets.
"""

# ruff: noqa: F821 - ``c`` is the config object JupyterHub's loader provides
import os
import sys

from jupyterhub.proxy import Proxy


class InMemoryProxy(Proxy):
    """The proxy's routing table, kept in the hub's memory: no process to start."""

    should_start = False

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.routes = {}

    async def add_route(self, routespec, target, data):
        self.routes[routespec] = {"routespec": routespec, "target": target, "data": data}

    async def delete_route(self, routespec):
        self.routes.pop(routespec, None)

    async def get_all_routes(self):
        return dict(self.routes)


here = os.path.dirname(os.path.abspath(__file__))
state = os.environ["HUB_STATE_DIR"]
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = int(os.environ["HUB_PUBLIC_PORT"])
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = int(os.environ["HUB_PORT"])
c.JupyterHub.db_url = f"sqlite:///{state}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = f"{state}/cookie_secret"
c.JupyterHub.pid_file = f"{state}/jupyterhub.pid"
c.JupyterHub.proxy_class = InMemoryProxy
c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allow_all = True
c.JupyterHub.spawner_class = "simple"
c.Spawner.cmd = [sys.executable, os.path.join(here, "singleuser.py")]
c.SimpleLocalProcessSpawner.home_dir_template = f"{state}/home/{{username}}"
c.Spawner.start_timeout = 30
c.Spawner.http_timeout = 30
c.JupyterHub.allow_named_servers = True
c.JupyterHub.tornado_settings = {"slow_stop_timeout": 1}  # a stop taking longer is answered 202 (stopping)
c.JupyterHub.services = [
    {"name": "burnwatch", "api_token": os.environ["HUB_CULLER_TOKEN"]},
    {"name": "no-scopes", "api_token": os.environ["HUB_WEAK_TOKEN"]},
    {"name": "test-admin", "api_token": os.environ["HUB_ADMIN_TOKEN"]},
]
c.JupyterHub.load_roles = [
    {"name": "burnwatch-culler", "scopes": ["delete:servers"], "services": ["burnwatch"]},
    {"name": "test-admin", "scopes": ["admin:users", "admin:servers"], "services": ["test-admin"]},
]
