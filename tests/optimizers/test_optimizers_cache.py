"""The rollout cache (SQLite, safe across kill -9) and per-step checkpoints."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap

from apps_bench.optimizers.cache import Checkpoints, RolloutCache, rollout_key, stable_hash


def test_rollout_key_covers_everything_that_changes_a_run():
    base = dict(
        role_texts={"coder": "c", "tester": "t"},
        key=("train", "1"),
        seed=5,
        model={"id": "m", "temperature": 0.2},
        settings={"team_size": 4, "profile": "seed"},
    )
    k = rollout_key(**base)
    assert k == rollout_key(**{**base, "role_texts": {"tester": "t", "coder": "c"}})  # order-free
    for change in (
        {"role_texts": {"coder": "c2", "tester": "t"}},
        {"key": ("test", "1")},
        {"seed": 6},
        {"model": {"id": "m", "temperature": 0.3}},
        {"settings": {"team_size": 2, "profile": "seed"}},
    ):
        assert rollout_key(**{**base, **change}) != k, change
    assert stable_hash({"a": {1, 2}}) == stable_hash({"a": [1, 2]})


def test_put_get_first_write_wins_and_persists(tmp_path):
    path = tmp_path / "c.sqlite"
    with RolloutCache(path) as c:
        assert c.get("k") is None
        assert c.put("k", {"v": 1}) is True
        assert c.put("k", {"v": 2}) is False
        assert c.get("k") == {"v": 1}
        c.put("k", {"text": "x"}, kind="optimizer_call")  # kinds are separate namespaces
        assert c.count("rollout") == 1 and c.count("optimizer_call") == 1
        assert "k" in c and (c.hits, c.misses) == (1, 1)
    with RolloutCache(path) as c:
        assert c.get("k") == {"v": 1} and c.get("k", kind="optimizer_call") == {"text": "x"}
        assert list(c.items()) == [("k", {"v": 1})]


def test_survives_kill_9_mid_write(tmp_path):
    """A writer killed with SIGKILL loses at most the put in flight; the file stays sound."""
    path = tmp_path / "c.sqlite"
    script = textwrap.dedent(
        f"""
        import sys
        from apps_bench.optimizers.cache import RolloutCache
        c = RolloutCache({str(path)!r})
        i = 0
        while True:
            c.put(f"k{{i}}", {{"i": i, "pad": "x" * 2000}})
            print(i, flush=True)
            i += 1
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    acked = -1
    for line in proc.stdout:
        acked = int(line)
        if acked >= 200:
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    db = sqlite3.connect(str(path))
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    db.close()
    with RolloutCache(path) as c:
        n = c.count()
        assert n >= acked + 1  # every acknowledged put is there
        for i in range(acked + 1):
            assert c.get(f"k{i}")["i"] == i
        c.put("after", {"ok": True})  # and the file still takes writes
        assert c.get("after") == {"ok": True}


def test_checkpoints_atomic_and_latest(tmp_path):
    ck = Checkpoints(tmp_path / "ck")
    assert ck.latest() is None and ck.steps() == []
    ck.save(1, {"prompts": {"a": "x"}})
    ck.save(2, {"prompts": {"a": "y"}})
    (tmp_path / "ck" / ".step_00003.json.123.tmp").write_text("{half")  # a kill mid-write leaves only a tmp
    assert ck.steps() == [1, 2]
    assert ck.latest() == {"step": 2, "prompts": {"a": "y"}}
    assert ck.load(1)["prompts"] == {"a": "x"}
