"""Attacks on the judge's own measurements and on what a program leaves for the next one.

Run as a script by tests/sandbox/test_hostile.py, as root and as a non-root user (the
sandbox's user-namespace mode): `python hostile_run.py PROFILE DATA_FILE SECRET_FILE ONLY` judges every
attack below on a one-worker pool of that judge profile, each followed on the same worker
by a correct program (through `SandboxPool.run` and `python_exec`; ONLY: a comma-separated
list of attack names, empty for all), and prints one JSON object: what each attack and its successors got back, and the processes left after the
pool closed. The asserting happens in the test.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass, field

from apps_bench.judge.profiles import judge_config
from apps_bench.sandbox import RunRequest, SandboxPool
from apps_bench.sandbox.contain import _descendants

MARK = "apps-bench-hostile-mark-5c1e"
LIMIT_S = 0.5  # the attacks' per-test limit (the timing attacks run 0.1 s past it)

# The program's own timer lies: every harness clock name it can reach in its caller's globals is
# rebound to run 0.3 s slow; in `reference` it also stops the per-test alarm.
REBIND_TIMER = """import sys, time, signal
signal.setitimer(signal.ITIMER_REAL, 0)
g = sys._getframe(1).f_globals
for name in ('_perf', 'perf_counter'):
    real = g.get(name)
    if callable(real) and not getattr(real, 'forged', False):
        fake = lambda real=real: real() - 0.3
        fake.forged = True
        g[name] = fake
time.sleep(%(sleep)s)
print(int(input()) * 2)
""" % {"sleep": LIMIT_S + 0.1}

# The program finds the result channel and its nonce in its own memory and writes the frame
# the harness would write, claiming 0.01 s, after running past the limit.
FORGE_FRAME = """import gc, json, os, signal, time
signal.setitimer(signal.ITIMER_REAL, 0)
answer = str(int(input()) * 2) + '\\n'
time.sleep(%(sleep)s)
for o in gc.get_objects():
    if type(o).__name__ == 'ChildSpec':
        out = answer.encode()
        meta = {'i': o.start, 'status': 'ok', 'exit_code': 0, 'seconds': 0.01, 'n': getattr(o, 'nonce', ''),
                'out_len': len(out), 'err_len': 0}
        m = json.dumps(meta).encode()
        body = len(m).to_bytes(4, 'big') + m + out
        os.write(o.res_fd, len(body).to_bytes(4, 'big') + body)
        break
print(answer, end='')
""" % {"sleep": LIMIT_S + 0.1}

CAPS = """with open('/proc/self/status') as f:
    for line in f:
        if line.split(':')[0] in ('CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb', 'NoNewPrivs', 'Seccomp'):
            print(line.strip())
"""

# Unmount what hides the host, then look for the rows file and the user's API key; unshare a
# fresh user namespace (root in it) and try again from there.
MOUNTS = """import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
for p in ('/tmp', '/work', '/home', '/root', '/'):
    if libc.umount2(p.encode(), 2) == 0:
        print('BREACH UMOUNTED', p)
if libc.mount(b'none', b'/etc', b'tmpfs', 0, None) == 0:
    print('BREACH MOUNTED /etc')
if libc.unshare(0x10000000 | 0x00020000) == 0:
    print('BREACH UNSHARED')
for path in (%(data)r, %(secret)r):
    try:
        with open(path) as f:
            print('BREACH READ', f.read()[:200])
    except OSError as e:
        pass
print('done')
"""

# The worker is PID 1 of the program's PID namespace: take its stderr (the judge's) and write there,
# count the worker's fds it can take, attach to it with ptrace, read its memory.
WORKER = """import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
pidfd = libc.syscall(434, 1, 0)
got = 0
if pidfd >= 0:
    for fd in range(64):
        r = libc.syscall(438, pidfd, fd, 0)
        if r >= 0:
            got += 1
            if fd == 2:
                os.write(r, b'%(mark)s worker stderr\\n')
if got:
    print('BREACH GETFD', got)
if libc.ptrace(16, 1, 0, 0) == 0:
    print('BREACH PTRACE')
buf = ctypes.create_string_buffer(8)
local = (ctypes.c_void_p * 2)(ctypes.cast(buf, ctypes.c_void_p), 8)
remote = (ctypes.c_void_p * 2)(0x400000, 8)
if libc.syscall(310, 1, local, 1, remote, 1, 0) > 0:
    print('BREACH VMREAD')
print('done')
"""

# SysV shared memory, a message queue and a semaphore set, all world-readable, left behind.
IPC_LEAVE = """import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
shm = libc.shmget(0x7f3a, 1 << 20, 0o1666 | 0o1000)
if shm >= 0:
    addr = libc.shmat(shm, None, 0)
    ctypes.memmove(addr, b'%(mark)s shm', 26)
    print('SHM')
if libc.msgget(0x7f3b, 0o1666) >= 0:
    print('MSG')
if libc.semget(0x7f3c, 1, 0o1666) >= 0:
    print('SEM')
"""

IPC_LOOK = """import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
left = sum(len(open(f'/proc/sysvipc/{k}').readlines()) - 1 for k in ('shm', 'msg', 'sem'))
shm = libc.shmget(0x7f3a, 0, 0)
seen = ctypes.string_at(libc.shmat(shm, None, 0), 26) if shm >= 0 else b''
print(int(input()) * 2, left, seen)
"""

# Fill /tmp and $TMPDIR (file by file: each file is capped by RLIMIT_FSIZE).
FILL_TMP = """import os
n = 0
for d in ('/tmp', os.environ.get('TMPDIR', '/tmp'), '/dev/shm'):
    for k in range(100):
        try:
            with open(os.path.join(d, f'fill{k}'), 'wb') as f:
                for _ in range(8):
                    f.write(b'x' * (1 << 20))
                    n += 1
        except OSError:
            break
print('filled', n)
"""

NEEDS_TMP = """import os, tempfile
with tempfile.TemporaryFile() as f:
    f.write(b'y' * (4 << 20))
print(int(input()) * 2, sorted(os.listdir(os.environ['TMPDIR'])))
"""

# Kernel keyrings: a key in the user keyring and a new named session keyring, both outliving the program.
KEYS = """import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
if libc.syscall(248, b'user', b'%(mark)s', b'secret', 6, -4) >= 0:
    print('BREACH ADDED')
if libc.syscall(250, 1, b'%(mark)s-session') >= 0:
    print('BREACH JOINED')
if libc.syscall(249, b'user', b'%(mark)s', None, 0) >= 0:
    print('BREACH REQUESTED')
"""

KEYS_LOOK = """import os
print(int(input()) * 2, '%(mark)s' in open('/proc/keys').read())
"""

SECRETS_LOOK = """import os
print(sorted(os.environ.items()))
for p in (os.path.expanduser('~'), '/root', '/home'):
    for dirpath, _, files in os.walk(p):
        for f in files:
            try:
                print(dirpath, f, open(os.path.join(dirpath, f)).read()[:100])
            except OSError:
                pass
"""

# A directory tree deeper than Python's recursion limit in the run dir (the worker's sweep must cope).
DEEP_TREE = """import os
for _ in range(3000):
    os.mkdir('a')
    os.chdir('a')
print(int(input()) * 2)
"""

CORRECT = "print(int(input()) * 2)\n"


@dataclass
class Attack:
    name: str
    code: str
    inputs: list[str] = field(default_factory=lambda: ["1"])
    timeout_s: float = 5.0
    # a correct program judged right after, on the same worker (it must pass)
    after: str = CORRECT


def attacks(data_file: str, secret_file: str) -> list[Attack]:
    sub = {"mark": MARK, "data": data_file, "secret": secret_file}
    return [
        Attack("forged_timing", REBIND_TIMER, ["1", "2"], timeout_s=LIMIT_S),
        Attack("forged_result_frame", FORGE_FRAME, ["1"], timeout_s=LIMIT_S),
        Attack("capabilities", CAPS),
        Attack("mount_changes", MOUNTS % sub),
        Attack("ptrace_pidfd_getfd_worker", WORKER % sub),
        Attack("sysv_ipc_left_behind", IPC_LEAVE % sub, after=IPC_LOOK),
        Attack("tmp_filled", FILL_TMP, timeout_s=20.0, after=NEEDS_TMP),
        Attack("keyrings", KEYS % sub, after=KEYS_LOOK % sub),
        Attack("secrets", SECRETS_LOOK),
        Attack("deep_tree", DEEP_TREE, after=NEEDS_TMP),
    ]


def main() -> None:
    profile, data_file, secret_file, only = sys.argv[1:5]
    reference = profile == "reference"
    out: dict[str, object] = {"uid": os.geteuid(), "attacks": {}}
    before = set(_descendants(os.getpid()))
    with SandboxPool.from_config(judge_config(profile), workers=1) as pool:
        out["features"] = pool.features
        out["program_uids"] = [pool._uid_base, pool._uid_base + 255]
        for a in attacks(data_file, secret_file):
            if only and a.name not in only.split(","):
                continue
            # reference: the limit is the per-test alarm; the whole program gets 1.5 s more
            req = RunRequest(
                a.code,
                "stdin",
                a.inputs,
                timeout_s=a.timeout_s + (1.5 if reference else 0),
                reference=reference,
                alarm_s=a.timeout_s,
            )
            rs = pool.run(req)
            # reference: `open` is a mock and the reliability guard removes much of `os`; the plain program
            run_after = pool.run(
                RunRequest(CORRECT if reference else a.after, "stdin", ["21"], timeout_s=5, reference=reference, alarm_s=5)
            )
            exec_after = pool.python_exec(a.after, "21\n", timeout_s=5, output_chars=2000)
            exec_attack = pool.python_exec(a.code, "1\n", timeout_s=a.timeout_s, output_chars=2000)
            exec_after2 = pool.python_exec(a.after, "21\n", timeout_s=5, output_chars=2000)
            out["attacks"][a.name] = {  # type: ignore[index]
                "runs": [asdict(r) for r in rs],
                "run_after": [asdict(r) for r in run_after],
                "exec_after": asdict(exec_after),
                "exec_attack": asdict(exec_attack),
                "exec_after2": asdict(exec_after2),
            }
    out["left"] = sorted(set(_descendants(os.getpid())) - before)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
