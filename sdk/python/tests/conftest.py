"""Where the golden vectors are: ``$BP_VECTORS_python`` or the repository's
``conformance/vectors/``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

REPO_VECTORS = Path(__file__).resolve().parents[3] / "conformance" / "vectors"


def vectors_dir() -> Path:
    override = os.environ.get("BP_VECTORS_python")
    return Path(override) if override else REPO_VECTORS


def load_vectors(name: str) -> tuple[Path, dict[str, Any] | None, str | None]:
    """The parsed file, or None and why it could not be read (the tests then fail)."""
    path = vectors_dir() / name
    try:
        with path.open("rb") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        return path, None, f"cannot read golden vectors {path}: {e}"
    if not isinstance(data, dict):
        return path, None, f"{path}: not a JSON object"
    return path, data, None
