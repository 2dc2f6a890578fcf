"""Layers (issue 12 item 7): the domain math does not know how configuration is loaded, and
nothing generic depends on one producer's adapter, which the next producers would have to fake."""

from __future__ import annotations

import ast
import re

import pytest
from conftest import REPO

PACKAGE = REPO / "exporter" / "vllm_specdec_exporter"
DOMAIN = ("model", "derive", "restarts", "baselines", "health", "diagnosis", "diagnosis_state", "history", "trend", "admission", "capacity")
# Domain modules may read constants (config) and each other, nothing that loads, fetches or serves.
DOMAIN_ALLOWED = {"config", "parser", *DOMAIN}
ADAPTER_MODULES = sorted(p.stem for p in (PACKAGE / "adapters").glob("*.py") if p.stem not in ("__init__", "common"))


def imports(path) -> set[str]:
    """Modules of this package a file imports, as dotted names relative to the package ('adapters.vllm_v1')."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = node.module or ""
            if path.parent.name == "adapters" and node.level == 1:
                base = f"adapters.{base}" if base else "adapters"
            out |= {base} if base else {a.name for a in node.names}
            if base in ("", "adapters"):
                out |= {f"{base}.{a.name}".lstrip(".") for a in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vllm_specdec_exporter"):
            out.add(node.module.removeprefix("vllm_specdec_exporter").lstrip(".") or "")
    return out


@pytest.mark.parametrize("module", DOMAIN)
def test_domain_modules_import_no_configuration_loading_or_adapters(module):
    found = {m.split(".")[0] for m in imports(PACKAGE / f"{module}.py")} - {"", "__version__"}
    assert found <= DOMAIN_ALLOWED, f"{module}.py imports {sorted(found - DOMAIN_ALLOWED)}"


# The sidecar's side: what a poll publishes and serves. None of it reads the CLI's report modules
# (summary.py is the JSON schema the CLI and /api/v1/summary share; only web.py builds it).
SIDECAR = ("views", "poller", "collector")
CLI_REPORT = {"cli", "render", "summary"}


@pytest.mark.parametrize("module", ["diagnosis", "diagnosis_state"])
def test_the_diagnosis_imports_no_poller_web_or_cli(module):
    found = {m.split(".")[0] for m in imports(PACKAGE / f"{module}.py")}
    assert not found & {"poller", "views", "web", "cli", "render", "summary"}, f"{module}.py imports {sorted(found)}"


def test_the_verdict_imports_the_diagnosis_never_its_state():
    # One way: health (the verdict) calls diagnosis (the causes); the state reads both.
    assert "diagnosis" in imports(PACKAGE / "health.py")
    assert "diagnosis_state" not in imports(PACKAGE / "health.py") | imports(PACKAGE / "diagnosis.py")
    assert "health" not in imports(PACKAGE / "diagnosis.py")


@pytest.mark.parametrize("module", SIDECAR)
def test_the_sidecars_views_import_no_cli_report_module(module):
    found = {m.split(".")[0] for m in imports(PACKAGE / f"{module}.py")}
    assert not found & CLI_REPORT, f"{module}.py imports {sorted(found & CLI_REPORT)}"


def test_nothing_outside_the_adapters_imports_one_producers_adapter():
    for path in sorted(PACKAGE.rglob("*.py")):
        if "adapters" in path.parts:
            continue
        bad = {m for m in imports(path) if m.startswith("adapters.") and m.split(".")[1] in ADAPTER_MODULES}
        assert not bad, f"{path.relative_to(REPO)} imports {sorted(bad)}: generic modules use adapters.extract"


def test_the_import_scanner_sees_a_forbidden_import(tmp_path):
    # The checks above would pass vacuously if imports() saw nothing.
    probe = tmp_path / "probe.py"
    probe.write_text("from .settings import BaselineProfile\nfrom .adapters.vllm_v1 import series_name\n")
    assert {"settings", "adapters.vllm_v1"} <= imports(probe)


def test_the_generators_are_build_tools_the_sidecar_never_imports():
    for path in sorted(PACKAGE.rglob("*.py")):
        if "generators" in path.parts:
            continue
        bad = {m for m in imports(path) if m.split(".")[0] == "generators"}
        assert not bad, f"{path.relative_to(REPO)} imports {sorted(bad)}"


def test_no_sys_path_tricks_in_the_package():
    offenders = [str(p.relative_to(REPO)) for p in PACKAGE.rglob("*.py") if "sys.path" in p.read_text()]
    assert offenders == []


MAX_MODULE_LINES = 450  # issue 32: a module past this has grown a second job; split it along its seam


def test_no_module_is_over_the_size_a_reader_holds_at_once():
    sizes = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert len(sizes) > 40, sizes  # the walk found the package
    assert {m: n for m, n in sizes.items() if n > MAX_MODULE_LINES} == {}


def test_no_module_is_named_like_a_top_level_folder():
    folders = {p.name for p in REPO.iterdir() if p.is_dir() and not p.name.startswith(".")}
    modules = {p.stem for p in PACKAGE.rglob("*.py")} | {p.name for p in PACKAGE.rglob("*") if p.is_dir()}
    assert modules & folders == set()


def _label_literals(path) -> list[str]:
    """String constants (docstrings left out) that are exactly a label name, or a selector that spells one."""
    tree = ast.parse(path.read_text())
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    out = []
    spelled = re.compile(r"^model_name$|model_name=|labels\.model_name|\{\{model_name\}\}|\$model_name")
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings and spelled.search(n.value):
            out.append(n.value)
    return out


def test_label_names_come_from_config():
    # scenarios.py's scenario files have a model_name key (a config key, not the label).
    allowed = {"config.py", "scenarios.py"}
    found = {str(p.relative_to(REPO)): hits for p in sorted(PACKAGE.rglob("*.py"))
             if p.name not in allowed and (hits := _label_literals(p))}
    assert found == {}


def _module_name(path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_imports(path) -> set[str]:
    """This package's modules a file imports anywhere in it (a function's body included), resolved
    to dotted module names ('adapters.vllm_v1'; '' is the package itself)."""
    here = _module_name(path)
    package = here.split(".") if path.name == "__init__.py" else here.split(".")[:-1]
    package = [p for p in package if p]
    known = {_module_name(p) for p in PACKAGE.rglob("*.py")}
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
            target = ".".join([*base, *(node.module.split(".") if node.module else [])])
        elif (node.module or "").startswith("vllm_specdec_exporter"):
            target = node.module.removeprefix("vllm_specdec_exporter").lstrip(".")
        else:
            continue
        for alias in node.names:  # `from . import vllm_v1` imports a module, not a name
            sub = f"{target}.{alias.name}".lstrip(".")
            out.add(sub if sub in known else target)
    return out - {here}


def _cycles(graph: dict[str, set[str]]) -> list[str]:
    """Each import cycle found by a depth-first walk (a module's own package __init__ is not an edge)."""
    done: set[str] = set()
    found = []

    def visit(node: str, stack: list[str]) -> None:
        if node in stack:
            found.append(" -> ".join([*stack[stack.index(node):], node]))
            return
        if node in done:
            return
        for nxt in sorted(graph.get(node, ())):
            if nxt and not node.startswith(f"{nxt}."):
                visit(nxt, [*stack, node])
        done.add(node)

    for start in sorted(graph):
        visit(start, [])
    return found


def test_no_import_cycles_in_the_package_even_inside_functions():
    cycles = _cycles({_module_name(p): _package_imports(p) for p in PACKAGE.rglob("*.py")})
    assert not cycles, f"import cycles: {cycles[:5]}"


def test_the_cycle_check_sees_a_cycle():
    # The check above would pass vacuously if it resolved nothing: a real pair, and a made-up cycle.
    assert "adapters.vllm_v1" in _package_imports(PACKAGE / "adapters" / "renamed.py")
    assert "adapters.common" in _package_imports(PACKAGE / "adapters" / "vllm_v1.py")
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a -> b -> c -> a"]
