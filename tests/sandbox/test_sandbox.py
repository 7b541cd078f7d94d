"""The sandbox's contract: semantics of stdin and call mode, the protocol, the tool."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import sys
import threading
from pathlib import Path

import pytest

from apps_bench.judge.profiles import judge_config
from apps_bench.sandbox import RawRun, RunRequest, SandboxPool, decode_value
from apps_bench.sandbox.harness import NotPlainData, to_plain
from apps_bench.sandbox.tool import PythonExecTool
from apps_bench.types import Usage


def stdin_run(pool, code, inputs, **kw):
    return pool.run(RunRequest(code=code, mode="stdin", inputs=inputs, **kw))


def call_run(pool, code, fn, inputs, **kw):
    return pool.run(RunRequest(code=code, mode="call", inputs=inputs, fn_name=fn, **kw))


# -- stdin mode ---------------------------------------------------------------------
def test_stdin_runs_each_test_in_order(pool):
    rs = stdin_run(pool, "a, b = map(int, input().split())\nprint(a + b)\n", ["1 2", "3 4", "10 -3"])
    assert [r.index for r in rs] == [0, 1, 2]
    assert [r.status for r in rs] == ["ok"] * 3
    assert [r.stdout for r in rs] == ["3\n", "7\n", "7\n"]
    assert all(r.exit_code == 0 and r.value_json is None for r in rs)


@pytest.mark.parametrize(
    "code",
    [
        "print(input())",
        "import sys\nprint(sys.stdin.readline().strip())",
        "import sys\nprint(sys.stdin.buffer.read().decode().strip())",
        "print(open(0).read().strip())",
        "print(open('/dev/stdin').read().strip())",
        "import sys\nsys.stdin = open('/dev/stdin')\nprint(input())",
        "import os\nprint(os.read(0, 100).decode().strip())",
    ],
)
def test_every_way_of_reading_stdin(pool, code):
    rs = stdin_run(pool, code, ["abc\n", "de\n"])
    assert [(r.status, r.stdout) for r in rs] == [("ok", "abc\n"), ("ok", "de\n")]


def test_stdin_list_input_joined_with_newlines(pool):
    (r,) = stdin_run(pool, "import sys\nprint(sys.stdin.read().split())", [["1 2", "3"]])
    assert r.stdout == "['1', '2', '3']\n"


def test_runs_as_main_with_prelude(pool):
    code = (
        "if __name__ == '__main__':\n"
        "    h = []\n    heappush(h, 3); heappush(h, 1)\n"
        "    x: List[int] = [1]\n"
        "    print(heappop(h), Counter('aab')['a'], int(np.int64(4)), gcd(6, 4), sqrt(16), deque([1]).pop(),"
        " List is not None, Tuple is not None, lru_cache is not None, log2(8), sys.maxsize > 0)\n"
    )
    (r,) = stdin_run(pool, code, [""])
    assert r.status == "ok", r
    assert r.stdout == "1 2 4 2 4.0 1 True True True 3.0 True\n"


@pytest.mark.parametrize(
    "code,status,exit_code",
    [
        ("print(1)\nimport sys\nsys.exit()", "ok", 0),
        ("print(1)\nexit(0)", "ok", 0),
        ("print(1)\nimport sys\nsys.exit(None)", "ok", 0),
        ("print(1)\nquit()", "ok", 0),
        ("print(1)\nraise SystemExit", "ok", 0),
        ("print(1)\nimport sys\nsys.exit(1)", "runtime_error", 1),
        ("print(1)\nimport sys\nsys.exit('bad')", "runtime_error", 1),
        ("print(1)\n1/0", "runtime_error", 1),
        ("print(1)\nimport os, sys\nsys.stdout.flush()\nos._exit(0)", "ok", 0),
        ("print(1)\nimport os, sys\nsys.stdout.flush()\nos._exit(7)", "runtime_error", 7),
    ],
)
def test_stdin_exit_semantics(pool, code, status, exit_code):
    (r,) = stdin_run(pool, code, [""])
    assert (r.status, r.exit_code) == (status, exit_code), r
    assert r.stdout == "1\n"


def test_runtime_error_reports_traceback_tail(pool):
    (r,) = stdin_run(pool, "x = 1\ny = x / 0\n", [""])
    assert r.status == "runtime_error"
    assert "ZeroDivisionError" in r.detail
    assert 'File "solution.py", line 2' in r.stderr


def test_fd_level_stdout_is_captured(pool):
    (r,) = stdin_run(pool, "import os\nprint('a', flush=True)\nos.write(1, b'b\\n')\nprint('c')", [""])
    assert r.stdout == "a\nb\nc\n"


def test_non_daemon_threads_are_joined_like_a_script(pool):
    code = "import threading, time\ndef f():\n    time.sleep(0.05)\n    print(int(input()) * 2)\nthreading.Thread(target=f).start()\n"
    (r,) = stdin_run(pool, code, ["21"])
    assert (r.status, r.stdout) == ("ok", "42\n")


def test_fresh_namespace_and_stdin_per_test(pool):
    code = "try:\n    seen\nexcept NameError:\n    seen = 0\nseen += 1\nprint(seen, input())\n"
    rs = stdin_run(pool, code, ["a", "b", "c"])
    assert [r.stdout for r in rs] == ["1 a\n", "1 b\n", "1 c\n"]


def test_big_integer_digits_limit_lifted(pool):
    (r,) = stdin_run(pool, "n = int(input())\nprint(n * 10)", ["7" * 5000])
    assert r.status == "ok" and r.stdout.strip() == "7" * 5000 + "0"


def test_compile_error_fails_every_test(pool):
    rs = stdin_run(pool, "def f(:\n  pass", ["1", "2", "3"])
    assert [r.status for r in rs] == ["compile_error"] * 3
    assert "SyntaxError" in rs[0].detail


def test_keep_going_stops_early(pool):
    seen: list[RawRun] = []

    def keep_going(raw: RawRun) -> bool:
        seen.append(raw)
        return raw.stdout.strip() != "2"

    rs = pool.run(RunRequest("print(input())", "stdin", ["1", "2", "3", "4"]), keep_going)
    assert [r.stdout for r in rs] == ["1\n", "2\n"]
    assert seen == rs
    rs = pool.run(RunRequest("def f(:", "stdin", ["1", "2", "3"]), lambda raw: False)
    assert [r.status for r in rs] == ["compile_error"]


def test_keep_going_exception_propagates_and_pool_survives(pool):
    def boom(raw: RawRun) -> bool:
        raise KeyError("judge bug")

    with pytest.raises(KeyError):
        pool.run(RunRequest("print(input())", "stdin", ["1", "2"]), boom)
    assert stdin_run(pool, "print(input())", ["ok"])[0].stdout == "ok\n"


def test_timeout_then_remaining_tests_continue_in_fresh_child(pool):
    code = "import os\ns = input()\nif s == 'hang':\n    while True: pass\nif s == 'crash':\n    os._exit(9)\nprint(s)\n"
    rs = stdin_run(pool, code, ["a", "hang", "b", "crash", "c"], timeout_s=0.5)
    assert [r.status for r in rs] == ["ok", "timeout", "ok", "runtime_error", "ok"]
    assert [r.stdout for r in rs if r.status == "ok"] == ["a\n", "b\n", "c\n"]
    assert rs[3].exit_code == 9


def test_slow_but_finishing_test_over_limit_is_timeout(pool):
    (r,) = stdin_run(pool, "import time\ntime.sleep(0.6)\nprint(1)", [""], timeout_s=0.5)
    assert r.status == "timeout"


def test_memory_cap_gives_memory_limit(pool):
    (r,) = stdin_run(pool, "x = bytearray(3 * 1024**3)\nprint(len(x))", [""], memory_bytes=1 << 30)
    assert r.status == "memory_limit", r


def test_output_cap(pool):
    (r,) = stdin_run(pool, "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", [""])
    assert r.status == "output_limit"
    assert len(r.stdout) <= pool.limits.output_cap_bytes


def test_test_data_never_on_a_command_line(pool):
    marker = "MARKER_" + "9" * 12
    (r,) = stdin_run(pool, "print(repr(open('/proc/self/cmdline','rb').read()))\ninput()", [marker])
    assert r.status == "ok" and marker not in r.stdout


def test_environment_is_cleared(pool, monkeypatch):
    (r,) = stdin_run(pool, "import os, json\nprint(json.dumps(dict(os.environ)))", [""])
    env = json.loads(r.stdout)
    assert set(env) <= {
        "PATH",
        "LANG",
        "LC_ALL",
        "HOME",
        "TMPDIR",
        "OPENBLAS_NUM_THREADS",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "PYTHONDONTWRITEBYTECODE",
    }
    assert not any(k.startswith(("MLFLOW", "OPENAI", "HF_")) for k in env)


def test_numpy_single_threaded_in_children(pool):
    (r,) = stdin_run(pool, "import os\nprint(os.environ['OPENBLAS_NUM_THREADS'], np.ones(3).sum())", [""])
    assert r.stdout == "1 3.0\n"


def test_unpreloaded_stdlib_modules_importable(pool):
    (r,) = stdin_run(pool, "import fnmatch, graphlib, zoneinfo, apps_bench_no_such_module\n", [""])
    # a module that is not installed: a clean ImportError, not a crash of the harness (not
    # `sortedcontainers`, which APPS programs like: selenium's trio installs it with the dev extra)
    assert r.status == "runtime_error" and "apps_bench_no_such_module" in r.detail
    (r,) = stdin_run(pool, "import fnmatch, graphlib, multiprocessing\nprint('ok')", [""])
    assert (r.status, r.stdout) == ("ok", "ok\n"), r


# -- call mode ---------------------------------------------------------------------
def test_call_mode_solution_class_and_plain_json(pool):
    code = "class Solution:\n    def f(self, a, b):\n        return (a + b, [a, (b,)], None, True, 1.5, {'k': a})\n"
    rs = call_run(pool, code, "f", [[1, 2], [3, 4]])
    assert [r.status for r in rs] == ["ok", "ok"]
    assert decode_value(rs[0].value_json) == [3, [1, [2]], None, True, 1.5, {"k": 1}]
    assert rs[1].value_json == '[7,[3,[4]],null,true,1.5,{"k":3}]'


def test_call_mode_top_level_function(pool):
    (r,) = call_run(pool, "def add(a, b):\n    return a + b\n", "add", [[2, 3]])
    assert (r.status, r.value_json) == ("ok", "5")


def test_call_mode_missing_function(pool):
    (r,) = call_run(pool, "def other():\n    return 1\n", "add", [[2, 3]])
    assert r.status == "runtime_error" and "add" in r.detail


def test_call_mode_nan_inf_bigint_numpy(pool):
    code = "def f():\n    return [float('nan'), float('inf'), 10**5000, np.int64(3), np.float64(0.5), np.array([1, 2]), np.bool_(True)]\n"
    (r,) = call_run(pool, code, "f", [[]])
    assert r.status == "ok", r
    v = decode_value(r.value_json)
    assert math.isnan(v[0]) and v[1] == math.inf and v[2] == 10**5000
    assert v[3:] == [3, 0.5, [1, 2], True] and type(v[3]) is int and type(v[6]) is bool


@pytest.mark.parametrize(
    "ret",
    ["{1, 2}", "object()", "(x for x in [1])", "Big(5)", "S('a')", "[1, L([2])]", "{(1, 2): 3}"],
)
def test_call_mode_non_plain_return_is_runtime_error(pool, ret):
    code = (
        "class Big(int):\n    def __eq__(self, o): return True\n"
        "class S(str):\n    def __eq__(self, o): return True\n"
        "class L(list):\n    def __eq__(self, o): return True\n"
        f"def f():\n    return {ret}\n"
    )
    (r,) = call_run(pool, code, "f", [[]])
    assert r.status == "runtime_error" and r.value_json is None, r


def test_call_mode_reliability_guard(pool):
    code = "import os, shutil, subprocess\ndef f():\n    return [os.system is None, os.kill is None, shutil.rmtree is None, subprocess.Popen is None]\n"
    (r,) = call_run(pool, code, "f", [[]])
    assert decode_value(r.value_json) == [True, True, True, True]


def test_to_plain_exact_types():
    assert to_plain((1, [True, None], {"a": 2.0})) == [1, [True, None], {"a": 2.0}]

    class I(int):
        pass

    for bad in (I(1), {1}, b"x", [object()], bytearray(b"x")):
        with pytest.raises(NotPlainData):
            to_plain(bad)
    deep: list = []
    cur = deep
    for _ in range(1000):
        cur.append([])
        cur = cur[0]
    with pytest.raises(NotPlainData):
        to_plain(deep)


# -- pool ----------------------------------------------------------------------------
def test_concurrent_runs_from_threads(pool):
    results: dict[int, list[RawRun]] = {}

    def work(k: int) -> None:
        results[k] = stdin_run(pool, f"print(int(input()) + {k})", [str(i) for i in range(5)])

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k in range(8):
        assert [r.stdout for r in results[k]] == [f"{i + k}\n" for i in range(5)]


def test_killed_worker_is_replaced(pool):
    victim = pool._all[0]
    old = victim.proc.pid
    os.kill(old, 9)
    victim.proc.wait()
    for _ in range(4):
        assert stdin_run(pool, "print(input())", ["alive"])[0].stdout == "alive\n"
    assert victim.proc.pid != old


def test_request_validation():
    with pytest.raises(ValueError, match="fn_name"):
        RunRequest("x", "call", [[1]])
    with pytest.raises(ValueError, match="mode"):
        RunRequest("x", "shell", [""])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        RunRequest("x", "stdin", [""], timeout_s=0)


def test_empty_inputs_run_nothing(pool):
    assert pool.run(RunRequest("print(1)", "stdin", [])) == []


def test_features_report_containment(pool):
    f = pool.features
    if os.geteuid() == 0:
        assert f["contained"] and f["uid_switch"]


# -- python_exec and the tool ----------------------------------------------------------
def test_python_exec_basic_and_clipping(pool):
    r = pool.python_exec(
        "import sys\nprint(input()[::-1])\nprint('e' * 50, file=sys.stderr)\nsys.exit(3)",
        stdin="abc",
        timeout_s=5,
        output_chars=20,
    )
    assert r.stdout == "cba\n" and r.exit_code == 3 and not r.timed_out
    assert len(r.stderr) <= 20
    r = pool.python_exec("print('x' * 100)", timeout_s=5, output_chars=10)
    assert r.stdout.startswith("x" * 10) and "clipped" in r.stdout and r.exit_code == 0


def test_python_exec_fresh_state_and_timeout(pool):
    r1 = pool.python_exec("import builtins\nbuiltins.MARK = 1\nprint('set')", timeout_s=5, output_chars=100)
    r2 = pool.python_exec("import builtins\nprint(hasattr(builtins, 'MARK'))", timeout_s=5, output_chars=100)
    assert (r1.stdout, r2.stdout) == ("set\n", "False\n")
    r = pool.python_exec("while True: pass", timeout_s=0.5, output_chars=100)
    assert r.timed_out and r.exit_code is None and r.status == "timeout"


def test_tool_counts_calls_and_formats(pool):
    usage = Usage()
    tool = PythonExecTool(pool, timeout_s=0.5, output_chars=200, usage=usage)
    assert tool.name == "python_exec"
    assert set(tool.parameters["properties"]) == {"code", "stdin"}  # no timeout the model could raise
    text = tool("print(int(input()) * 2)", stdin="21")
    assert "exit code: 0" in text and "42" in text
    text = tool("import time\ntime.sleep(5)")
    assert "timed out" in text and "0.5s" in text
    with pytest.raises(TypeError):
        tool("print(1)", timeout_s=100)  # type: ignore[call-arg]
    text = asyncio.run(tool.acall("raise ValueError('nope')"))
    assert "exit code: 1" in text and "ValueError: nope" in text
    assert usage.tool_calls == 3 and tool.calls == 3
    assert tool.openai_schema()["function"]["name"] == "python_exec"


# -- the weak fallback ---------------------------------------------------------------------
def test_fallback_mode_works_and_warns(caplog, tmp_path):
    import apps_bench.sandbox.pool as pool_mod

    pool_mod._WEAK_WARNED = False
    with caplog.at_level(logging.WARNING, logger="apps_bench.sandbox.pool"):
        with SandboxPool.from_config(judge_config("seed"), workers=1, contain=False) as weak:
            assert any("CONTAINMENT IS WEAK" in r.message for r in caplog.records)
            assert weak.features["contained"] is False
            rs = stdin_run(weak, "print(int(input()) * 2)", ["21", "2"])
            assert [r.stdout for r in rs] == ["42\n", "4\n"]
            (r,) = stdin_run(weak, "import fnmatch, graphlib\nprint('imported')", [""])
            assert r.stdout == "imported\n", r  # modules the worker did not pre-import load too
            code = (
                "import os, time\n"
                "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(1000)\n    os._exit(0)\n"
                "print('parent done')\n"
            )
            (r,) = stdin_run(weak, code, [""])
            assert r.stdout == "parent done\n"
            (r,) = stdin_run(weak, "while True: pass", [""], timeout_s=0.5)
            assert r.status == "timeout"
            worker = weak._all[0].proc.pid
            from apps_bench.sandbox.contain import _descendants

            assert _descendants(worker) == []  # the daemonised grandchild was swept too


# -- pipelining: the child runs ahead, the judge's stop still wins ---------------------------
@pytest.mark.timeout(60)
def test_stop_kills_a_child_that_ran_ahead_into_a_slow_test(pool):
    code = "s = input()\nif s == 'slow':\n    import time\n    time.sleep(1000)\nprint(s)\n"
    rs = pool.run(RunRequest(code, "stdin", ["a", "slow", "b"], timeout_s=1000), lambda raw: False)
    assert [(r.status, r.stdout) for r in rs] == [("ok", "a\n")]


def test_replies_in_flight_after_stop_do_not_leak_into_the_next_job():
    with SandboxPool.from_config(judge_config("seed"), workers=1) as one:
        for _ in range(3):
            rs = one.run(RunRequest("print(input())", "stdin", [str(i) for i in range(200)]), lambda raw: raw.index < 2)
            assert [r.stdout for r in rs] == ["0\n", "1\n", "2\n"]
            rs = one.run(RunRequest("print(int(input()) + 1)", "stdin", ["1", "2"]))
            assert [r.stdout for r in rs] == ["2\n", "3\n"]


@pytest.mark.timeout(60)
def test_close_while_a_run_is_in_flight_leaves_nothing_running():
    import time

    p = SandboxPool.from_config(judge_config("seed"), workers=1)
    _ = p.features  # waits until the worker is up
    mine = p.worker_pids()
    out: list = []
    t = threading.Thread(target=lambda: out.append(p.run(RunRequest("while True: pass", "stdin", ["", ""], timeout_s=30))))
    t.start()
    # closed once the run holds the pool's one worker and its program runs (a process under the worker), not
    # after a fixed sleep: on a busy machine the run may not even have started by then
    from apps_bench.sandbox.contain import _descendants

    deadline = time.monotonic() + 50  # bounds a hang only
    while (p._free.qsize() or not _descendants(mine[0])) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not p._free.qsize() and _descendants(mine[0]), "the run never started"
    p.close()
    t.join()
    assert out and out[0][-1].status == "sandbox_error"
    assert not [pid for pid in mine if os.path.exists(f"/proc/{pid}")]
    with pytest.raises(RuntimeError, match="closed"):
        p.run(RunRequest("print(1)", "stdin", [""]))


@pytest.mark.skipif(os.geteuid() != 0, reason="the contained sandbox needs root")
def test_interpreter_in_a_virtualenv_under_tmp_stays_usable(tmp_path):
    """A fresh virtualenv under /tmp (as CI makes) is re-exposed read-only inside the
    worker's private /tmp, while the rest of the host's /tmp stays hidden."""
    import subprocess
    import sys
    import sysconfig

    venv = tmp_path / "venv"
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(venv)], check=True)
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    repo = Path(__file__).resolve().parents[2]
    (site / "deps.pth").write_text(f"{sysconfig.get_paths()['purelib']}\n{repo}\n")
    (tmp_path / "host-secret.txt").write_text("x")
    probe = (
        "import sys, os, fnmatch\n"
        "print(sys.prefix == %r, os.path.isdir(sys.prefix), os.path.exists(%r))\n"
        "open(os.path.join(sys.prefix, 'pwned'), 'w')\n"
    ) % (str(venv), str(tmp_path / "host-secret.txt"))
    script = (
        "from apps_bench.sandbox import SandboxPool, RunRequest\n"
        "from apps_bench.judge.profiles import judge_config\n"
        "with SandboxPool.from_config(judge_config('seed'), workers=1, contain=True) as p:\n"
        f"    (r,) = p.run(RunRequest({probe!r}, 'stdin', ['']))\n"
        "    print(r.stdout.strip(), '|', r.detail)\n"
    )
    out = subprocess.run([str(venv / "bin" / "python"), "-c", script], capture_output=True, text=True, timeout=120, cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True True False | OSError: [Errno 30] Read-only file system: '%s'" % (venv / "pwned")
    assert not (venv / "pwned").exists()


@pytest.mark.skipif(os.geteuid() != 0 or not __import__("shutil").which("unshare"), reason="needs root and unshare")
def test_inside_a_root_only_user_namespace_runs_still_work():
    """There the workers' uids do not exist: the pool must notice, not fail every test."""
    import subprocess
    import sys

    script = (
        "from apps_bench.sandbox import SandboxPool, RunRequest\n"
        "from apps_bench.judge.profiles import judge_config\n"
        "with SandboxPool.from_config(judge_config('seed'), workers=1) as p:\n"
        "    f = p.features\n"
        "    (r,) = p.run(RunRequest('print(int(input()) * 2)', 'stdin', ['21']))\n"
        "    print(r.status, r.stdout.strip(), f['uid_switch'], 'uid_switch_skipped' in f)\n"
    )
    out = subprocess.run(
        ["unshare", "--user", "--map-root-user", sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )
    if out.returncode != 0 and "unshare failed" in out.stderr:
        pytest.skip(f"user namespaces unavailable: {out.stderr.strip()}")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ok", "42", "False", "True"]


@pytest.mark.skipif(os.geteuid() != 0 or not __import__("shutil").which("unshare"), reason="needs root and unshare")
def test_a_non_root_user_gets_namespaces_through_a_user_namespace():
    """Seen as uid 1000 (a user namespace mapping us there), the pool still builds its
    namespaces (via its own user namespace): the host's files stay hidden, runs work."""
    import subprocess
    import sys

    probe = "import os\nprint(int(input()) * 2, os.path.exists(%r))" % str(Path(__file__).resolve())
    script = (
        "import os\n"
        "from apps_bench.sandbox import SandboxPool, RunRequest\n"
        "from apps_bench.judge.profiles import judge_config\n"
        "with SandboxPool.from_config(judge_config('seed'), workers=1) as p:\n"
        "    f = p.features\n"
        f"    (r,) = p.run(RunRequest({probe!r}, 'stdin', ['21']))\n"
        "    print(os.geteuid(), r.status, r.stdout.strip(), f['contained'], f['uid_switch'])\n"
    )
    out = subprocess.run(
        ["unshare", "--user", "--map-user=1000", "--map-group=1000", sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )
    if out.returncode != 0 and "unshare failed" in out.stderr:
        pytest.skip(f"user namespaces unavailable: {out.stderr.strip()}")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1000", "ok", "42", "False", "True", "False"], out.stdout + out.stderr


def test_programs_run_at_the_harness_priority_whatever_the_privilege(pool):
    """Programs are timed by the wall clock: their priority is the process's that started the
    pool, never raised (not even as root), so a verdict near the limit does not depend on privilege."""
    import apps_bench.sandbox.worker as worker

    assert not hasattr(worker, "PRIORITY_BOOST")
    assert pool.features["nice"] == os.nice(0) and "priority_boost" not in pool.features
    r = pool.python_exec("import os\nprint(os.nice(0))", timeout_s=5, output_chars=100)
    assert r.status == "ok", r
    assert int(r.stdout) == os.nice(0)


def test_the_worker_empties_its_bounding_set_once_for_every_child():
    """Each program's child inherits an empty capability bounding set from its worker (emptied at
    start-up, not again per program), so what the worker holds is what every program gets."""
    with SandboxPool.from_config(judge_config("seed"), workers=1) as one:
        (r,) = one.run(RunRequest("print(open('/proc/self/status').read())", "stdin", [""]))  # its worker is up
        assert one.features["capabilities"] == "none"
        python = os.path.realpath(sys.executable)
        (worker,) = [p for p in one.worker_pids() if os.path.realpath(f"/proc/{p}/exe") == python]
        status = dict(line.split(":\t", 1) for line in Path(f"/proc/{worker}/status").read_text().splitlines())
    assert int(status["CapBnd"], 16) == 0, status["CapBnd"]
    assert int(status["CapEff"], 16) != 0  # it keeps what it works with: uid switches, sweeping
    child = dict(line.split(":\t", 1) for line in r.stdout.splitlines() if ":\t" in line)
    assert [int(child[k], 16) for k in ("CapBnd", "CapPrm", "CapEff", "CapInh", "CapAmb")] == [0] * 5
