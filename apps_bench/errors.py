"""The root of the project's own exceptions.

Every exception class defined in `apps_bench` derives from `AppsBenchError` (tests/test_errors.py walks the
package to check it), so an entry point can tell "the project said no, with a message meant for the user"
from a bug in one `except` clause. Classes keep their standard bases too (`ValueError`, `OSError`, ...)
where a caller catches them by those.
"""

from __future__ import annotations


class AppsBenchError(Exception):
    """Raised by apps_bench on purpose: its message says what went wrong and, where it can, the fix."""
