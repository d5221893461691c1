"""The script loader under its former name: see :mod:`.scripts`."""

from .scripts import get, source

__all__ = ["get", "source"]
