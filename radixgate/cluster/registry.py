"""The request routers of this process, for the gateway's stats and commands.

Its own module: Ray Serve ships the router's module to the handle by value (a copy of its
globals), so a registry kept there would not be the one the gateway reads.
"""
from __future__ import annotations

import weakref

_ROUTERS: weakref.WeakSet = weakref.WeakSet()


def register(router) -> None:
    _ROUTERS.add(router)


def routers() -> list:
    return list(_ROUTERS)
