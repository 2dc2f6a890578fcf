"""The image is reproducible (a digest-pinned base, hash-pinned runtime dependencies),
and its pip steps, entrypoint and command work: run for real from a wheel built here."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import urllib.request
from pathlib import Path

import pytest
import yaml
from conftest import REPO
from prom_harness import http_ok, listening_port, wait_for

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


# --- The image's steps, for real (no Docker engine runs here) ---

@pytest.fixture
def world_readable_tmp():
    """A temp dir the image's uid 65532 can reach (pytest's own tmp_path is root-only)."""
    path = Path(tempfile.mkdtemp(prefix="vllm-specdec-image-"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.long
def test_the_images_steps_install_the_locked_set_and_run_the_cli_demo_and_cmd(world_readable_tmp, tmp_path):
    """The Dockerfile's pip steps, once: the lock alone installs with --require-hashes
    into an empty venv, then the wheel built here with --no-deps. From that set only
    (which `make demo` also installs, no test extra) the command line and the demo run,
    and the image's ENTRYPOINT + CMD serve as uid 65532 from a read-only config,
    writing nothing."""
    root = world_readable_tmp
    dockerfile = (REPO / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["vllm-specdec-exporter"]' in dockerfile and "USER 65532:65532" in dockerfile
    assert 'CMD ["serve", "--config.file=/etc/vllm-specdec-exporter/config.yaml"]' in dockerfile
    wheels = root / "wheels"
    # The wheel builds (in pip's isolated build env) while the lock installs.
    build = subprocess.Popen([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(wheels),
                              str(REPO)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    venv = root / "image"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(py), "install", "--quiet", "--no-compile"]
    done = subprocess.run([*pip, "--require-hashes", "-r", str(LOCK)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    _, err = build.communicate(timeout=300)
    assert build.returncode == 0, err[-2000:]
    done = subprocess.run([*pip, "--no-index", "--no-deps", "--find-links", str(wheels), "vllm-specdec-exporter"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    exe = venv / "bin" / "vllm-specdec-exporter"
    assert exe.exists()
    # The image's environment: no test environment on the path, no .pyc written.
    env = {"PATH": f"{venv}/bin:/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}

    # The demo runs for 5 s meanwhile (outside the image's tree): its engines' figures show from ~4 s,
    # and it stops at its --duration (its last frame there, not a refresh later).
    with open(tmp_path / "demo.out", "w+") as demo_out, open(tmp_path / "demo.err", "w+") as demo_err:
        demo = subprocess.Popen([str(exe), "demo", "--duration", "5s", "--exporter-port", "0", "--simulator-port", "0"],
                                env=env, cwd=tmp_path, stdout=demo_out, stderr=demo_err)
        try:
            out = subprocess.run([str(exe), "report", str(REPO / "examples/vllm-v1-dp8-k2.prom")],
                                 capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
            assert out.returncode == 0, out.stderr
            assert "mean acceptance length  2.572" in out.stdout
            _serve_as_the_image_does(root, venv, exe, env)
            demo.wait(timeout=60)
        finally:
            demo.kill()
    assert demo.returncode == 0, (tmp_path / "demo.err").read_text()[-2000:]
    shown = (tmp_path / "demo.out").read_text()
    assert "per engine AL" in shown and "demo stopped" in shown


def _serve_as_the_image_does(root: Path, venv: Path, exe: Path, env: dict[str, str]) -> None:
    """The image's CMD, with its config mounted read-only, writing nothing: as uid 65532 where that
    uid can reach the interpreter (not a pyenv under a 0700 /root, as on these machines: there as
    this user). `make e2e-image` runs the image itself as uid 65532 with a read-only root."""
    etc = root / "etc"
    etc.mkdir()
    (etc / "config.yaml").write_text(yaml.safe_dump({"targets": [{"url": "http://127.0.0.1:1/metrics"}],
                                                      "web": {"listen_address": "127.0.0.1:0"}}))
    for p in (root, venv, etc):
        os.chmod(p, 0o755)
    os.chmod(etc / "config.yaml", 0o444)
    before = sorted(root.rglob("*"))
    setpriv = shutil.which("setpriv")
    as_user = ([setpriv, "--reuid=65532", "--regid=65532", "--clear-groups"]
               if setpriv and os.geteuid() == 0 else [])
    # uid 65532 must reach the base interpreter the venv links to: not so when Python lives
    # under a 0700 directory (many homes), where the command runs as this user instead.
    if as_user and subprocess.run([*as_user, str(venv / "bin" / "python"), "-S", "-c", "pass"],
                                  capture_output=True, env=env, cwd="/", timeout=60).returncode != 0:
        as_user = []
    proc = subprocess.Popen([*as_user, str(exe), "serve", f"--config.file={etc / 'config.yaml'}"], env=env, cwd="/",
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        port = wait_for(lambda: proc.poll() is not None or listening_port(proc), 30, "the image's command to listen",
                        step=0.05)
        assert proc.poll() is None, proc.stderr.read().decode()
        wait_for(lambda: http_ok(f"http://127.0.0.1:{port}/healthz"), 30, "the image's command to serve", step=0.05)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            body = resp.read().decode()
        assert 'vllm_specdec_up{target="vllm"} 0.0' in body
    finally:
        proc.terminate()
        proc.wait(10)
    assert proc.returncode == 0, proc.stderr.read()
    assert sorted(root.rglob("*")) == before  # nothing written
