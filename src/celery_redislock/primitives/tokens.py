"""Owner tokens: unique per process and grant, cheap to make.

A token is the caller's prefix (LockedTask puts the task id, worker and pid
there, so a supervisor can recognise a dead child's holds), then 64 random
bits drawn once per process (again in a forked child) and a counter.
"""

from __future__ import annotations

import itertools
import os
import secrets

__all__ = ["new_token", "process"]


class _Process:
    """This process's id and a random prefix for its tokens, renewed in a forked child."""

    def __init__(self) -> None:
        self.renew()

    def renew(self) -> None:
        self.pid = os.getpid()
        self.salt = secrets.token_hex(8)
        self.count = itertools.count()


#: os.getpid() and os.urandom() are system calls; a token needs neither per call.
process = _Process()
os.register_at_fork(after_in_child=process.renew)


def new_token(owner: str = "") -> str:
    """A token no other grant anywhere has: ``owner``, this process's salt, a counter."""
    return f"{owner}{process.salt}{next(process.count):x}"
