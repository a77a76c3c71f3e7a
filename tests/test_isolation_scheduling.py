"""Scheduling gives a tenant no signal about another tenant's cache: longest-
prefix-first orders a tenant's queue by what *its own* namespace has cached; another
tenant's cached copy of the same prompt changes neither its order nor its usage.

Paired in-process engine tests (one request runs at a time, so finish order = admission
order): the same scenario is run with the cached prefix in the waiting tenant's own
namespace (it jumps the queue) and in another tenant's namespace (arrival order holds).
"""
from __future__ import annotations

import asyncio

from radixgate.gateway.auth import namespace_for
from radixgate.runtime.engine.api import FinishReason
from tests.support.engine import finish, first_delta, request, running_engine

SHARED = [4000 + i for i in range(96)]          # the prompt whose prefix gets cached


def fresh_prompt(i: int) -> list[int]:
    return [6000 + 131 * i + j for j in range(100)]


async def admission_order(owner_of_cached: str, waiting_tenant: str) -> tuple[list[str], int]:
    """Caches SHARED under ``owner_of_cached``; then, while a blocker runs, ``waiting_tenant``
    queues a fresh prompt then SHARED+tail. Returns (finish order, cache_read of SHARED+tail)."""
    with running_engine(max_num_seqs=1) as engine:
        warm = request(SHARED, tenant=owner_of_cached,
                       namespace=namespace_for(owner_of_cached), max_tokens=1)
        assert (await finish(engine.submit(warm))).reason is FinishReason.LENGTH
        blocker = engine.submit(request(fresh_prompt(0), tenant=waiting_tenant,
                                        namespace=namespace_for(waiting_tenant), max_tokens=20))
        await first_delta(blocker)
        ns = namespace_for(waiting_tenant)
        fresh = engine.submit(request(fresh_prompt(1), tenant=waiting_tenant, namespace=ns,
                                      max_tokens=2))
        sharer = engine.submit(request(SHARED + [7, 8, 9], tenant=waiting_tenant, namespace=ns,
                                       max_tokens=2))
        order: list[str] = []

        async def watch(name, handle):
            result = await finish(handle)
            order.append(name)
            return result

        results = await asyncio.gather(watch("blocker", blocker), watch("fresh", fresh),
                                       watch("sharer", sharer))
        return order, results[2].usage.cache_read_tokens


async def test_longest_prefix_first_reorders_within_the_owning_tenant():
    order, cache_read = await admission_order("acme", "acme")
    assert order == ["blocker", "sharer", "fresh"]
    assert cache_read >= len(SHARED) - 16


async def test_another_tenants_cached_prefix_neither_reorders_nor_hits():
    order, cache_read = await admission_order("acme", "beta")
    assert order == ["blocker", "fresh", "sharer"]
    assert cache_read == 0
