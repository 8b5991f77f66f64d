"""The open-file limit of a generator or engine process: raised to the hard limit at start."""

from __future__ import annotations

import contextlib
import sys


def raise_open_file_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard one (every stream is a socket: a 1,024 default would make a
    2,000-stream run fail with EMFILE); the soft limit in force after, or 0 where there is none."""
    if sys.platform == "win32":
        return 0
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20  # the kernel's usual nr_open
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]
