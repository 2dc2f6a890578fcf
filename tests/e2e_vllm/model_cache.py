"""Where the tiny model is kept: one directory per version of build_model.py, so that
changing the builder rebuilds it and nothing else does. Standard library only: both the
e2e venv (the builder) and the project's venv (the checks) import it."""

from __future__ import annotations

import hashlib
from pathlib import Path


def model_dir(root: Path) -> Path:
    builder = Path(__file__).with_name("build_model.py")
    return Path(root) / hashlib.sha256(builder.read_bytes()).hexdigest()[:12]


def mtp_model_dir(root: Path) -> Path:
    """The DeepSeek MTP checkpoints (build_mtp_model.py, which imports build_model.py's corpus and
    tunes the chain head on prompts.py's load)."""
    here = Path(__file__).parent
    key = hashlib.sha256()
    for name in ("build_mtp_model.py", "build_model.py", "prompts.py"):
        key.update((here / name).read_bytes())
    return Path(root) / f"mtp-{key.hexdigest()[:12]}"
