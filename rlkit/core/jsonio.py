"""Files that are never seen half-written (the lowest layer: no rlkit imports)."""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any


def partial_suffix() -> str:
    """The part of a partial file's name that no other writer of the same file uses at the same time: this process
    and this thread (notebook 07's side-by-side runs prepare the same files from threads of one process)."""
    return f"partial-{os.getpid()}-{threading.get_ident()}"


def write_json_atomic(path: str | os.PathLike, payload: Any) -> Path:
    """``payload`` as JSON at ``path``, written beside it and renamed into place (never half-written)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=False, default=_json_default) + "\n")
    tmp.replace(path)
    return path


def _json_default(obj):
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON-serialisable: {type(obj).__name__}")
