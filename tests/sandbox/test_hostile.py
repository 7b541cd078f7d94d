"""A program may not buy a pass from the judge, nor leave anything for the next program (issue #40).

Each class of attack (tests/sandbox/hostile_run.py: forged timing, forged result frames,
capabilities, mount changes, ptrace/pidfd_getfd of the worker, SysV IPC left behind, /tmp
filled, kernel keyrings, secrets) is judged by a real one-worker pool, as root (the sandbox's
root mode) and as a non-root user (its user-namespace mode, the one on clusters), each followed
on the same worker by a correct program that must pass. Afterwards nothing of the pool may be
left: no process, no key of its uids, no file in the host's /tmp, no secret in any output.

CI runs as root: the test creates the user (`useradd --system`) and runs the pool as it with
`runuser`, in a private mount namespace where the directories on the way to the interpreter
that other users may not enter (root's home) are replaced by a tmpfs holding just that way.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from conftest import APPS_DATA_DIR, REPO

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/proc/self/ns/user").exists() or not shutil.which("runuser"),
    reason="runs the judge as root and as a user it creates: needs root, runuser and user namespaces (CI runs as root)",
)

RUNNER = Path(__file__).resolve().parent / "hostile_run.py"
USER = "apps-bench-judge"
SECRETS = {"OPENAI_API_KEY": "sk-hostile-env-canary-41d7", "HF_TOKEN": "hf_hostile_env_canary_41d7"}
KEY_TEXT = "sk-hostile-vllm-key-canary-41d7"
DATA_FILE = APPS_DATA_DIR / "train_mini150.jsonl"
MARK = "apps-bench-hostile-mark-5c1e"
TIMING = ("forged_timing", "forged_result_frame")
ENVIRONMENT = (
    "capabilities",
    "mount_changes",
    "ptrace_pidfd_getfd_worker",
    "sysv_ipc_left_behind",
    "tmp_filled",
    "keyrings",
    "secrets",
    "deep_tree",
)


def _user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(USER)
    except KeyError:  # (another session may be adding it at the same moment: the look-up after decides)
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", USER], capture_output=True)
        return pwd.getpwnam(USER)


@pytest.fixture(scope="module")
def judge_user() -> pwd.struct_passwd:
    """The non-root user; module-scoped, so under xdist this module's tests share one worker, one after
    another (a test looks for processes of this user left behind, which another test's pool would be)."""
    return _user()


def _closed_dirs(path: str) -> list[tuple[str, str]]:
    """(directory others may not enter, its child on the way to `path`) along `path`."""
    out = []
    parts = Path(os.path.realpath(path)).parts
    for k in range(1, len(parts) - 1):
        d = os.path.join(*parts[: k + 1])
        if not os.stat(d).st_mode & 0o001:
            out.append((d, parts[k + 1]))
    return out


def _as_user_script(stash: Path) -> str:
    """Shell lines that open the way to the interpreter and the repository for the user, in this mount namespace."""
    lines = ["set -e"]
    seen = set()
    for prefix in (sys.base_prefix, sys.prefix, sys.executable, str(REPO)):
        for d, child in _closed_dirs(prefix):
            if (d, child) in seen:
                continue
            seen.add((d, child))
            s = stash / f"{len(seen)}"
            s.mkdir()
            lines += [
                f"mount --bind '{d}/{child}' '{s}'",
                f"mount -t tmpfs -o mode=755,size=64k tmpfs '{d}'",
                f"mkdir -p '{d}/{child}'",
                f"mount --bind '{s}' '{d}/{child}'",
            ]
    return "\n".join(lines) + '\nexec runuser -u "$0" -- "$@"\n'


@pytest.fixture
def base(tmp_path: Path):
    """A directory the user can reach (pytest's own temp root is private to root); removed after."""
    d = Path(tempfile.mkdtemp(prefix="apps-bench-hostile-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _run(tmp_path: Path, base: Path, profile: str, as_user: bool, only: tuple[str, ...]) -> tuple[dict, str]:
    home = base / "home"
    (home / ".config" / "apps-bench").mkdir(parents=True)
    key = home / ".config" / "apps-bench" / "vllm-api-key"
    key.write_text(KEY_TEXT + "\n")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "PYTHONPATH": str(REPO), **SECRETS}
    cmd = [sys.executable, str(RUNNER), profile, str(DATA_FILE), str(key), ",".join(only)]
    if as_user:
        user = _user()
        for p in (home, home / ".config", home / ".config" / "apps-bench", key):
            os.chown(p, user.pw_uid, user.pw_gid)
        stash = tmp_path / "stash"
        stash.mkdir()
        cmd = [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            _as_user_script(stash),
            USER,
            "env",
            *(f"{k}={v}" for k, v in env.items()),
            *cmd,
        ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=base, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout), proc.stderr


def _all_text(out: dict) -> str:
    return json.dumps(out["attacks"])


def _check_common(out: dict, stderr: str, as_user: bool) -> None:
    assert out["uid"] == (_user().pw_uid if as_user else 0)
    assert out["features"]["contained"] is True
    assert out["features"]["user_namespace"] is as_user
    assert out["features"]["capabilities"] == "none" and out["features"]["seccomp"] is True
    assert out["left"] == [], "processes of the pool left after it closed"
    text = _all_text(out) + stderr
    for secret in (*SECRETS.values(), KEY_TEXT):
        assert secret not in text, secret
    assert MARK not in stderr, "a program wrote into the judge's stderr"
    for name, got in out["attacks"].items():  # the program after each attack passes, on the same worker
        (after,) = got["run_after"]
        assert after["status"] == "ok" and after["stdout"].startswith("42"), (name, after)
        for k in ("exec_after", "exec_after2"):
            assert got[k]["stdout"].startswith("42") and not got[k]["timed_out"], (name, k, got[k])
    if as_user:
        ps = subprocess.run(["pgrep", "-u", USER], capture_output=True, text=True)
        assert ps.stdout == "", "processes of the user left"
    else:
        lo, hi = out["program_uids"]
        with open("/proc/key-users") as f:
            users = [int(line.split(":")[0]) for line in f]
        assert not [u for u in users if lo <= u <= hi], "kernel keys of the programs' uids left"
    assert not list(Path("/tmp").glob("fill*"))


MODES = [pytest.param(False, id="root"), pytest.param(True, id="user")]


@pytest.mark.parametrize("as_user", MODES)
@pytest.mark.parametrize("profile", ["seed", "reference"])
def test_forged_timing_is_a_timeout(judge_user, tmp_path: Path, base: Path, profile: str, as_user: bool) -> None:
    """A program running 0.1 s past the limit per test, that rebinds the harness's timer or writes the
    result frame itself claiming 0.01 s, is a timeout: the time is the worker's."""
    out, stderr = _run(tmp_path, base, profile, as_user, TIMING)
    for name in TIMING:
        runs = out["attacks"][name]["runs"]
        assert [r["status"] for r in runs] == ["timeout"] * len(runs), (name, runs)
        assert all(r["seconds"] > 0.5 for r in runs), runs
        assert out["attacks"][name]["exec_attack"]["timed_out"], name
    _check_common(out, stderr, as_user)


@pytest.mark.parametrize("as_user", MODES)
def test_program_leaves_nothing_and_gains_no_privilege(judge_user, tmp_path: Path, base: Path, as_user: bool) -> None:
    """Capabilities, mounts, the worker's process, SysV IPC, /tmp, keyrings, secrets: each attack fails
    and the correct program after it, on the same worker, passes."""
    out, stderr = _run(tmp_path, base, "seed", as_user, ENVIRONMENT)
    a = out["attacks"]
    rows = DATA_FILE.read_text()[:60]
    for name in ENVIRONMENT:
        for got in (a[name]["runs"][0], a[name]["exec_attack"]):
            text = got["stdout"]
            assert "BREACH" not in text, (name, text)  # the attacks print it for each step that worked
            assert rows not in text
    # no capability in any set, no_new_privs, the seccomp filter
    status = dict(line.split(":\t") for line in a["capabilities"]["runs"][0]["stdout"].splitlines())
    assert status == {
        "CapInh": "0" * 16,
        "CapPrm": "0" * 16,
        "CapEff": "0" * 16,
        "CapBnd": "0" * 16,
        "CapAmb": "0" * 16,
        "NoNewPrivs": "1",
        "Seccomp": "2",
    }, status
    # the next program sees no IPC object, a clean $TMPDIR with room, no key
    assert a["sysv_ipc_left_behind"]["runs"][0]["stdout"] == "SHM\nMSG\nSEM\n"  # the attack did make them
    assert a["sysv_ipc_left_behind"]["run_after"][0]["stdout"] == "42 0 b''\n"
    assert a["sysv_ipc_left_behind"]["exec_after"]["stdout"] == "42 0 b''\n"
    assert int(a["tmp_filled"]["runs"][0]["stdout"].split()[1]) >= 256  # it did fill its $TMPDIR
    assert a["tmp_filled"]["run_after"][0]["stdout"] == "42 []\n"
    assert a["tmp_filled"]["exec_after2"]["stdout"] == "42 []\n"
    assert a["keyrings"]["run_after"][0]["stdout"] == "42 False\n"
    # a tree deeper than the recursion limit: the program's own verdict, nothing added, a clean run dir after
    assert [(r["status"], r["stdout"]) for r in a["deep_tree"]["runs"]] == [("ok", "2\n")]
    assert a["deep_tree"]["run_after"][0]["stdout"] == "42 []\n"
    _check_common(out, stderr, as_user)


def test_a_damaged_worker_is_replaced_and_the_damage_scores_against_no_one(judge_user) -> None:
    """A program that changed its worker's mounts (done here from outside with nsenter, as one that got past
    the seccomp filter would: /tmp unmounted while it runs) keeps its own verdict for what it ran, and its
    remaining test fails (its doing: no fresh child on that worker); the worker is replaced before it
    judges again, so the next program passes. (Before, the worker
    died in its sweep and the pool added a sandbox_error to the finished job.)"""
    from apps_bench.judge.profiles import judge_config
    from apps_bench.sandbox import RunRequest, SandboxPool

    # it ends its process after test 0, so test 1 would need a fresh child: not on a damaged worker
    slow = (
        "import os, sys, time\nopen('started', 'w').close()\ntime.sleep(3)\nprint(int(input()) * 2)\n"
        "sys.stdout.flush()\nos._exit(0)\n"
    )
    with SandboxPool.from_config(judge_config("seed"), workers=1) as pool:
        pool.python_exec("pass", timeout_s=5, output_chars=100)  # started and ready
        mine = os.readlink("/proc/self/ns/pid")
        (worker,) = [p for p in pool.worker_pids() if os.readlink(f"/proc/{p}/ns/pid") != mine]  # not its launcher
        done: list = []
        t = threading.Thread(target=lambda: done.append(pool.run(RunRequest(slow, "stdin", ["1", "2"], timeout_s=10))))
        t.start()
        children = Path(f"/proc/{worker}/task/{worker}/children")
        while not any(Path(f"/proc/{c}/cwd/started").exists() for c in children.read_text().split()):
            assert t.is_alive()  # until the program runs (its file is in its run dir)
            time.sleep(0.01)
        subprocess.run(["nsenter", "-t", str(worker), "-m", "-p", "umount", "-l", "/tmp"], check=True)
        t.join()
        assert [(r.status, r.stdout) for r in done[0]] == [("ok", "2\n"), ("runtime_error", "")], done[0]
        assert done[0][1].detail.startswith("the program damaged its sandbox"), done[0][1]
        (after,) = pool.run(RunRequest("import os\nprint(int(input()) * 2, os.listdir('.'))", "stdin", ["21"], timeout_s=5))
        assert (after.status, after.stdout) == ("ok", "42 []\n"), after
        assert worker not in pool.worker_pids()
