"""The front door (issue 24): README.md stays short, every generated block of README.md
and docs/*.md is what generators/pages.py makes now (`make generate`), and every local
link resolves to a file of the repository (and a heading, for an anchor)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import REPO
from vllm_specdec_exporter.generators import pages as docs

DOCS = docs.doc_files(REPO)
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)\)")


def test_the_readme_is_at_most_15_kb():
    size = (REPO / "README.md").stat().st_size
    assert size <= 15 * 1024, f"README.md is {size:,} bytes: move detail to docs/"


def test_every_generated_block_is_current():
    stale = [str(p.relative_to(REPO)) for p in DOCS if docs.with_blocks(p.read_text(), REPO) != p.read_text()]
    assert stale == [], f"out of date (run make generate): {stale}"
    assert docs.main(["--root", str(REPO), "--check"]) == 0


def test_the_registries_each_have_their_generated_block():
    specs = {p.name: docs.blocks(p.read_text()) for p in DOCS}
    where = {s.split()[0] for blocks in specs.values() for s in blocks}
    assert {"flags", "metrics", "alerts", "help", "output"} <= where
    assert "flags" in specs["configuration.md"] and "metrics" in specs["metrics.md"] and "alerts" in specs["alerts.md"]
    import argparse

    from vllm_specdec_exporter.cli import build_parser
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert {f"help {c}" for c in commands} <= set(specs["command-line.md"])


def test_every_alert_has_its_measured_columns():
    from vllm_specdec_exporter.generators.rules import ALERT_NAMES
    assert sorted(docs.ALERT_NOTES) == sorted(n.removeprefix(docs.PREFIX) for n in ALERT_NAMES), "add or remove the alert's row in generators/pages.py ALERT_NOTES"


def test_every_metric_note_names_an_exported_family():
    from vllm_specdec_exporter.metrics import FAMILIES
    assert set(docs.METRIC_NOTES) <= FAMILIES.keys()


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {slug(m[1]) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return LINK.findall(text)


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_local_link_resolves(path):
    broken = []
    for target in links(path):
        if re.match(r"[a-z]+:", target):
            assert target.startswith(("https://", "http://", "mailto:")), target
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if REPO.resolve() not in (dest, *dest.parents):
            broken.append(f"{target}: outside the repository")
        elif not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor}")
    assert broken == []


CLIMB = re.compile(r"(?:\.\./)+[\w.-]+")  # a relative path that climbs: ../name, ../../name


def test_no_doc_names_a_path_outside_the_repository():
    """A user who clones the repository has nothing beside it: every path a doc climbs to is a file
    or folder of the repository, from the doc's own folder (docs/alerts.md's ../alerts)."""
    outside = [
        f"{path.relative_to(REPO)}: {found}"
        for path in DOCS
        for found in CLIMB.findall(path.read_text())
        if REPO.resolve() not in (dest := (path.parent / found).resolve()).parents or not dest.exists()
    ]
    assert outside == []


def test_the_readme_links_every_docs_page():
    readme = (REPO / "README.md").read_text()
    pages = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").rglob("*.md"))
    assert len(pages) >= 10, pages  # the files were found (a checkout without docs/ passes nothing)
    missing = [name for name in pages if f"({name})" not in readme]
    assert missing == []


# Files whose comments point a reader at a page: a path to a Markdown file, with an anchor.
POINTERS = (REPO / "examples" / "config.yaml", REPO / "helm" / "vllm-specdec-exporter" / "values.yaml",
            REPO / "Makefile", REPO / "Dockerfile")
POINTER = re.compile(r"((?:[\w.-]+/)*[\w.-]+\.md)(?:#([\w-]+))?")


@pytest.mark.parametrize("path", POINTERS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_page_a_config_comment_points_at_exists(path):
    text = path.read_text()
    assert not re.search(r"\(README: ", text), f"{path.name}: name the page and its anchor, e.g. docs/x.md#section"
    broken = []
    for file, anchor in POINTER.findall(text):
        dest = next((d for d in (path.parent / file, REPO / file) if d.exists()), None)
        if dest is None:
            broken.append(f"{file}: no such file")
        elif anchor and anchor not in anchors(dest):
            broken.append(f"{file}#{anchor}: no such heading")
    assert broken == []


# vLLM's own files that docs/e2e-vllm.md names (the fixes it applies): not this repository's.
VLLM_FILES = {"cpu/mtp.py", "cpu_mla.py"}


def test_every_python_file_a_page_names_exists():
    import os
    paths = []
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("build", "__pycache__")]
        paths += [str((Path(root) / f).relative_to(REPO)) for f in files if f.endswith(".py")]
    missing = {}
    for path in DOCS:
        text = path.read_text()
        named = set(re.findall(r"(?<![\w/.-])((?:[\w-]+/)*\w+\.py)\b", text)) - VLLM_FILES
        gone = sorted(m for m in named if not any(t == m or t.endswith("/" + m) for t in paths))
        if gone:
            missing[str(path.relative_to(REPO))] = gone
    assert missing == {}


def test_every_test_file_make_check_names_exists():
    """`make check` runs the unit tier by file name: a file folded into another left it failing."""
    makefile = (REPO / "Makefile").read_text()
    names = re.search(r"^UNIT_TESTS := ((?:.*\\\n)*.*)$", makefile, re.M)
    assert names, "no UNIT_TESTS in the Makefile"
    listed = names.group(1).replace("\\\n", " ").split()
    assert len(listed) > 10 and [n for n in listed if not (REPO / "tests" / f"test_{n}.py").is_file()] == []


def test_the_development_layout_names_every_module_of_the_package():
    layout = (REPO / "docs" / "development.md").read_text().split("## Layout", 1)[1].split("## ", 1)[0]
    package = REPO / "exporter" / "vllm_specdec_exporter"
    modules = [p.name + ("/" if p.is_dir() else "") for p in package.iterdir()
               if not p.name.startswith("__") and p.name != "data" and (p.is_dir() or p.suffix == ".py")]
    assert [m for m in sorted(modules) if m not in layout] == []
