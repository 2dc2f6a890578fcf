"""podman for `make e2e-image`: a private containers.conf and storage.conf (nothing of the
system's edited), a base image built from Debian packages alone (no registry), the image
built from the repository's Dockerfile on it, and every name this run gives.

Measured facts behind the settings (Debian 12, podman 4.3.1, cgroups v1, root):
- crun refuses this kernel's hybrid cgroups ("cgroups in hybrid mode not supported, drop
  all controllers from cgroupv2"): runtime = "runc";
- podman raises every container's nofile/nproc to its own defaults, which the calling shell
  may not be allowed to ("setrlimit RLIMIT_NOFILE: Operation not permitted"): the defaults
  are the caller's own hard limits.
"""

from __future__ import annotations

import hashlib
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WORK = REPO / ".e2e" / "image"  # the confs and the cached base tarball
# The image store: outside the repository (pytest and the docs tests walk it), the system's own left alone.
STORE = Path("/var/lib/containers/vllm-specdec-e2e")
PREFIX = "vllm-specdec-e2e"  # every container, pod, volume and image this run names starts with it
IMAGE = f"localhost/{PREFIX}-exporter:test"
BASE_NAME = f"localhost/{PREFIX}-base"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")

# The base: Debian's own python3 and pip, nothing else. Changing any of this (or the suite
# or mirror) changes the key, and so rebuilds the cached tarball.
DEBOOTSTRAP = ["--variant=minbase", "--include=python3,python3-pip,ca-certificates"]
# After debootstrap: no apt caches, and pip may install outside a venv (PEP 668's marker gone:
# the Dockerfile installs into the image's own Python, as on the python:*-slim base).
CLEANUP = ["var/cache/apt/archives/*.deb", "var/lib/apt/lists/*", "usr/lib/python3*/EXTERNALLY-MANAGED"]
RECIPE_VERSION = "1"


def _log(msg: str) -> None:
    print(f"[e2e-image] {msg}", file=sys.__stderr__, flush=True)  # past pytest's capture: the costs in make's log


def write_confs() -> dict[str, str]:
    """containers.conf and storage.conf under WORK; the environment that points podman at them."""
    WORK.mkdir(parents=True, exist_ok=True)
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc_hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    nproc = 32768 if nproc_hard == resource.RLIM_INFINITY else min(32768, nproc_hard)
    nofile_s = "unlimited" if nofile == resource.RLIM_INFINITY else str(nofile)
    (WORK / "containers.conf").write_text(
        "# written by tests/e2e_image/podman_env.py for make e2e-image\n"
        "[containers]\n"
        f'default_ulimits = ["nofile={nofile_s}:{nofile_s}", "nproc={nproc}:{nproc}"]\n'
        "[engine]\n"
        'runtime = "runc"\n'
    )
    (WORK / "storage.conf").write_text(
        "# written by tests/e2e_image/podman_env.py for make e2e-image\n"
        "[storage]\n"
        'driver = "overlay"\n'
        f'graphroot = "{STORE}"\n'
        f'runroot = "/run/{PREFIX}"\n'
    )
    return {"CONTAINERS_CONF": str(WORK / "containers.conf"), "CONTAINERS_STORAGE_CONF": str(WORK / "storage.conf")}


ENV = {**os.environ, **write_confs()}


def podman(*args: str, check: bool = True, timeout: float = 600, **kw) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["podman", *args], env=ENV, capture_output=True, text=True, timeout=timeout, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return proc


def cannot_run() -> str | None:
    """Why podman cannot run a container here, or None: a throwaway container on an overlay of the
    host's own root (no image needed, nothing written to the host)."""
    if shutil.which("podman") is None:
        return "podman is not installed (make e2e-image installs it with apt-get: was it refused?)"
    try:
        proc = podman("run", "--rm", "--network", "none", "--rootfs", "/:O", "true", check=False, timeout=120)
    except subprocess.TimeoutExpired:
        return "podman run did not finish in 120 s"
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
        return f"podman cannot run a container here: {last}"
    return None


def apt_mirror_and_suite() -> tuple[str, str]:
    """The Debian mirror apt already uses for this release, and the release's codename."""
    suite = ""
    for line in Path("/etc/os-release").read_text().splitlines():
        if line.startswith("VERSION_CODENAME="):
            suite = line.split("=", 1)[1].strip().strip('"')
    if not suite:
        raise AssertionError("/etc/os-release names no VERSION_CODENAME: not a Debian release debootstrap knows")
    for f in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        for para in re.split(r"\n\s*\n", f.read_text()):
            fields = dict(re.findall(r"^(\w[\w-]*):\s*(.*)$", para, re.M))
            if ("deb" in fields.get("Types", "").split() and suite in fields.get("Suites", "").split()
                    and fields.get("Enabled", "yes").lower() != "no"):
                return fields["URIs"].split()[0], suite
    lists = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*.list"))]
    for f in lists:
        if f.exists():
            for line in f.read_text().splitlines():
                m = re.match(r"\s*deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+(\S+)", line)
                if m and m.group(2) == suite:
                    return m.group(1), suite
    raise AssertionError(f"no apt source for {suite} in /etc/apt/sources.list{{,.d/}}: debootstrap needs a mirror")


def base_key(mirror: str, suite: str) -> str:
    recipe = repr((RECIPE_VERSION, suite, mirror, DEBOOTSTRAP, CLEANUP))
    return hashlib.sha256(recipe.encode()).hexdigest()[:12]


def image_exists(ref: str) -> bool:
    return podman("image", "exists", ref, check=False).returncode == 0


def base_image() -> str:
    """localhost/<PREFIX>-base:<key>: imported from the cached tarball, built by debootstrap first
    when the recipe's key has none (3.5-4.5 min; the tarball is kept, ~200 MB)."""
    mirror, suite = apt_mirror_and_suite()
    key = base_key(mirror, suite)
    ref = f"{BASE_NAME}:{key}"
    if image_exists(ref):
        return ref
    tarball = WORK / f"base-{suite}-{key}.tar"
    if not tarball.exists():
        for old in WORK.glob("base-*.tar"):  # another recipe's: stale
            old.unlink()
        rootfs = WORK / "rootfs"
        shutil.rmtree(rootfs, ignore_errors=True)
        _log(f"debootstrap {suite} from {mirror} (a few minutes, once per recipe)")
        t0 = time.monotonic()
        proc = subprocess.run(["debootstrap", *DEBOOTSTRAP, suite, str(rootfs), mirror], capture_output=True, text=True)
        if proc.returncode != 0:
            log = rootfs / "debootstrap" / "debootstrap.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise AssertionError(f"debootstrap failed ({proc.returncode}):\n{proc.stderr[-2000:]}\n{tail}")
        for pattern in CLEANUP:
            for p in rootfs.glob(pattern):
                p.unlink() if not p.is_dir() or p.is_symlink() else shutil.rmtree(p)
        partial = tarball.with_suffix(".partial")
        subprocess.run(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(partial), "."], check=True)
        partial.rename(tarball)
        shutil.rmtree(rootfs, ignore_errors=True)
        _log(f"base rootfs built in {time.monotonic() - t0:.0f} s: {tarball.stat().st_size / 1e6:.0f} MB")
    for old in podman("images", "--format", "{{.Repository}}:{{.Tag}}", BASE_NAME, check=False).stdout.split():
        podman("rmi", "--force", old, check=False)
    podman("import", "--quiet", str(tarball), ref)
    return ref


def build_image(base: str) -> str:
    """The repository's Dockerfile on the Debian base (the Dockerfile's pinned registry base
    stays its default); pip inside the build sees the host's CA bundle where egress is
    TLS-intercepted."""
    revision = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True,
                              text=True).stdout.strip() or "unknown"
    args = ["build", "--pull=never", "--network", "host", "--layers", "--build-arg", f"BASE={base}",
            "--build-arg", f"REVISION={revision}", "-t", IMAGE, "-f", str(REPO / "Dockerfile")]
    if CA_BUNDLE.exists():
        args += ["-v", f"{CA_BUNDLE}:{CA_BUNDLE}:ro"]
    podman(*args, str(REPO), timeout=1200)
    # Earlier builds' layers: kept a day as the build cache, then dropped, so the store stays bounded.
    podman("image", "prune", "--force", "--filter", "until=24h", check=False)
    return IMAGE


def remove_everything(volumes: tuple[str, ...] = ()) -> None:
    """Every pod and container this run names, its volumes and ``volumes`` (a pod's, by the names
    its YAML gives them): by name, never all; also after a failure."""
    for pod in podman("pod", "ps", "--format", "{{.Name}}", check=False).stdout.split():
        if pod.startswith(PREFIX):
            podman("pod", "rm", "--force", pod, check=False)
    for ctr in podman("ps", "-a", "--format", "{{.Names}}", check=False).stdout.split():
        if ctr.startswith(PREFIX):
            podman("rm", "--force", "--time", "2", ctr, check=False)
    for vol in podman("volume", "ls", "--format", "{{.Name}}", check=False).stdout.split():
        if vol.startswith(PREFIX) or vol in volumes:
            podman("volume", "rm", "--force", vol, check=False)
