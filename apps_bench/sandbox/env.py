"""The environment a sandbox worker (and so every program) starts with: nothing of the
judge's (no API keys, tokens, tracking URIs). Its own module so the pool can launch
workers without importing the containment code (ctypes) first."""

CLEAN_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
}
