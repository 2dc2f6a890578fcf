"""Prometheus text (0.0.4) and OpenMetrics parser with a fast path.

A vLLM TP=8/DP=8 endpoint serves ~3,400 lines of which ~40 are speculative
decoding. With ``wanted`` set, the parser finds only the lines of those sample
names with ``bytes.find`` (C speed) and parses just them, instead of tokenising
3,400 lines in Python. Names are matched exactly at the start of a line and must be
followed by ``{`` or a blank, so ``foo_total`` never matches ``foo_total_created``
and ``x_accepted_tokens_total`` never matches ``x_accepted_tokens_per_pos_total``.

Malformed lines never abort a parse: they are counted and the first few are kept
with their line numbers; the rest of the payload still counts.
"""

from __future__ import annotations

import codecs
import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from . import config

_MAX_ISSUES_KEPT = 20  # detail kept per parse; the count is always exact
_SNIFF_BYTES = 4096

_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_RE = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\\n]|\\.)*)"[ \t]*(,?)')
_UNESCAPE_RE = re.compile(r"\\(.)")
_UNESCAPES = {"n": "\n", "\\": "\\", '"': '"'}
# Canonical lines (what prometheus_client and Go clients write: no blanks inside
# the braces, no escapes) take one regex; anything else goes to the careful path.
_FAST_LINE_RE = re.compile(
    r'([a-zA-Z_:][a-zA-Z0-9_:]*)'
    r'(?:\{((?:[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*"(?:,[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*")*)?),?\})?'
    r"[ \t]+([^ \t#]+)(?:[ \t]+([^ \t#]+))?[ \t]*(?:#.*)?"
)
_FAST_LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"')
# Wanted names are grouped by their first this many bytes (parse: _finder).
_PREFIX_BYTES = 10
# Long C-level scans go in steps of this many bytes (each well under a millisecond).
_STEP = 1 << 20
# First meaningful line of any exposition: a comment or a sample name.
_SNIFF_RE = re.compile(rb"[ \t]*(#|[a-zA-Z_:][a-zA-Z0-9_:]*[ \t{])")


class ParseError(ValueError):
    """The payload as a whole cannot be used (too big, not Prometheus text)."""


class PayloadTooLarge(ParseError):
    """``size`` is the real size when known (Content-Length, a file), else None:
    the body was cut off as soon as it passed the cap."""

    def __init__(self, size: int | None, cap: int, source: str | None = None):
        amount = f"{size:,} bytes" if size is not None else f"more than {cap:,} bytes"
        super().__init__(f"{source + ': ' if source else ''}payload is {amount}, over the {cap:,}-byte cap")
        self.size = size
        self.cap = cap


class NotPrometheusText(ParseError):
    pass


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


@dataclass(frozen=True, slots=True)
class LineIssue:
    line: int  # 1-based
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


@dataclass(slots=True)
class Exposition:
    """Samples by exact sample name, with what went wrong along the way."""

    samples: dict[str, list[Sample]] = field(default_factory=dict)
    malformed_lines: int = 0
    duplicate_series: int = 0
    issues: list[LineIssue] = field(default_factory=list)  # first few, with line numbers
    openmetrics: bool = False
    size: int = 0

    def issue_messages(self) -> list[str]:
        out = [str(i) for i in self.issues]
        hidden = self.malformed_lines + self.duplicate_series - len(self.issues)
        if hidden > 0:
            out.append(f"... and {hidden} more problem line(s)")
        return out


class _Malformed(Exception):
    pass


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return _UNESCAPE_RE.sub(lambda m: _UNESCAPES.get(m.group(1), "\\" + m.group(1)), value)


def _parse_float(token: str) -> float:
    # Go's ParseFloat forms (1.5e+06, +Inf, NaN); Python's float() also takes
    # "1_000" and "infinity" spellings that no exposition contains: refuse them.
    # float() also reads non-ASCII digits ('١٢'), which no exposition format allows.
    if "_" in token or not token or not token.isascii():
        raise _Malformed(f"bad value {token[:40]!r}")
    try:
        return float(token)
    except ValueError:
        raise _Malformed(f"bad value {token[:40]!r}") from None


def parse_sample_line(line: str, strings: dict[str, str] | None = None) -> Sample:
    """One sample line -> Sample, or _Malformed with the reason. With ``strings`` (one
    parse's table), names and label strings seen before are shared, not held again."""
    fast = _FAST_LINE_RE.fullmatch(line)
    if fast:
        name, body, value, timestamp = fast.groups()
        pairs = _FAST_LABEL_RE.findall(body) if body else []
        if strings is not None:
            name = strings.setdefault(name, name)
            pairs = [(strings.setdefault(k, k), strings.setdefault(v, v)) for k, v in pairs]
        labels: dict[str, str] = dict(pairs)
        if len(labels) == len(pairs):  # a repeated label name gets the careful path's error
            if timestamp is not None:
                _parse_float(timestamp)
            return Sample(name, labels, _parse_float(value))
    m = _NAME_RE.match(line)
    if not m:
        raise _Malformed("no metric name")
    name = m.group(0)
    pos = m.end()
    labels = {}
    if pos < len(line) and line[pos] == "{":
        pos += 1
        while True:
            while pos < len(line) and line[pos] in " \t":
                pos += 1
            if pos < len(line) and line[pos] == "}":
                pos += 1
                break
            lm = _LABEL_RE.match(line, pos)
            if not lm:
                raise _Malformed(f"bad label set in {name}")
            key = lm.group(1)
            if key in labels:
                raise _Malformed(f"label {key!r} repeated in {name}")
            labels[key] = _unescape(lm.group(2))
            pos = lm.end()
            if not lm.group(3):  # no comma: the set must close here
                while pos < len(line) and line[pos] in " \t":
                    pos += 1
                if pos >= len(line) or line[pos] != "}":
                    raise _Malformed(f"unterminated label set in {name}")
                pos += 1
                break
    rest = line[pos:]
    if not rest or rest[0] not in " \t":
        raise _Malformed(f"no value after {name}")
    # value [timestamp] [# exemplar (OpenMetrics)]
    fields = rest.split("#", 1)[0].split()
    if not fields or len(fields) > 2:
        raise _Malformed(f"expected 'value [timestamp]' after {name}")
    value = _parse_float(fields[0])
    if len(fields) == 2:
        _parse_float(fields[1])
    return Sample(name, labels, value)


def _check_payload(data: bytes, max_bytes: int) -> None:
    if len(data) > max_bytes:
        raise PayloadTooLarge(len(data), max_bytes)
    head = data[:_SNIFF_BYTES]
    if not head.strip():
        raise NotPrometheusText("empty payload")
    if b"\x00" in head:
        raise NotPrometheusText("binary data, not Prometheus text")
    stripped = head.lstrip()
    if stripped[:1] == b"<":
        raise NotPrometheusText("HTML or XML, not Prometheus text (an error page?)")
    if not _SNIFF_RE.match(stripped):
        first = stripped.split(b"\n", 1)[0][:60].decode("utf-8", "replace")
        raise NotPrometheusText(f"not Prometheus text: first line starts {first!r}")
    # Both formats are UTF-8 by definition; anything else (Latin-1, UTF-16, random
    # bytes after a text-like start) is not Prometheus text. C speed: ~10 ms for 32 MiB.
    # In 1 MiB steps: one C call over 32 MiB would hold the GIL for ~100 ms, stalling
    # the event loop while this runs in the parsing thread.
    decoder = codecs.getincrementaldecoder("utf-8")()
    for start in range(0, len(data), _STEP):
        try:
            decoder.decode(data[start : start + _STEP], final=start + _STEP >= len(data))
        except UnicodeDecodeError as e:
            at = start + e.start
            line = data.count(b"\n", 0, at) + 1
            raise NotPrometheusText(f"not Prometheus text: not valid UTF-8 (line {line}, byte {at})") from None


def _record(exp: Exposition, data: bytes, pos: int, message: str) -> None:
    if len(exp.issues) < _MAX_ISSUES_KEPT:
        # Cut: a message quotes the line's labels, which the payload chooses.
        exp.issues.append(LineIssue(data.count(b"\n", 0, pos) + 1, message[: 2 * config.MAX_WARNING_CHARS]))


def _add_line(exp: Exposition, seen: set[int], strings: dict[str, str], data: bytes, start: int, end: int) -> None:
    raw = data[start:end]
    try:
        sample = parse_sample_line(raw.decode("utf-8").strip(), strings)
    except UnicodeDecodeError:
        exp.malformed_lines += 1
        _record(exp, data, start, "not valid UTF-8")
        return
    except _Malformed as e:
        exp.malformed_lines += 1
        _record(exp, data, start, str(e))
        return
    # A series is remembered by its hash (Python's keyed 64-bit SipHash), not its strings:
    # ~60 bytes a series instead of ~450. Two series colliding (~1e-8 for 600,000 series)
    # would be reported as a duplicate, never merged silently.
    key = hash((sample.name, frozenset(sample.labels.items())))
    if key in seen:
        exp.duplicate_series += 1
        _record(exp, data, start, f"duplicate series {format_series(sample.name, sample.labels)} (first value kept)")
        return
    seen.add(key)
    exp.samples.setdefault(sample.name, []).append(sample)


def _find(data: bytes, needle: bytes, start: int) -> int:
    """data.find in _STEP slices, so the parsing thread lets go of the GIL in between."""
    while start < len(data):
        pos = data.find(needle, start, start + _STEP + len(needle))
        if pos != -1:
            return pos
        start += _STEP
    return -1


def _find_eof(data: bytes) -> int:
    """Offset of the first line that is exactly '# EOF' (blanks and CR allowed around), or -1."""
    pos = 0 if data.startswith(b"# EOF") else _find(data, b"\n# EOF", 0)
    while pos != -1:
        start = pos if data.startswith(b"# EOF", pos) else pos + 1
        end = data.find(b"\n", start)
        if data[start : len(data) if end == -1 else end].strip() == b"# EOF":
            return start
        pos = _find(data, b"\n# EOF", start + 5)
    return -1


def _end_of(data: bytes, start: int, limit: int) -> int:
    end = data.find(b"\n", start, limit)
    return limit if end == -1 else end


# Every name an adapter reads holds one of these (a name that holds none is its own anchor):
# one bytes.find pass per anchor, at C speed, finds every line that may hold a wanted name,
# whatever the number of producers and names (a pass per name prefix cost ~13 line counts;
# longer anchors skip faster: b"spec_decode_" scans in ~0.55 line counts, b"spec_" in ~1).
_ANCHORS = (b"spec_decode_", b"sglang:spec_", b"generation_tokens_total")


@functools.lru_cache(maxsize=32)
def _finder(wanted: frozenset[str]) -> tuple[tuple[bytes, ...], dict[bytes, tuple[bytes, ...]]]:
    """The anchors to look for, and the wanted names by their first _PREFIX_BYTES."""
    groups: dict[bytes, list[bytes]] = {}
    anchors: dict[bytes, None] = {}
    for name in sorted(wanted):
        needle = name.encode()
        groups.setdefault(needle[:_PREFIX_BYTES], []).append(needle)
        anchors[next((a for a in _ANCHORS if a in needle), needle)] = None
    return tuple(anchors), {k: tuple(v) for k, v in groups.items()}


def parse(
    data: bytes | str,
    wanted: Iterable[str] | None = None,
    max_bytes: int = config.DEFAULT_MAX_PAYLOAD_BYTES,
) -> Exposition:
    """Parse an exposition; with ``wanted``, only samples with those exact names."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    _check_payload(data, max_bytes)
    exp = Exposition(size=len(data))
    seen: set[int] = set()  # the series read (_add_line)
    strings: dict[str, str] = {}  # names and label strings, each held once (a payload repeats them per line)

    # OpenMetrics ends at the first "# EOF" line, wherever it is; a sample after it
    # is not part of the exposition (bytes.find: ~1 ms per MB).
    limit = len(data)
    eof = _find_eof(data)
    if eof != -1:
        exp.openmetrics = True
        if data[eof + 5 :].strip():
            exp.malformed_lines += 1
            _record(exp, data, eof, "content after '# EOF' ignored")
        limit = eof
    elif not data.endswith(b"\n"):
        # A payload cut mid-line: its last line may parse as a wrong number
        # (1.561637e+06 cut to 1.5616), so it is never read.
        exp.malformed_lines += 1
        limit = data.rfind(b"\n") + 1
        _record(exp, data, limit, "payload ends mid-line (truncated?); its last line ignored")

    if wanted is None:
        pos = 0
        while pos < limit:
            end = _end_of(data, pos, limit)
            line = data[pos:end].strip()
            if line and not line.startswith(b"#"):
                _add_line(exp, seen, strings, data, pos, end)
            pos = end + 1
        return exp

    # One bytes.find pass per shared prefix (e.g. b"vllm:spec_" for all four
    # spec-decode families), then an exact-name check on each line found.
    anchors, groups = _finder(frozenset(wanted))
    done: set[int] = set()  # line starts already read (a line may hold two anchors)
    for anchor in anchors:
        pos = data.find(anchor, 0, limit)
        while pos != -1:
            start = data.rfind(b"\n", 0, pos) + 1
            end = _end_of(data, pos, limit)
            if start not in done:
                done.add(start)
                for needle in groups.get(data[start : start + _PREFIX_BYTES], ()):
                    after = start + len(needle)
                    if data.startswith(needle, start, end) and data[after : after + 1] in (b"{", b" ", b"\t"):
                        _add_line(exp, seen, strings, data, start, end)
                        break
            pos = data.find(anchor, end, limit)
    return exp


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def format_series(name: str, labels: dict[str, str]) -> str:
    """name{k="v",...} escaped as on the wire, so it always fits on one line."""
    if not labels:
        return name
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
    return f"{name}{{{body}}}"
