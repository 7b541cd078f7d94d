"""The squeue watcher of hydra/launcher=slurm on squeue's own output format (no cluster needed;
the cluster tests in test_slurm*.py run it for real)."""

from __future__ import annotations

import pickle
import time
from pathlib import Path

import pytest

pytest.importorskip("submitit")
from apps_bench.launchers.slurm import ENDED, JobsNotSchedulable, SqueueWatcher, _ended_badly  # noqa: E402


def watcher(*jobs: str) -> SqueueWatcher:
    w = SqueueWatcher(poll_s=10)
    for j in jobs:
        w.register_job(j)
    return w


def test_states_from_squeue_and_a_job_that_left_the_queue_has_ended() -> None:
    w = watcher("7", "7_0", "7_1", "7_2")
    info = w.read_info(b"7_0|RUNNING|None\n7_1|PENDING|Resources\n7_2|CANCELLED|None\n")
    w._info_dict.update(info)
    assert [w.is_done(j, mode="cache") for j in ("7_0", "7_1", "7_2")] == [False, False, True]
    assert w.cells() == ["7_0", "7_1", "7_2"]  # the array's own id is not a cell
    # 7_0 disappears from the queue (purged, no accounting): ended, not waited on forever
    w._info_dict.update(w.read_info(b"7_1|RUNNING|None\n"))
    assert w.get_state("7_0", mode="cache") == ENDED and w.is_done("7_0", mode="cache")
    assert not w.is_done("7_1", mode="cache")


def test_a_job_never_listed_counts_as_ended_only_after_the_grace() -> None:
    w = watcher("9")
    assert "9" not in w.read_info(b"")
    w._registered_at["9"] = time.time() - w.gone_grace_s - 1
    assert w.read_info(b"")["9"]["State"] == ENDED


def test_a_job_pending_for_a_reason_that_cannot_clear_ends_the_sweep() -> None:
    w = watcher("5_0", "5_1")
    with pytest.raises(JobsNotSchedulable, match=r"5_1 \(PartitionConfig\).*hydra.launcher.partition"):
        w.read_info("5_0|RUNNING|None\n5_1|PENDING|PartitionConfig\n")


def test_a_long_wait_is_reported_with_its_reason(capsys: pytest.CaptureFixture[str]) -> None:
    w = watcher("3_0")
    w.read_info("3_0|PENDING|Resources\n")
    w._pending_since["3_0"] -= w.report_after_s + 1
    w.read_info("3_0|PENDING|Resources\n")
    assert "1 SLURM job(s) pending for 61 s, reason: Resources" in capsys.readouterr().err


def test_the_message_lists_unfinished_cells_with_their_state_and_log(tmp_path: Path) -> None:
    w = watcher("4", "4_0", "4_1", "4_2")
    w._info_dict.update(w.read_info("4_1|CANCELLED|None\n"))
    folder = tmp_path / "%j"
    (tmp_path / "4_0").mkdir()
    (tmp_path / "4_0" / "4_0_0_result.pkl").write_bytes(pickle.dumps(("success", None)))
    (tmp_path / "4_2").mkdir()
    (tmp_path / "4_2" / "4_2_0_result.pkl").write_bytes(pickle.dumps(("error", "Traceback ...")))
    msg = _ended_badly(w, str(folder), [["seed=0"], ["seed=1"], ["seed=2"]])
    assert "2 of 3 SLURM jobs of this sweep did not finish" in msg
    assert "job 4_1 [seed=1]: CANCELLED" in msg and f"log {tmp_path}/4_1/4_1_0_log.err" in msg
    assert "job 4_2 [seed=2]: failed" in msg and "4_0" not in msg
    assert "rerun the same command" in msg
