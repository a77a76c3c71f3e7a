"""The cache's config (radixgate/kv/config.py) and its TOML sections: the disk tier's keys in
``[cache.disk]`` (``DiskTierConfig``), the old ``[cache] disk_dir`` / ``disk_gb`` still read
with one deprecation line, the flags onto the new keys."""
from __future__ import annotations

import warnings

import pytest

from radixgate.gateway.cli import build_parser, config_from_args
from radixgate.gateway.config import ConfigError, config_from_dict, load_config
from radixgate.kv.config import CacheConfig, DiskTierConfig


def test_the_disk_section_sets_the_disk_tier(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    path = tmp_path / "radixgate.toml"
    path.write_text('[cache]\nkv_cache_gb = 1\n[cache.disk]\ndir = "~/kv"\ngb = 4\n')
    with warnings.catch_warnings():
        warnings.simplefilter("error")                # the new section warns about nothing
        cache = load_config(path).cache
    assert cache.disk == DiskTierConfig(str(tmp_path / "kv"), 4.0)
    assert cache.disk.enabled and cache.disk.budget_bytes == 4 << 30
    assert cache.kv_cache_gb == 1.0
    assert not CacheConfig().disk.enabled


def test_the_old_cache_keys_still_work_with_exactly_one_deprecation_line():
    with pytest.warns(FutureWarning) as record:
        cache = config_from_dict({"cache": {"disk_dir": "/srv/kv", "disk_gb": 2}}).cache
    assert cache.disk == DiskTierConfig("/srv/kv", 2.0)
    assert [str(w.message) for w in record] == [
        "config: [cache] disk_dir, disk_gb are deprecated and will be removed; "
        "set [cache.disk] dir, gb instead"]


def test_an_old_key_and_its_new_place_both_set_is_an_error():
    with pytest.raises(ConfigError, match=r"\[cache\] disk_gb and \[cache.disk\] gb are both"):
        config_from_dict({"cache": {"disk_gb": 2, "disk": {"dir": "/srv/kv", "gb": 1}}})


def test_the_flags_set_the_new_keys_over_the_file(tmp_path):
    path = tmp_path / "radixgate.toml"
    path.write_text('[cache.disk]\ndir = "/srv/kv"\ngb = 4\n')
    args = build_parser().parse_args(["serve", "--config", str(path), "--kv-disk-dir",
                                      str(tmp_path / "kv"), "--kv-disk-gb", "2.5"])
    assert config_from_args(args).cache.disk == DiskTierConfig(str(tmp_path / "kv"), 2.5)


@pytest.mark.parametrize("disk, fragment", [
    ({"dir": "/srv/kv"}, r"cache.disk dir and gb go together"),
    ({"gb": 3}, r"cache.disk dir and gb go together"),
    ({"dir": "/srv/kv", "gb": -1}, r"cache.disk gb must be >= 0"),
    ({"dir": "/srv/kv", "gb": "ten"}, r"DiskTierConfig.gb: expected float, got 'ten'"),
    ({"dir": 7, "gb": 1}, r"DiskTierConfig.dir: expected str"),
    ({"folder": "/srv/kv", "gb": 1}, r"unknown keys in \[cache.disk\]: \['folder'\]"),
    ("/srv/kv", r"\[cache.disk\] must be a table"),
])
def test_a_bad_value_in_the_disk_section_is_a_clear_error(disk, fragment):
    with pytest.raises(ConfigError, match=fragment):
        config_from_dict({"cache": {"disk": disk}})


def test_the_disk_tier_needs_token_exact_prefix_caching():
    disk = {"dir": "/srv/kv", "gb": 1}
    for other in ({"page_rounded_match": True}, {"enable_prefix_cache": False}):
        with pytest.raises(ConfigError, match="needs the prefix cache"):
            config_from_dict({"cache": {"disk": disk, **other}})


def test_each_replica_gets_its_folder_and_its_part_of_the_budget():
    cache = CacheConfig(disk=DiskTierConfig("/srv/kv/", 4.0))
    parts = [cache.for_replica(i, 2).disk for i in (0, 1)]
    assert parts == [DiskTierConfig("/srv/kv/replica-0", 2.0),
                     DiskTierConfig("/srv/kv/replica-1", 2.0)]
    assert CacheConfig().for_replica(1, 2) == CacheConfig()
