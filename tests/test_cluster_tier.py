"""The disk tier with replicas (radixgate/cluster/tier_folders.py): replica i uses ``DIR/replica-i``
with its part of the budget, indices are the lowest free ones and a replaced replica gets
its predecessor's back, folders of indices the deployment no longer has are reclaimed at
start, and setups that cannot work are refused at start with one line (before Ray). Then
the real default model on 2 replicas with the tier on (Ray): both serve, tenants stay
apart, and a prefix evicted from a replica's memory is read back from its disk folder."""
from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from radixgate.cluster.tier_folders import (claim_replica_index, prepare_deployment_folder,
                                            release_deployment_folder)
from radixgate.kv import CacheConfig, DiskTierConfig
from radixgate.kv.tiers.disk import TierFolderError, TierStats
from tests.support.server import ADMIN_KEY, ServerProcess, ServerSpec


def tier(folder: Path, gb: float = 4.0) -> CacheConfig:
    return CacheConfig(disk=DiskTierConfig(str(folder), gb))


def hold(path: Path) -> int:
    """A lock another process would hold (flock conflicts across fds of one process too)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, b"4242\n")
    return fd


@pytest.fixture
def deployment(tmp_path):
    folders = []

    def prepare(cache: CacheConfig, slots: int) -> None:
        prepare_deployment_folder(cache, slots)
        folders.append(cache.disk.dir)
    yield prepare
    for folder in folders:
        release_deployment_folder(folder)


def test_each_replica_gets_its_own_folder_and_an_equal_part_of_the_budget():
    cache = tier(Path("/srv/kv/"), gb=4)
    parts = [cache.for_replica(i, 2) for i in (0, 1)]
    assert [p.disk.dir for p in parts] == ["/srv/kv/replica-0", "/srv/kv/replica-1"]
    assert sum(p.disk.budget_bytes for p in parts) == cache.disk.budget_bytes == 4 << 30
    assert CacheConfig().for_replica(3, 4) == CacheConfig()
    with pytest.raises(ValueError):
        cache.for_replica(2, 2)


def test_indices_are_the_lowest_free_and_a_replaced_replica_gets_its_own_back(tmp_path):
    cache = tier(tmp_path)
    claims = [claim_replica_index(cache, 3, wait_s=0) for _ in range(3)]
    assert [index for index, _ in claims] == [0, 1, 2]
    with pytest.raises(TierFolderError, match="claimed by a running replica"):
        claim_replica_index(cache, 3, wait_s=0)          # a 4th of at most 3
    os.close(claims[1][1])                                 # replica 1 dies ...
    index, fd = claim_replica_index(cache, 3, wait_s=0)    # ... and Serve starts another
    assert index == 1 and (tmp_path / "replica-1" / "claim").read_text() == f"{os.getpid()}\n"
    for _, claim in (claims[0], claims[2], (index, fd)):
        os.close(claim)


def test_folders_of_replicas_that_no_longer_exist_are_reclaimed_at_start(tmp_path, deployment):
    for index in range(4):
        (tmp_path / f"replica-{index}" / "models").mkdir(parents=True)
        (tmp_path / f"replica-{index}" / "models" / "block.f").write_bytes(b"kv")
    (tmp_path / "replica-notes").mkdir()
    deployment(tier(tmp_path), 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "lock", "replica-0", "replica-1", "replica-notes"]
    assert (tmp_path / "replica-1" / "models" / "block.f").read_bytes() == b"kv"   # kept


def test_a_deployment_refuses_folders_it_cannot_use(tmp_path, deployment):
    held = hold(tmp_path / "kv" / "lock")                  # another server on the folder
    with pytest.raises(TierFolderError, match="in use by another radixgate server .pid 4242"):
        deployment(tier(tmp_path / "kv"), 2)
    os.close(held)
    held = hold(tmp_path / "kv" / "replica-1" / "claim")   # a replica of another run
    with pytest.raises(TierFolderError, match="in use by replica 1 .*pid 4242"):
        deployment(tier(tmp_path / "kv"), 2)
    with pytest.raises(TierFolderError, match="in use by replica 1"):
        deployment(tier(tmp_path / "kv"), 1)               # not reclaimed while in use
    os.close(held)
    (tmp_path / "file").write_text("")
    with pytest.raises(TierFolderError, match="cannot be used"):
        deployment(tier(tmp_path / "file" / "kv"), 2)
    deployment(tier(tmp_path / "kv" / "new"), 2)
    for folder in ("kv", "kv/new", "kv/new/replica-0", "kv/new/replica-1"):
        assert (tmp_path / folder).stat().st_mode & 0o777 == 0o700, folder
    (tmp_path / "alias").symlink_to(tmp_path / "kv" / "new")
    with pytest.raises(TierFolderError, match=f"in use by another radixgate server .pid {os.getpid()}"):
        prepare_deployment_folder(tier(tmp_path / "alias"), 2)   # a second deployment


@pytest.mark.parametrize("replicas", [1, 2])
def test_serve_refuses_a_folder_in_use_with_one_line_before_anything_starts(tmp_path, replicas):
    folder = tmp_path / "kv"
    held = hold(folder / ("replica-1/claim" if replicas > 1 else "lock"))
    try:
        done = subprocess.run(
            [sys.executable, "-m", "radixgate.gateway.cli", "serve", "--tiny", "--port", "1",
             "--replicas", str(replicas), "--kv-disk-dir", str(folder), "--kv-disk-gb", "1"],
            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    finally:
        os.close(held)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith(f"radixgate: the KV disk tier folder {folder}") and "in use" in lines[0]


def test_the_replicas_disk_tiers_sum_into_the_deployment_s():
    from radixgate.cluster.snapshot_merge import merge_tiers

    def one(index: int, hits: int) -> TierStats:
        return TierStats("disk", f"/srv/kv/replica-{index}", 1 << 29, 3, 300, 0, hits, 1, 2,
                         200, 0.5, 4, 400, 0, {"backlog": 1}, index == 1, 0)
    merged = merge_tiers([one(0, 10), one(1, 20)])
    assert (merged.folder, merged.budget_bytes, merged.hit_tokens) == ("/srv/kv", 1 << 30, 30)
    assert dict(merged.drops) == {"backlog": 2} and merged.full
    assert merge_tiers([]) is None


# ---- the real default model on 2 replicas, the tier on (Ray) ----------------------------

DISK_GB = 0.5
# 0.0078 GB: ~700 tokens of the default int8 KV (11,880 bytes a token)
REAL_SPEC = ServerSpec(tiny=False, kv_cache_gb=0.0078, max_model_len=1024, tenants=("acme", "beta"),
                       extra_args=("--replicas", "2", "--threads", "1", "--policy", "lru",
                                   "--kv-disk-gb", str(DISK_GB)))


@pytest.fixture(scope="module")
def real_replicas(tmp_path_factory):
    pytest.importorskip("ray.serve")
    from tests.test_cluster_ray import end_leftovers
    folder = tmp_path_factory.mktemp("kv-tier") / "kv"
    spec = replace(REAL_SPEC, extra_args=REAL_SPEC.extra_args + ("--kv-disk-dir", str(folder)))
    srv = ServerProcess(spec).start(timeout_s=300)
    family = [srv.proc.pid] + [p.pid for p in psutil.Process(srv.proc.pid).children(recursive=True)]
    try:
        yield srv, folder
    finally:
        srv.stop(timeout_s=60)
        end_leftovers(family)


def test_two_replicas_with_the_tier_serve_each_tenant_and_read_an_evicted_prefix_from_disk(
        real_replicas):
    from tests.test_cluster_ray import call, complete
    srv, folder = real_replicas
    prompt = list(range(2000, 2320))                  # 20 blocks of 16
    assert complete(srv, "acme", prompt)[1] == 0
    assert complete(srv, "acme", prompt)[1] >= 304    # from memory, on the replica holding it
    assert complete(srv, "beta", prompt)[1] == 0      # another tenant reads none of it
    # fillers sharing the prompt's first block go to its replica (the router follows the
    # prefix) and push the rest of it out of that replica's 43 blocks, to its disk folder
    for i in range(3):
        complete(srv, "acme", prompt[:16] + list(range(6000 + 400 * i, 6384 + 400 * i)))
    assert complete(srv, "acme", prompt)[1] >= 304    # memory's first block, disk's rest
    status, stats = call(srv, "/v1/cache/stats", ADMIN_KEY)
    assert status == 200, stats
    disk = stats["tiers"]["disk"]
    assert disk["enabled"] and disk["hit_tokens"] >= 288 and disk["writes"] > 0
    assert disk["budget_bytes"] == int(DISK_GB / 2 * (1 << 30)) * 2    # one budget, split
    assert sorted(p.name for p in folder.iterdir() if p.is_dir()) == ["replica-0", "replica-1"]
    written = [p for p in folder.glob("replica-*/**/*.f")]
    assert written and {p.relative_to(folder).parts[0] for p in written} <= {"replica-0",
                                                                             "replica-1"}
