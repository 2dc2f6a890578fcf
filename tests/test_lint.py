"""ruff over the repository (lint, import order; formatting of the package and bench) and
mypy --strict over the package: lint findings, unformatted code and type errors fail the
build (rule sets and strictness are configured in pyproject.toml)."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import REPO

BIN = Path(sys.executable).parent


def _run(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    exe = BIN / tool
    assert exe.exists(), f"{tool} is pinned in the test extra (pip install -e '.[test]')"
    return subprocess.run([str(exe), *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_ruff_finds_no_mistakes():
    # The whole repository; .e2e/, .venv/ and .tools/ are excluded in pyproject.toml.
    proc = _run("ruff", "check", ".")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_package_and_bench_are_formatted():
    # ruff format (line length from pyproject.toml) over the package and the benchmarks.
    proc = _run("ruff", "format", "--check", "exporter", "bench")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_package_type_checks_strictly():
    # Files and strictness from [tool.mypy]; no cache, so a stale one cannot hide an error.
    proc = _run("mypy", "--no-incremental")
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---- from test_no_ctypes.py
# No reaching into other programs' memory: the package never loads ctypes (or cffi, or
# CPython's private _ssl) to write into OpenSSL's or CPython's structures. webconfig.py
# (now webconfig/tls.py) once set an SSL_CTX's verify callback through ctypes at an offset
# read from CPython's object layout; with a shifted layout that segfaults before any check
# can refuse.


PACKAGE = REPO / "exporter" / "vllm_specdec_exporter"
FORBIDDEN_MODULES = ("ctypes", "_ctypes", "cffi", "_ssl")
LOADED_FORBIDDEN = ("ctypes", "_ctypes", "cffi")  # _ssl is loaded by ssl itself: only importing it directly is refused
# Reading or writing at an address: the layout tricks, whatever module they come from.
FORBIDDEN_NAMES = ("from_address", "from_buffer", "__basicsize__", "CDLL", "PyDLL", "pythonapi", "CFUNCTYPE")


def _sources() -> list[Path]:
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 20, files  # the package, not an empty directory
    return files


def test_no_module_imports_ctypes_or_private_ssl():
    found = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "__import__" \
                    and node.args and isinstance(node.args[0], ast.Constant):
                names = [str(node.args[0].value)]
            for name in names:
                if name.split(".")[0] in FORBIDDEN_MODULES:
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}: imports {name}")
    assert not found, "\n".join(found)


def test_no_memory_layout_tricks_in_the_source():
    found = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
            if name in FORBIDDEN_NAMES:
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: {name}")
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                    any(m in node.value for m in ("import ctypes", "importlib.import_module('ctypes')")):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value[:40]!r}")
    assert not found, "\n".join(found)


def test_ctypes_is_never_loaded_by_importing_everything_and_building_every_tls_setting(tmp_path):
    """Every module imported, and a web config using each TLS key (client certificates
    verified, a curve set) loaded: ctypes is not in sys.modules afterwards."""
    from security_harness import make_pki

    (tmp_path / "pki").mkdir()
    pki = make_pki(tmp_path / "pki")
    script = textwrap.dedent(f"""
        import importlib, pkgutil, sys, yaml
        import vllm_specdec_exporter as pkg
        for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            if not m.name.endswith("__main__"):
                importlib.import_module(m.name)
        from vllm_specdec_exporter.webconfig.load import load_web_config
        for mode in ("VerifyClientCertIfGiven", "RequireAndVerifyClientCert"):
            path = {str(tmp_path / "web.yaml")!r}
            tls = {{"cert_file": {str(pki / "server.crt")!r}, "key_file": {str(pki / "server.key")!r},
                   "client_auth_type": mode, "client_ca_file": {str(pki / "ca.crt")!r},
                   "client_allowed_sans": ["prometheus.monitoring"], "min_version": "TLS12",
                   "max_version": "TLS13", "cipher_suites": ["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"],
                   "prefer_server_cipher_suites": False, "curve_preferences": ["CurveP256"]}}
            open(path, "w").write(yaml.safe_dump({{"tls_server_config": tls}}))
            assert load_web_config(path).ssl_context is not None
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in {LOADED_FORBIDDEN!r})
        print("LOADED", loaded)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=str(REPO))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "LOADED []" in proc.stdout, proc.stdout
