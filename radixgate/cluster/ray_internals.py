"""The one module that reaches into Ray's private names, for what Ray 2.60 offers no public
way to do (the replicas' lockdown, ``local_ray.py``). tests/test_layout.py lets this file,
and no other, use underscore names, and only Ray's; a Ray upgrade that moves them fails
tests/test_cluster_lockdown.py."""
from __future__ import annotations


def keep_node_address_local() -> None:
    """Ray reads ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` once, when ``ray`` is imported; in a
    process that imported it before, its constant is switched off here (a loopback node
    address then stays loopback instead of becoming the machine's outward one)."""
    import ray._private.ray_constants as ray_constants
    ray_constants.ENABLE_RAY_CLUSTER = False


def reload_auth_config() -> None:
    """This process reads ``RAY_AUTH_MODE`` again, as Ray does after setting it."""
    from ray._raylet import Config
    Config.initialize("")


def serve_replica_module():
    """Ray Serve's replica module, whose ``add_port_to_grpc_server`` binds ``[::]:0``."""
    import ray.serve._private.replica as serve_replica
    return serve_replica


def global_node():
    """This driver's Ray node (the processes ``ray.init`` started), or None."""
    import ray
    return ray._private.worker._global_node
