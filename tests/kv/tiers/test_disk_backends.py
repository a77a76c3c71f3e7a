"""The disk tier's one atomic write (radixgate/kv/tiers/disk/backends.py: records, the manifest and the
retention file all go through it): a reader sees the old file or the whole new one."""
from __future__ import annotations

import threading

import pytest

from radixgate.kv.tiers.disk.backends import write_atomic


def test_a_write_that_fails_halfway_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "record.f"
    write_atomic(path, [b"old"])

    def chunks():
        yield b"new-half"
        raise OSError("disk full")

    with pytest.raises(OSError):
        write_atomic(path, chunks())
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["record.f"]
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_a_second_writer_of_the_same_path_does_not_touch_the_first_ones_write(tmp_path):
    """Writer A is halfway through its record when writer B (another thread) writes the same
    path whole: each writes its own temporary, so A still lands whole, after B."""
    path = tmp_path / "record.f"
    halfway, b_done = threading.Event(), threading.Event()
    outcome = []

    def chunks_of_a():
        yield b"a" * 4096
        halfway.set()
        b_done.wait(10)
        yield b"a" * 4096

    def writer_a():
        try:
            write_atomic(path, chunks_of_a())
            outcome.append("ok")
        except OSError as e:
            outcome.append(e)

    a = threading.Thread(target=writer_a)
    a.start()
    assert halfway.wait(10)
    write_atomic(path, [b"b" * 100])
    assert path.read_bytes() == b"b" * 100
    b_done.set()
    a.join(10)
    assert outcome == ["ok"]
    assert path.read_bytes() == b"a" * 8192
    assert not list(tmp_path.glob("*.tmp"))
