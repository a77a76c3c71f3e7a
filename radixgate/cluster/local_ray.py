"""The local Ray cluster of ``radixgate serve --replicas N``, locked down, and its stop.

- **Loopback**: every process of the cluster (GCS, raylet and object manager, the dashboard
  process and the per-node dashboard and runtime-env agents, the workers, and the gateway's
  own driver) binds ``[cluster] ray_host``: 127.0.0.1 unless the user names another
  address. Ray binds its servers to the node's IP address, and on Linux it replaces a
  loopback node address with the machine's outward one unless its local-only mode is on
  (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, read when ``ray`` is imported): on loopback,
  that mode is set. The node address Ray took is checked after the start.
- **Token authentication**: ``RAY_AUTH_MODE=token`` (the token: ``RAY_AUTH_TOKEN``,
  ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``, which Ray generates on first use).
  Required when ``ray_host`` is not loopback (``RAY_AUTH_MODE=disabled`` is refused then);
  on loopback it is on unless the user turned it off.
- **Nothing left behind**: a watchdog process (``watchdog.py``) ends whatever of the
  cluster outlives the gateway, ``kill -9`` included.
- **Quiet**: Ray's log lines nobody running the gateway can act on are dropped
  (``UNACTIONABLE``).

``stop_local_cluster`` deletes the application (each replica shuts down: its engine and
disk tier close), then stops Ray; when the cluster's own processes are already gone (a
service manager's SIGTERM reached the whole process group) it skips Serve and stops Ray
at once, instead of waiting for a controller that cannot answer.
"""
from __future__ import annotations

import ipaddress
import logging
import os
import threading
import time

from radixgate.loopback import is_loopback

from . import ray_internals
from .watchdog import start_watchdog, stop_watchdog

log = logging.getLogger(__name__)
LOOPBACK = "127.0.0.1"
SERVE_STOP_TIMEOUT_S = 15.0       # deleting the application, while the cluster is intact
# a driver's ray.shutdown waits this long to send its task events to a GCS that may be
# gone already (a service manager's SIGTERM reaches Ray's processes too): 5 s by default
SYSTEM_CONFIG = {"task_events_shutdown_flush_timeout_ms": 500}
# (logger, message start): warnings about the gateway's own setup, not the user's
UNACTIONABLE = (
    ("ray._private.worker", "SIGTERM handler is not set because current thread"),
    ("ray.serve", "Connecting to existing Serve app"),
    ("ray.serve", "Started <ray.serve."),           # an object's repr, at the first request
)
_watchdog = None


def _is_unspecified(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def init_local_ray(host: str, num_cpus: float | None, env_vars: dict) -> None:
    """Starts the local cluster (its processes bound to ``host``) and its watchdog."""
    global _watchdog
    loopback = is_loopback(host)
    node_ip = LOOPBACK if loopback else host
    if _is_unspecified(host):
        raise RuntimeError(f"[cluster] ray_host {host!r} is not an address of this machine "
                           f"that Ray's nodes can reach: name one (or 127.0.0.1)")
    _require_token_auth(loopback)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if loopback:
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray
    if loopback:                  # read at import: ``ray`` may have been imported before
        ray_internals.keep_node_address_local()
    quiet_unactionable_logs()
    if _watchdog is None:
        _watchdog = start_watchdog()
    ray.init(num_cpus=num_cpus, include_dashboard=False, dashboard_host=node_ip,
             log_to_driver=False, runtime_env={"env_vars": env_vars},
             _node_ip_address=node_ip, _system_config=SYSTEM_CONFIG)
    bound = ray.util.get_node_ip_address()
    if bound != node_ip:
        ray.shutdown()
        raise RuntimeError(f"the local Ray cluster bound {bound}, not {node_ip}")


def _require_token_auth(loopback: bool) -> None:
    mode = os.environ.get("RAY_AUTH_MODE", "").lower()
    if not loopback and mode not in ("", "token"):
        raise RuntimeError(f"[cluster] ray_host is not a loopback address: the local Ray "
                           f"cluster needs Ray's token authentication, but RAY_AUTH_MODE="
                           f"{os.environ['RAY_AUTH_MODE']}; unset it or set it to token")
    os.environ.setdefault("RAY_AUTH_MODE", "token")     # set: no warning that it is on
    ray_internals.reload_auth_config()


class _Unactionable(logging.Filter):
    def __init__(self, start: str):
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.start)


def quiet_unactionable_logs() -> None:
    for name, start in UNACTIONABLE:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Unactionable) and f.start == start for f in logger.filters):
            logger.addFilter(_Unactionable(start))


def serve_grpc_on_loopback() -> None:
    """In a replica on a loopback node: Serve's inter-deployment gRPC server (unused here:
    the gateway calls replicas through Ray) binds loopback too, not every interface (Ray
    Serve hard-codes ``[::]:0``). Called from the replica's constructor, which runs before
    Serve starts that server."""
    import ray
    serve_replica = ray_internals.serve_replica_module()
    if not is_loopback(ray.util.get_node_ip_address()):
        return
    add_port = getattr(serve_replica, "add_port_to_grpc_server", None)
    if add_port is None or getattr(add_port, "radixgate_loopback", False):
        return

    def add_port_on_loopback(server, address: str):
        return add_port(server, address.replace("[::]:", f"{LOOPBACK}:"))
    add_port_on_loopback.radixgate_loopback = True
    serve_replica.add_port_to_grpc_server = add_port_on_loopback


def cluster_intact() -> bool:
    """Every process ``ray.init`` started (GCS, raylet, ...) still runs."""
    node = ray_internals.global_node()
    return node is not None and not node.dead_processes()


def stop_local_cluster(app_name: str, timeout_s: float = SERVE_STOP_TIMEOUT_S) -> None:
    """Deletes the application (while the cluster is intact, up to ``timeout_s``), then
    stops Ray and the watchdog."""
    global _watchdog
    import ray
    try:
        if ray.is_initialized() and cluster_intact():
            _delete_app(app_name, timeout_s)
    finally:
        if ray.is_initialized():
            ray.shutdown()
        if _watchdog is not None:
            stop_watchdog(_watchdog)
            _watchdog = None


def _delete_app(app_name: str, timeout_s: float) -> None:
    """``serve.delete`` on a thread, waited for while the cluster stays intact."""
    from ray import serve
    done = threading.Event()

    def delete():
        try:
            serve.delete(app_name)
        except Exception as e:  # noqa: BLE001 - stopping goes on: Ray stops next
            log.warning("stopping the Serve application: %s", e)
        finally:
            done.set()

    threading.Thread(target=delete, name="serve-delete", daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while not done.wait(0.1):
        if not cluster_intact():
            log.info("the local Ray cluster is already stopping (its processes got the signal)")
            return
        if time.monotonic() >= deadline:
            log.warning("the Serve application did not stop within %g s", timeout_s)
            return
