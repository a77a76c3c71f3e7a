"""Scale-out: many engine replicas behind a token-prefix router (Ray Serve).

``policy.py`` (the routing decision) and ``prefix_index.py`` (the global prefix index fed
by KV events) are pure Python and shared with ``benchmarks/router_sim.py``; the Ray Serve
parts (``serve_app.py``, ``serve_router.py``, ``replica.py``) import Ray lazily, so
importing this package never does.
"""
