"""The sandbox limits that can change a verdict, as the judge config declares them.

Values live in `conf/judge/<profile>.yaml` (its `sandbox:` block, which is part of the cell
key); this class only names and types them. It is also the structured-config schema of that
block (every field required: a missing key fails at compose time), and what the pool, its
workers and the program children are built from. Nothing here has a default on purpose.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields

from .packages import check_declared

_KINDS: dict[str, type | tuple[type, ...]] = {"int": int, "float": (int, float), "str": str}  # a field's annotation -> its types


@dataclass
class SandboxLimits:
    output_cap_bytes: int  # a test's stdout (or JSON return value) above this is output_limit
    pids_max: int  # pids cgroup limit per worker (root only): processes alive at once in a worker
    nproc: int  # RLIMIT_NPROC of a program's uid
    nofile: int  # RLIMIT_NOFILE: open files per program process
    tmp_size: str  # tmpfs size of the worker's /tmp (the program's working directory)
    shm_size: str  # tmpfs size of the worker's /dev/shm
    grace_s: float  # wall-clock slack past timeout_s before the worker kills a test
    first_test_slack_s: float  # extra wall clock for a fresh child's fork, set-up and compile
    cpu_slack_s: int  # RLIMIT_CPU backstop: seconds of CPU past timeout_s before SIGXCPU
    exec_memory_bytes: int  # RLIMIT_AS of the agents' python_exec programs (they share this sandbox)
    stderr_chars: int  # stderr tail kept per test (verdict details, python_exec's stderr)
    # the third-party packages a program may import besides the standard library (packages.py); checked installed
    packages: list[str]

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name == "packages":
                continue
            v = getattr(self, f.name)
            want = _KINDS[str(f.type)]
            if isinstance(v, bool) or not isinstance(v, want):
                raise ValueError(f"judge.sandbox.{f.name} must be {f.type}, got {v!r}")
            if isinstance(v, (int, float)) and v < 0:
                raise ValueError(f"judge.sandbox.{f.name} must be >= 0, got {v!r}")
        for name in ("tmp_size", "shm_size"):
            if not re.fullmatch(r"[1-9][0-9]*[kmg]?", getattr(self, name)):
                raise ValueError(
                    f"judge.sandbox.{name} must be a tmpfs size such as 256m (digits, then k, m or g), "
                    f"got {getattr(self, name)!r}"
                )
        for name in ("output_cap_bytes", "pids_max", "nproc", "nofile", "stderr_chars"):
            if getattr(self, name) <= 0:
                raise ValueError(f"judge.sandbox.{name} must be > 0, got {getattr(self, name)!r}")
        if isinstance(self.packages, str) or not isinstance(self.packages, (list, tuple)):
            raise ValueError(f"judge.sandbox.packages must be a list of module names, got {self.packages!r}")
        self.packages = list(check_declared(self.packages))

    def to_dict(self) -> dict[str, object]:
        return asdict(self)
