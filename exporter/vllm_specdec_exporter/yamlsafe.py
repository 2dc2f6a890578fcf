"""The one way the sidecar reads YAML (its config file, the web config, the packaged baselines):
PyYAML's safe loader without aliases and no deeper than a given nesting, so what it builds
is at most as big as the text. Imported only where YAML is read (``report FILE`` and a
refused flag load no yaml)."""

from __future__ import annotations

from typing import IO

import yaml


class Refused(yaml.composer.ComposerError):
    """Valid YAML this loader will not build: an alias, or nesting deeper than allowed."""


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader without aliases (``*name``, merge keys included: a few
    hundred bytes of them expand to a billion strings, the "billion laughs") and no
    deeper than ``max_depth`` (PyYAML composes recursively: 50,000 ``[`` were a
    RecursionError)."""

    def __init__(self, stream: str | IO[str], max_depth: int):
        super().__init__(stream)
        self._depth = 0
        self._max_depth = max_depth

    def _line(self) -> int:
        return int(self.peek_event().start_mark.line) + 1  # type: ignore[no-untyped-call]

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            raise Refused(None, None, f"aliases (*name) are refused (line {self._line()}): write the value out", None)
        self._depth += 1
        try:
            if self._depth > self._max_depth:
                raise Refused(None, None, f"nested deeper than {self._max_depth} levels (line {self._line()})", None)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[object, object]:
        # PyYAML keeps the last of two equal keys: a second `url:` in a target silently won.
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, str | int | float | bool) and key in seen:
                where = f"line {key_node.start_mark.line + 1}"
                raise Refused(None, None, f"the key {str(key)[:40]!r} appears twice in one mapping ({where}): keep one", None)
            seen.add(key)
        return super().construct_mapping(node, deep)


def load(stream: str | IO[str], max_depth: int) -> object:
    """The one document in ``stream``; raises yaml.YAMLError (``Refused`` for an alias or
    nesting deeper than ``max_depth``)."""
    loader = _Loader(stream, max_depth)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
