"""Hostile and broken programs, one case per attack in docs/judge.md's list.

For every attack: the RawRun status is a failure of the right kind (or the defined
behaviour for harmless ones), the pool keeps working (a normal program right after
gets the right output, in a clean temp dir), no process of the attack is left (the
process table below this test process holds only the pool's workers, and no process
runs under the workers' uids), and no file outside the program's temp dir changed
(a canary is intact, nothing new appeared beside it or in the host's /tmp, and the
dataset and repository could not be read).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
from conftest import APPS_DATA_DIR

import apps_bench
from apps_bench.judge.profiles import judge_config
from apps_bench.sandbox import RawRun, RunRequest, SandboxPool, decode_value
from apps_bench.sandbox.contain import _descendants

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/proc/self/ns/pid").exists(),
    reason="the contained sandbox needs root and Linux namespaces (CI runs as root)",
)

SECRETS = {
    "OPENAI_API_KEY": "sk-adversarial-canary-7f3a",
    "MLFLOW_TRACKING_URI": "sqlite:////tmp/adversarial-canary-7f3a.db",
    "HF_TOKEN": "hf_adversarial_canary_7f3a",
    "GITHUB_TOKEN": "ghp_adversarial_canary_7f3a",
}
CANARY_TEXT = "canary intact 7f3a"
REPO_FILE = Path(apps_bench.__file__).resolve().parent / "types.py"
DATA_DIR = APPS_DATA_DIR
DATA_FILE = DATA_DIR / "train_mini150.jsonl"
HOST_TMP_MARK = Path("/tmp/apps-bench-adversarial-escape-7f3a")
FAIL = {"timeout", "runtime_error", "memory_limit", "output_limit"}


@dataclass
class Attack:
    name: str
    code: str
    expect: set[str]
    mode: str = "stdin"
    inputs: list = field(default_factory=lambda: [""])
    timeout_s: float = 1.0
    memory_bytes: int = 1 << 30
    check: Callable[[list[RawRun]], None] | None = None


def _stdout_is(text: str) -> Callable[[list[RawRun]], None]:
    def check(rs: list[RawRun]) -> None:
        assert rs[0].stdout == text

    return check


def _no_leak(*needles: str) -> Callable[[list[RawRun]], None]:
    def check(rs: list[RawRun]) -> None:
        for r in rs:
            for n in filter(None, needles):
                assert n not in r.stdout and n not in r.stderr and n not in (r.value_json or ""), n

    return check


def _secrets_absent(rs: list[RawRun]) -> None:
    _no_leak(*SECRETS.values())(rs)
    assert rs[0].stdout.strip(), "the probe printed nothing"


def _value_check(fn: Callable[[object], bool]) -> Callable[[list[RawRun]], None]:
    def check(rs: list[RawRun]) -> None:
        assert rs[0].value_json is not None and fn(decode_value(rs[0].value_json)), rs[0]

    return check


def _not_forged(rs: list[RawRun]) -> None:
    for r in rs:
        assert r.status != "ok" and r.value_json is None, r


CANARY = "{CANARY}"  # placeholders, filled per run
UNIX = "{UNIX}"

ATTACKS: list[Attack] = [
    # -- time -------------------------------------------------------------------------
    Attack("time/infinite_loop", "while True:\n    pass\n", {"timeout"}),
    Attack(
        "time/loop_catching_the_timeout",
        "while True:\n    try:\n        while True:\n            pass\n    except BaseException:\n        pass\n",
        {"timeout"},
    ),
    Attack(
        "time/signal_tampering",
        "import signal\nfor s in range(1, 65):\n    try:\n        signal.signal(s, signal.SIG_IGN)\n    except Exception:\n        pass\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, range(1, 65))\nwhile True:\n    pass\n",
        {"timeout"},
    ),
    Attack("time/uninterruptible_c_sum", "print(sum(range(10**11)))\n", {"timeout"}),
    Attack("time/huge_power", "x = 3 ** (10**9)\nprint(x % 7)\n", {"timeout", "memory_limit"}),
    Attack("time/sleeping", "import time\ntime.sleep(100)\n", {"timeout"}),
    # -- processes --------------------------------------------------------------------
    Attack(
        "processes/os_fork_bomb",
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
        {"timeout", "runtime_error"},
    ),
    Attack(
        "processes/multiprocessing_bomb",
        "import multiprocessing as mp\ndef spin():\n    while True:\n        pass\n"
        "ps = []\nwhile True:\n    p = mp.Process(target=spin)\n    p.start()\n    ps.append(p)\n",
        {"timeout", "runtime_error"},
    ),
    Attack(
        "processes/posix_spawn_bomb",
        "import os, sys\nwhile True:\n    try:\n        os.posix_spawn(sys.executable, [sys.executable, '-c', 'while True: pass'], {})\n"
        "    except OSError:\n        pass\n",
        {"timeout", "runtime_error"},
    ),
    Attack(
        "processes/subprocess_bomb",
        "import subprocess\nwhile True:\n    try:\n        subprocess.Popen(['sleep', '1000'])\n    except OSError:\n        pass\n",
        {"timeout", "runtime_error"},
    ),
    Attack(
        "processes/daemonised_grandchild",
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        while True:\n            time.sleep(0.01)\n"
        "    os._exit(0)\nprint('done')\n",
        {"ok"},
        check=_stdout_is("done\n"),
    ),
    Attack("processes/kill_the_parent", "import os\nos.kill(os.getppid(), 9)\nprint('killed it')\n", {"runtime_error"}),
    Attack("processes/kill_the_process_group", "import os\nos.killpg(os.getpgrp(), 9)\nprint('x')\n", {"runtime_error"}),
    Attack("processes/kill_everything", "import os\nos.kill(-1, 9)\nprint('x')\n", {"runtime_error"}),
    # -- exits ------------------------------------------------------------------------
    Attack("exits/os__exit", "import os\nprint('x')\nos._exit(3)\n", {"runtime_error"}),
    Attack("exits/sys_exit_nonzero", "import sys\nprint('x')\nsys.exit(2)\n", {"runtime_error"}),
    Attack("exits/sys_exit_in_call", "import sys\ndef f(x):\n    sys.exit(0)\n", {"runtime_error"}, mode="call", inputs=[[1]]),
    Attack("exits/exit_builtin_in_call", "def f(x):\n    exit()\n", {"runtime_error"}, mode="call", inputs=[[1]]),
    Attack(
        "exits/raise_SystemExit_in_call", "def f(x):\n    raise SystemExit(0)\n", {"runtime_error"}, mode="call", inputs=[[1]]
    ),
    Attack("exits/os__exit_in_call", "import os\ndef f(x):\n    os._exit(0)\n", {"runtime_error"}, mode="call", inputs=[[1]]),
    Attack(
        "exits/KeyboardInterrupt_in_call",
        "def f(x):\n    raise KeyboardInterrupt\n",
        {"runtime_error"},
        mode="call",
        inputs=[[1]],
    ),
    # -- memory -----------------------------------------------------------------------
    Attack("memory/bytearray_1e11", "x = bytearray(10**11)\nprint(len(x))\n", {"memory_limit"}),
    Attack("memory/list_1e10", "x = [0] * 10**10\nprint(len(x))\n", {"memory_limit"}),
    Attack(
        "memory/deep_recursion_segfault",
        # through a C function (map) each level eats C stack, so this segfaults
        "import sys\nsys.setrecursionlimit(10**8)\ndef f(n):\n    return list(map(f, [n + 1]))\nprint(f(0))\n",
        {"runtime_error", "memory_limit"},
    ),
    # -- output -----------------------------------------------------------------------
    Attack("output/gigabytes_print", "s = 'x' * 10**6\nwhile True:\n    print(s)\n", {"output_limit"}),
    Attack("output/gigabytes_os_write", "import os\nb = b'x' * 10**6\nwhile True:\n    os.write(1, b)\n", {"output_limit"}),
    Attack(
        "output/gigabytes_stderr",
        "import sys\ns = 'x' * 10**6\nwhile True:\n    sys.stderr.write(s)\n",
        {"output_limit", "runtime_error"},
    ),
    Attack(
        "output/invalid_utf8",
        "import sys\nsys.stdout.buffer.write(b'\\xff\\xfeok\\n')\n",
        {"ok"},
        check=lambda rs: rs[0].stdout.endswith("ok\n") and "\ufffd" in rs[0].stdout or pytest.fail(rs[0].stdout),
    ),
    Attack("output/stdout_close", "import sys\nprint(5)\nsys.stdout.close()\n", {"ok"}, check=_stdout_is("5\n")),
    Attack("output/os_close_1", "import os\nos.close(1)\nprint(5)\n", {"runtime_error"}),
    Attack(
        "output/write_garbage_to_every_fd",
        "import os\nfor fd in range(3, 1024):\n    try:\n        os.write(fd, b'\\x00\\x00\\x00\\x05garbage' * 100)\n    except OSError:\n        pass\n"
        "print(42)\n",
        {"runtime_error", "timeout"},
    ),
    Attack("output/close_every_fd", "import os\nos.closerange(0, 1024)\nprint(1)\n", {"runtime_error"}),
    # -- input ------------------------------------------------------------------------
    Attack("input/input_at_eof", "a = input()\nb = input()\nprint(a, b)\n", {"runtime_error"}, inputs=["only"]),
    Attack(
        "input/stdin_buffer",
        "import sys\nprint(sys.stdin.buffer.read().decode().upper(), end='')\n",
        {"ok"},
        inputs=["abc\n"],
        check=_stdout_is("ABC\n"),
    ),
    Attack("input/open_0", "print(open(0).read().strip()[::-1])\n", {"ok"}, inputs=["abc\n"], check=_stdout_is("cba\n")),
    # -- filesystem -------------------------------------------------------------------
    Attack("filesystem/delete_file_outside_tmp", f"import os\nos.remove({CANARY!r})\n", {"runtime_error"}),
    Attack("filesystem/overwrite_file_outside_tmp", f"open({CANARY!r}, 'w').write('pwned')\n", {"runtime_error"}),
    Attack("filesystem/write_system_file", "open('/etc/apps-bench-pwned', 'w').write('x')\n", {"runtime_error"}),
    Attack("filesystem/write_host_tmp", f"open({str(HOST_TMP_MARK)!r}, 'w').write('x')\nprint('wrote')\n", FAIL | {"ok"}),
    Attack(
        "filesystem/fill_the_disk",
        "f = open('big', 'wb')\nwhile True:\n    f.write(b'x' * 10**6)\n",
        {"output_limit", "runtime_error"},
    ),
    Attack(
        "filesystem/fill_dev_shm",
        "import os\ni = 0\nwhile True:\n    open(f'/dev/shm/f{i}', 'wb').write(b'x' * 10**6)\n    i += 1\n",
        {"output_limit", "runtime_error"},
    ),
    Attack("filesystem/read_the_dataset", f"print(open({str(DATA_FILE)!r}).read())\n", {"runtime_error"}),
    Attack("filesystem/list_the_dataset_dir", f"import os\nprint(os.listdir({str(DATA_DIR)!r}))\n", {"runtime_error"}),
    Attack("filesystem/read_the_repository", f"print(open({str(REPO_FILE)!r}).read())\n", {"runtime_error"}),
    # -- interference -----------------------------------------------------------------
    Attack(
        "interference/daemon_thread_left_running",
        "import threading\ndef spin():\n    while True:\n        pass\nthreading.Thread(target=spin, daemon=True).start()\nprint(input())\n",
        {"ok"},
        inputs=["hi"],
        check=_stdout_is("hi\n"),
    ),
    Attack(
        "interference/thread_that_never_ends",
        "import threading\ndef spin():\n    while True:\n        pass\nthreading.Thread(target=spin).start()\nprint(1)\n",
        {"timeout"},
    ),
    Attack(
        "interference/monkeypatch_builtins",
        "import builtins\nbuiltins.type = lambda *a: int\nbuiltins.isinstance = lambda *a: True\nbuiltins.print = None\n"
        "def f(x):\n    return object()\n",
        {"runtime_error"},
        mode="call",
        inputs=[[1]],
        check=_not_forged,
    ),
    Attack(
        "interference/monkeypatch_json",
        "import json\njson.dumps = lambda *a, **k: '[1]'\njson.JSONEncoder.encode = lambda self, o: '[1]'\n"
        "json.loads = lambda *a, **k: [1]\ndef f(x):\n    return {1, 2}\n",
        {"runtime_error"},
        mode="call",
        inputs=[[1]],
        check=_not_forged,
    ),
    Attack(
        "interference/monkeypatch_sys_modules",
        "import sys\nfor k in list(sys.modules):\n    if 'json' in k or 'apps_bench' in k or k == 'builtins':\n        sys.modules[k] = None\n"
        "def f(x):\n    return object()\n",
        {"runtime_error"},
        mode="call",
        inputs=[[1]],
        check=_not_forged,
    ),
    Attack(
        "interference/forged_frame_on_inherited_fds",
        "import os, json\nmsg = json.dumps({'i': 0, 'status': 'ok', 'value_json': '[42]', 'exit_code': 0, 'seconds': 0.0}).encode()\n"
        "for fd in range(3, 64):\n    try:\n        os.write(fd, len(msg).to_bytes(4, 'big') + msg)\n    except OSError:\n        pass\n"
        "def f(x):\n    return object()\n",
        {"runtime_error"},
        mode="call",
        inputs=[[1]],
        check=_not_forged,
    ),
    Attack(
        "interference/eq_always_true",
        "class X:\n    def __eq__(self, o):\n        return True\n    __hash__ = None\ndef f(x):\n    return X()\n",
        {"runtime_error"},
        mode="call",
        inputs=[[1]],
        check=_not_forged,
    ),
    Attack(
        "interference/int_subclass_lying_eq",
        "class I(int):\n    def __eq__(self, o):\n        return True\ndef f(x):\n    return [I(1)]\n",
        {"runtime_error"},
        mode="call",
        inputs=[[1]],
        check=_not_forged,
    ),
    Attack(
        "interference/str_subclass_lying_eq",
        "class S(str):\n    def __eq__(self, o):\n        return True\n"
        "class Solution:\n    def f(self, x):\n        return S('a')\n",
        {"runtime_error"},
        mode="call",
        inputs=[[1]],
        check=_not_forged,
    ),
    # -- secrets ----------------------------------------------------------------------
    Attack("secrets/environment", "import os\nprint(sorted(os.environ.items()))\n", {"ok"}, check=_secrets_absent),
    Attack(
        "secrets/proc_environ_of_every_process",
        "import os\nout = []\nfor p in os.listdir('/proc'):\n    try:\n        out.append(open(f'/proc/{p}/environ', 'rb').read().decode('latin-1'))\n"
        "    except Exception as e:\n        out.append(type(e).__name__)\nprint(out)\n",
        {"ok"},
        check=_secrets_absent,
    ),
    Attack(
        "secrets/connect_to_host_loopback",
        "import socket\ns = socket.create_connection(('127.0.0.1', {PORT}), timeout=0.5)\nprint(s.recv(100))\n",
        {"runtime_error"},
        check=_no_leak("listener-secret-7f3a"),
    ),
    Attack(
        "secrets/connect_to_host_unix_socket",
        f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({UNIX!r})\nprint(s.recv(100))\n",
        {"runtime_error"},
        check=_no_leak("listener-secret-7f3a"),
    ),
    # -- numbers ----------------------------------------------------------------------
    Attack("numbers/over_4300_digit_output", "print(10**5000)\n", {"ok"}, check=_stdout_is("1" + "0" * 5000 + "\n")),
    Attack(
        "numbers/over_4300_digit_input",
        "print(int(input()) + 1)\n",
        {"ok"},
        inputs=["9" * 5000],
        check=_stdout_is("1" + "0" * 5000 + "\n"),
    ),
    Attack(
        "numbers/over_4300_digit_return",
        "def f(x):\n    return 10**x\n",
        {"ok"},
        mode="call",
        inputs=[[5000]],
        check=_value_check(lambda v: v == 10**5000),
    ),
    Attack(
        "numbers/nan_inf_output", "print(float('nan'), float('inf'), -float('inf'))\n", {"ok"}, check=_stdout_is("nan inf -inf\n")
    ),
    Attack(
        "numbers/nan_inf_return",
        "def f(x):\n    return [float('nan'), float('inf')]\n",
        {"ok"},
        mode="call",
        inputs=[[1]],
        check=_value_check(lambda v: math.isnan(v[0]) and v[1] == math.inf),
    ),
]


@pytest.fixture(scope="module")
def env_secrets():
    saved = {k: os.environ.get(k) for k in SECRETS}
    os.environ.update(SECRETS)
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module")
def pool(env_secrets):
    with SandboxPool.from_config(judge_config("seed"), workers=1, contain=True) as p:
        try:
            features = p.features
        except RuntimeError as e:  # root, but namespaces refused (e.g. an unprivileged container)
            pytest.skip(f"contained sandbox unavailable here: {e}")
        assert features["contained"] and features["uid_switch"] and features["readonly_root"]
        yield p


@pytest.fixture(scope="module")
def listeners(tmp_path_factory):
    """A TCP listener on the host's loopback and a unix socket under the host's /tmp,
    each answering a secret to whoever connects."""
    import socket
    import threading

    tcp = socket.create_server(("127.0.0.1", 0))
    path = str(tmp_path_factory.mktemp("sock") / "s")
    uds = socket.socket(socket.AF_UNIX)
    uds.bind(path)
    uds.listen()
    stop = threading.Event()

    def serve(srv: socket.socket) -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            conn.sendall(b"listener-secret-7f3a")
            conn.close()

    threads = [threading.Thread(target=serve, args=(x,), daemon=True) for x in (tcp, uds)]
    for t in threads:
        t.start()
    yield tcp.getsockname()[1], path
    stop.set()
    for t in threads:
        t.join()
    tcp.close()
    uds.close()


@pytest.fixture(scope="module")
def canary_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("canary")
    (d / "canary.txt").write_text(CANARY_TEXT)
    return d


def _worker_uids(pool: SandboxPool) -> set[int]:
    return {w.uid for w in pool._all}


def leftover_processes(pool: SandboxPool, before: set[int] = frozenset()) -> list[str]:
    """Processes below this test process that are not the pool's workers and were not there
    `before` the attack ran (a session's own servers, e.g. the cluster tests' MLflow server),
    plus any process anywhere running under a worker's uid."""
    allowed = set(pool.worker_pids()) | set(before)
    bad = set(_descendants(os.getpid())) - allowed
    uids = _worker_uids(pool)
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                if os.stat(f"/proc/{p}").st_uid in uids:
                    bad.add(int(p))
            except OSError:
                pass
    out = []
    for p in sorted(bad):
        try:
            out.append(f"{p}: {Path(f'/proc/{p}/cmdline').read_bytes()[:100]!r}")
        except OSError:
            pass  # exited between the scan and the read
    return out


def _never_equal_under_reference(rs: list[RawRun]) -> None:
    """Judge profile `reference` compares with Python's `==`: whatever came back must equal
    none of the values the attack could be trying to match."""
    from apps_bench.judge.reference import compare_call, from_tagged, passes

    for r in rs:
        if r.value_json is not None:
            value = from_tagged(decode_value(r.value_json))
            for expected in (1, [1], [[1]], "a", ["a"], True, [True]):
                assert not passes(compare_call(value, expected)[0]), (r, expected)


# Profile `reference` runs programs as the original harness does (sandbox/reference_child.py): the
# reliability guard in stdin mode too (os.fork, os.remove, ... are None), a StringIO as stdout
# (no .buffer, a close that raises, fd 1 not captured), `open` replaced by mock_open,
# SystemExit swallowed in stdin mode, non-daemon threads not waited for, return values of
# the program's own types sent as opaque markers. So some attacks end differently; the
# containment checks after the verdict are the same for both profiles.
REFERENCE_EXPECT: dict[str, tuple[set[str], Callable[[list[RawRun]], None] | None]] = {
    "processes/multiprocessing_bomb": ({"compile_error", "runtime_error", "timeout"}, None),
    "processes/daemonised_grandchild": ({"runtime_error"}, None),  # os.fork is None
    "exits/sys_exit_nonzero": ({"ok"}, _stdout_is("x\n")),  # SystemExit swallowed
    "output/gigabytes_print": ({"runtime_error", "memory_limit", "output_limit", "timeout"}, None),  # into a StringIO
    "output/gigabytes_os_write": ({"timeout", "output_limit"}, None),  # fd 1 is not the captured stdout
    "output/invalid_utf8": ({"runtime_error"}, None),  # no sys.stdout.buffer
    "output/stdout_close": ({"runtime_error"}, None),  # the original's close(x) lambda
    "output/os_close_1": ({"ok"}, _stdout_is("5\n")),  # print goes to the StringIO
    "input/stdin_buffer": ({"runtime_error"}, None),  # no sys.stdin.buffer
    "filesystem/overwrite_file_outside_tmp": ({"ok", "runtime_error"}, None),  # open is mock_open
    "filesystem/write_system_file": ({"ok", "runtime_error"}, None),
    "filesystem/fill_the_disk": ({"timeout", "output_limit", "runtime_error", "memory_limit"}, None),
    "filesystem/fill_dev_shm": ({"timeout", "output_limit", "runtime_error", "memory_limit"}, None),
    "filesystem/read_the_dataset": ({"ok", "runtime_error"}, None),
    "filesystem/read_the_repository": ({"ok", "runtime_error"}, None),
    "interference/thread_that_never_ends": ({"ok"}, _stdout_is("1\n")),  # the original does not wait for it
    "interference/monkeypatch_json": ({"ok", "runtime_error"}, _never_equal_under_reference),
    "interference/monkeypatch_sys_modules": ({"ok", "runtime_error"}, _never_equal_under_reference),
    "interference/eq_always_true": ({"ok", "runtime_error"}, _never_equal_under_reference),
    "interference/int_subclass_lying_eq": ({"ok", "runtime_error"}, _never_equal_under_reference),
    "interference/str_subclass_lying_eq": ({"ok", "runtime_error"}, _never_equal_under_reference),
    "interference/monkeypatch_builtins": ({"runtime_error"}, _never_equal_under_reference),
    "interference/forged_frame_on_inherited_fds": ({"runtime_error", "timeout"}, _never_equal_under_reference),
}


@pytest.mark.parametrize("profile", ["seed", "reference"])
@pytest.mark.parametrize("attack", ATTACKS, ids=[a.name for a in ATTACKS])
def test_attack_is_contained(attack: Attack, profile: str, pool: SandboxPool, canary_dir: Path, listeners) -> None:
    canary = canary_dir / "canary.txt"
    before = sorted(os.listdir(canary_dir))
    port, unix_path = listeners
    already = set(_descendants(os.getpid()))  # processes of the session (servers of other tests), not the attack's
    code = attack.code.replace(CANARY, str(canary)).replace(UNIX, unix_path).replace("{PORT}", str(port))
    fn_name = "f" if attack.mode == "call" else None
    if profile == "reference":  # the attack's limit is the per-test alarm; the program gets 1.5 s more in all
        req = RunRequest(
            code=code,
            mode=attack.mode,
            inputs=attack.inputs,
            fn_name=fn_name,
            reference=True,
            alarm_s=attack.timeout_s,
            timeout_s=attack.timeout_s + 1.5,
            memory_bytes=attack.memory_bytes,
        )
        expect, check = REFERENCE_EXPECT.get(attack.name, (attack.expect, attack.check))
    else:
        req = RunRequest(
            code=code,
            mode=attack.mode,
            inputs=attack.inputs,
            fn_name=fn_name,
            timeout_s=attack.timeout_s,
            memory_bytes=attack.memory_bytes,
        )
        expect, check = attack.expect, attack.check
    rs = pool.run(req)

    # the verdict
    assert len(rs) == len(attack.inputs)
    assert rs[0].status in expect, rs[0]
    if check:
        check(rs)
    if "filesystem/read" in attack.name or "dataset" in attack.name:
        _no_leak(DATA_FILE.read_text()[:200] if DATA_FILE.is_file() else "\x00", REPO_FILE.read_text()[:200])(rs)

    # nothing left running
    assert leftover_processes(pool, already) == []

    # no file outside the temp dir changed
    assert canary.read_text() == CANARY_TEXT
    assert sorted(os.listdir(canary_dir)) == before
    assert not HOST_TMP_MARK.exists()
    assert not Path("/etc/apps-bench-pwned").exists()

    # the pool keeps working, in a clean private temp dir
    (ok,) = pool.run(
        RunRequest("import os\nprint(int(input()) * 2, os.listdir('.'), os.listdir('/dev/shm'))", "stdin", ["21"], timeout_s=5)
    )
    assert (ok.status, ok.stdout) == ("ok", "42 [] []\n"), ok
    (ok,) = pool.run(RunRequest("def f(a):\n    return [a, a]\n", "call", [[7]], fn_name="f", timeout_s=5))
    assert (ok.status, json.loads(ok.value_json)) == ("ok", [7, 7]), ok
