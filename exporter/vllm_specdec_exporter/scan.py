"""Where the parser's fast path looks in a payload: the '# EOF' line and the stretches of lines
that may hold a wanted name (bytes.rfind and bytes.find at C speed, in STEP slices so that the
parsing thread lets go of the GIL in between), and the regex that reads the wanted names' lines
in those stretches (linear: every quantifier possessive). The parser (parser.py) owns the text
format; this module only finds lines for it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

# Leading blanks that str.strip() takes off a line (every code point but '\n' for which
# str.isspace() holds, as UTF-8; test_parser checks the list): the careful path and
# prometheus_client read an indented line, so the fast path must hand it over, not skip it.
B_INDENT = rb"(?:[\t\x0b\x0c\r\x1c-\x1f ]|\xc2[\x85\xa0]|\xe1\x9a\x80|\xe2\x80[\x80-\x8a\xa8\xa9\xaf]|\xe2\x81\x9f|\xe3\x80\x80)"

# Long C-level scans go in steps of this many bytes (each well under a millisecond).
STEP = 1 << 20


def rfind(data: bytes, needle: bytes, lo: int, hi: int) -> int:
    """data.rfind(needle, lo, hi) in STEP slices from the end, so the parsing thread lets go
    of the GIL in between. rfind, not find: CPython 3.11's find runs the two-way algorithm on
    long payloads, ~3x slower here than rfind's skip search (0.3 against 0.9 line counts)."""
    if hi - lo <= STEP:
        return data.rfind(needle, lo, hi)
    while hi - lo >= len(needle):
        start = max(lo, hi - STEP)
        pos = data.rfind(needle, start, hi)
        if pos != -1 or start == lo:
            return pos
        hi = start + len(needle) - 1  # an occurrence across the slices' border is found in the next one
    return -1


def find_eof(data: bytes) -> int:
    """Offset of the first line that is exactly '# EOF' (blanks and CR allowed after it), or -1.
    Every candidate is looked at, from the end: first by its 'O' (rfind of one byte is memrchr,
    ~20x a multi-byte search, and an upper-case O is rare in an exposition: 3 in vLLM's DP=8
    payload), then, past a budget of O's, by a search for '\n# EOF' over the rest."""
    first, hi = -1, len(data)  # the candidates whose 'O' is below hi are still to be looked at
    budget = 64 + len(data) // 2048
    while True:
        if budget:
            budget -= 1
            o = data.rfind(b"O", 0, hi)
            if o == -1:
                break
            hi, pos = o, o - 3
        else:
            nl = rfind(data, b"\n# EOF", 0, hi)
            pos = nl + 1 if nl != -1 else 0 if hi > 3 and data.startswith(b"# EOF") else -1
            if pos == -1:
                break
            hi = pos + 3
        if pos >= 0 and (pos == 0 or data[pos - 1] == 0x0A) and data.startswith(b"# EOF", pos):
            end = data.find(b"\n", pos)
            if data[pos : len(data) if end == -1 else end].strip() == b"# EOF":
                first = pos
    return first


def end_of(data: bytes, start: int, limit: int) -> int:
    end = data.find(b"\n", start, limit)
    return limit if end == -1 else end


# Every name an adapter reads holds one of these (a name that holds none is its own anchor):
# one rfind pass per anchor, at C speed, finds every line that may hold a wanted name,
# whatever the number of producers and names (a pass per name prefix cost ~13 line counts).
# Each anchor costs about a pass over the payload whether it is there or not, so as few as
# cover every name: 'spec_' is in every producer's spec-decode names ('spec_decode_' and
# 'sglang:spec_' as two anchors made a DP=8 poll's parse and derive 7 % dearer, side by side).
ANCHORS = (b"spec_", b"generation_tokens_total")

# Hits of an anchor at most this far apart are read as one stretch: the regex skips the
# lines between them at C speed, cheaper than a Python step per line (vLLM writes a
# family's lines together, with its _created twins and comments around them).
GAP = 4096


def runs(data: bytes, anchors: Iterable[bytes], limit: int) -> list[tuple[int, int]]:
    """Stretches of whole lines (start, end without its newline) that hold every line with an
    anchor before ``limit``, in order, merged. Found from the end (rfind), then down a stretch
    a GAP at a time (find of the lowest hit in the GAP below: bytes.find is fast on slices
    that short), so a family of a thousand lines costs a few C calls, not one per line."""
    found: list[tuple[int, int]] = []
    find = data.find
    for anchor in anchors:
        pos = rfind(data, anchor, 0, limit)
        while pos != -1:
            first = last = pos
            while True:  # down the stretch: the lowest hit within GAP below the lowest so far
                lo = max(first - GAP, 0)
                pos = find(anchor, lo, first)
                if pos == -1:
                    break
                first = pos
            found.append((data.rfind(b"\n", 0, first) + 1, end_of(data, last, limit)))
            # An occurrence that starts before lo, even one that ends after it, is still to be found.
            pos = rfind(data, anchor, 0, lo + len(anchor) - 1) if lo else -1
    found.sort()
    merged: list[tuple[int, int]] = []
    for s, e in found:
        if merged and s <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], e))
        else:
            merged.append((s, e))
    return merged


# A sample line of one of the wanted names: group 1 the series (name and label set, its
# grammar checked once per series: the parser's SeriesCache), 2 the value, 3 the timestamp; or, when the line
# starts with a wanted name but is not of that simple shape, no group (parse_sample_line
# reads it).
_B_SERIES_LABELS = rb"(?:\{[^}\n]*+\})?"
_B_NUMBER = rb"[0-9A-Za-z.+\-]++"  # no '_' and ASCII only, as _parse_float asks; float() says the rest


def _alternatives(needles: Iterable[bytes]) -> bytes:
    """A regex matching exactly the needles, as a trie (each shared prefix written once, so a
    line that starts with none of them fails at its first bytes, not once per name)."""
    trie: dict[int, dict] = {}  # type: ignore[type-arg]
    for needle in needles:
        node = trie
        for byte in needle:
            node = node.setdefault(byte, {})
        node[-1] = {}  # a needle ends here

    def emit(node: dict) -> bytes:  # type: ignore[type-arg]
        branches = [re.escape(bytes([b])) + emit(child) for b, child in sorted(node.items()) if b != -1]
        if not branches:
            return b""
        body = branches[0] if len(branches) == 1 else b"(?:" + b"|".join(branches) + b")"
        return b"(?:" + body + b")?" if -1 in node else body

    return emit(trie)


def _lines_re(needles: Iterable[bytes]) -> tuple[re.Pattern[bytes], re.Pattern[bytes]]:
    """The line regex led by the newline before the line (not '^': a literal first byte lets re
    skip to the next line start in C, ~3x faster over a stretch than trying '^' at each byte),
    and the same without it, for the payload's first line.

    Linear time by construction: every quantifier is possessive (``*+``, ``++``), so no
    run of blanks is ever split two ways (an earlier ``[ \t]*(?:#...)?[ \t\r]*$`` tried every
    split of N blanks before a stray byte: 1.2 s for one line of 16k blanks). The second
    branch hands the careful path any other line that starts with a wanted name, indented
    or not, followed by anything that cannot continue a name."""
    names = _alternatives(needles)
    line = (
        rb"(?:("
        + names
        + _B_SERIES_LABELS
        + rb")[ \t]++("
        + _B_NUMBER
        + rb")(?:[ \t]++("
        + _B_NUMBER
        + rb"))?[ \t]*+(?:#[^\n]*+)?[ \t\r]*+$|"
        + B_INDENT
        + rb"*+"
        + names
        + rb"(?![a-zA-Z0-9_:]))"
    )
    return re.compile(b"\n" + line, re.MULTILINE), re.compile(line, re.MULTILINE)


def prepare(wanted: Iterable[str]) -> None:
    """Build the finder for ``wanted`` now: ~9 ms of regex compiling, once a process, that would
    otherwise land on the first payload's parse (parse_pool judges a target by its parse's cost)."""
    finder(frozenset(wanted))


@functools.lru_cache(maxsize=32)
def finder(wanted: frozenset[str]) -> tuple[tuple[bytes, ...], re.Pattern[bytes], re.Pattern[bytes]]:
    """The anchors to look for, and the regexes that read the wanted names' lines (_lines_re)."""
    anchors: dict[bytes, None] = {}
    needles = [name.encode() for name in sorted(wanted)]
    for needle in needles:
        anchors[next((a for a in ANCHORS if a in needle), needle)] = None
    return tuple(anchors), *_lines_re(needles)
