"""The image is reproducible: a digest-pinned base and hash-pinned runtime dependencies."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib

from conftest import REPO

LOCK = REPO / "requirements.lock"


def _pins() -> dict[str, str]:
    """name -> version of every requirement in the lock, each checked to carry a hash."""
    pins = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", LOCK.read_text()):
        m = re.match(r"([A-Za-z0-9_.-]+)==(\S+)", block)
        if m:
            assert "--hash=sha256:" in block, f"{m.group(1)} is pinned without a hash"
            pins[re.sub(r"[-_.]+", "-", m.group(1)).lower()] = m.group(2)
    return pins


def test_lock_pins_every_runtime_dependency_by_hash():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9_.-]+", d).group(0)).lower() for d in deps}
    pins = _pins()
    assert names <= pins.keys(), f"not in requirements.lock: {sorted(names - pins.keys())} (re-run pip-compile, see README)"
    # No test tooling in the image.
    assert not {"pytest", "hypothesis", "grafanalib", "ruff"} & pins.keys()


def test_every_base_image_is_pinned_by_digest():
    dockerfile = (REPO / "Dockerfile").read_text()
    bases = re.findall(r"^ARG BASE=(\S+)", dockerfile, re.M)
    assert bases and all(re.search(r"@sha256:[0-9a-f]{64}$", b) for b in bases), bases
    for image in re.findall(r"^FROM\s+(\S+)", dockerfile, re.M):
        assert image == "${BASE}", f"FROM {image} is not the pinned base"


def test_the_image_carries_its_revision_into_build_info():
    """The image has no git checkout: build_info's revision comes from a build argument."""
    from vllm_specdec_exporter import config

    final = (REPO / "Dockerfile").read_text().split("FROM ${BASE}\n")[-1]
    assert "ARG REVISION" in final
    assert f"{config.ENV_PREFIX}REVISION=${{REVISION}}" in final


def test_the_locked_runtime_set_installs_with_hashes_and_runs_the_cli_and_demo(tmp_path):
    """What the image's pip steps do, for real: the lock alone installs with
    --require-hashes and is enough to run the command line and the demo (which
    `make demo` installs with the runtime dependencies only, no test extra)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(py), "install", "--quiet", "--no-compile"]
    done = subprocess.run([*pip, "--require-hashes", "-r", str(LOCK)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    env = {**os.environ, "PYTHONPATH": str(REPO / "exporter")}
    out = subprocess.run([str(py), "-m", "vllm_specdec_exporter", "report", str(REPO / "examples/vllm-v1-dp8-k2.prom")],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "mean acceptance length  2.572" in out.stdout
    demo = subprocess.run([str(py), "-m", "vllm_specdec_exporter", "demo", "--duration", "3s",
                           "--exporter-port", "0", "--simulator-port", "0"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert demo.returncode == 0, demo.stderr[-2000:]
    assert "per engine AL" in demo.stdout and "demo stopped" in demo.stdout
