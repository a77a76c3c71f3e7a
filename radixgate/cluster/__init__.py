"""Scale-out: many engine replicas behind a token-prefix router (Ray Serve).

``policy.py`` (the routing decision) and ``prefix_index.py`` (the global prefix index fed
by KV events) are pure Python and shared with ``benchmarks/router_sim.py``. Importing this
package, ``client.py`` (the gateway's ``ClusterEngine``), ``serve_app.py`` or
``replica.py`` never imports Ray: they import it inside the functions that start, stop or
call the deployment. ``serve_router.py`` is the one module that imports Ray at its top (its
router subclasses Serve's ``RequestRouter``); nothing in the package imports it: Ray Serve
loads it by its import path (``serve_app.ROUTER_CLASS``) when the deployment starts
(tests/test_cluster_units.py checks both).
"""
