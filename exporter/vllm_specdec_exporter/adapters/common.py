"""What several adapters share: the bounds every sample read must meet, engine
identity from labels, and the frame of the adapters that read their own families."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping

from .. import config
from ..model import SeriesKey
from ..parser import Exposition, ParseError, Sample, format_series

# Wrappers add labels that tell their replicas/workers apart: each distinct value is
# its own engine, never merged with another (Ray Serve: ReplicaId, or WorkerId before
# vLLM added ReplicaId; Dynamo: worker_id).
RAY_IDENTITY = ("ReplicaId", "WorkerId")
DYNAMO_IDENTITY = ("worker_id",)
# Dynamo passes engine metrics through and adds these; any of them on a spec-decode
# sample means "served through Dynamo".
DYNAMO_LABELS = ("worker_id", "dynamo_namespace", "dynamo_component", "dynamo_endpoint")


def short(sample: Sample) -> str:
    """The series as on the wire, cut so that a hostile label cannot flood the log."""
    text = format_series(sample.name, sample.labels)
    return text if len(text) <= 300 else text[:300] + "...}"


def bounded(sample: Sample, key: SeriesKey, warnings: list[str], impossible: list[str] | None = None) -> bool:
    """The one check every adapter makes on each counter sample it reads, whatever
    the producer: a value no counter can hold (negative, non-finite, or above
    MAX_COUNTER_VALUE, where a float stops counting by one and sums over engines can
    overflow) is refused and, with ``impossible``, counted as an invariant violation;
    a model/engine label value (``key``) over MAX_LABEL_VALUE_LENGTH is refused."""
    if not (math.isfinite(sample.value) and 0 <= sample.value <= config.MAX_COUNTER_VALUE):
        warnings.append(f"{short(sample)} is {sample.value:g}, not a counter value; ignored")
        if impossible is not None:
            impossible.append(warnings[-1])
        return False
    if max(len(key[0]), len(key[1])) > config.MAX_LABEL_VALUE_LENGTH:
        warnings.append(f"{short(sample)} has a label value over {config.MAX_LABEL_VALUE_LENGTH} characters; ignored")
        return False
    return True


def positions(
    samples: Iterable[Sample], label: str, key: Callable[[Sample], SeriesKey], warnings: list[str], impossible: list[str]
) -> tuple[dict[SeriesKey, dict[int, float]], set[SeriesKey]]:
    """Per engine (``key``), each draft position's value: the position ``label`` an integer
    below MAX_K, the one limit on k whatever the producer, so positions per engine stay bounded.
    Also the engines that had a position beyond it (ignored here: for a producer whose totals are
    the positions' sums, those engines' figures would miss them)."""
    out: dict[SeriesKey, dict[int, float]] = {}
    beyond: set[SeriesKey] = set()
    for s in samples:
        raw = s.labels.get(label, "")
        # ASCII digits only: str.isdigit() also accepts '²', which int() refuses.
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 4):
            warnings.append(f"{short(s)} has no integer {label} label; ignored")
            continue
        k = key(s)
        if int(raw) >= config.MAX_K:
            warnings.append(f"{short(s)}: {label} {int(raw)} is beyond the largest k={config.MAX_K}; ignored")
            beyond.add(k)
            continue
        if not bounded(s, k, warnings, impossible):
            continue
        per = out.setdefault(k, {})
        if int(raw) in per:
            warnings.append(f"{short(s)} repeats a position; first value kept")
            continue
        per[int(raw)] = s.value
    return out, beyond


def engine_id(labels: Mapping[str, str], identity: Iterable[str] = (), engine: str | None = config.LABEL_ENGINE) -> str:
    """'<replica or worker>/<engine>' from the labels present; '0' when none (one engine)."""
    parts = [labels[n] for n in identity if n in labels][:1]
    if engine and engine in labels:
        parts.append(labels[engine])
    return "/".join(parts) if parts else "0"


def present(exp: Exposition, names: Iterable[str]) -> bool:
    return any(exp.samples.get(n) for n in names)


def families_present(exp: Exposition, names: Iterable[str], labels: Iterable[str] = ()) -> int:
    """How many of ``names`` have samples (with ``labels``: samples carrying one of them):
    how strongly a payload looks like a producer's, so one stray family never outweighs
    a producer's full set (adapters.ranked)."""
    marks = frozenset(labels)
    if not marks:
        return sum(1 for n in names if exp.samples.get(n))
    # isdisjoint: one C call per sample. The Dynamo adapters look at every sample of a plain
    # vLLM payload (none carries their labels): a generator per sample made the ranking 2x dearer.
    return sum(1 for n in names if any(not marks.isdisjoint(s.labels) for s in exp.samples.get(n, ())))


class UnsupportedProducer(ParseError):
    """The producer was recognised, but its metrics cannot give honest figures."""

    def __init__(self, producer: str, message: str):
        super().__init__(message)
        self.producer = producer


class LabelledAdapter:
    """The frame of the adapters that read a producer's own families (TensorRT-LLM,
    SGLang): the producer's name, labels that make separate engines (Dynamo's
    worker_id), and labels a payload must carry for this adapter to claim it."""

    default_name = ""
    spec_families: tuple[str, ...] = ()

    def __init__(self, name: str = "", identity: tuple[str, ...] = (), require_labels: tuple[str, ...] = ()):
        self.name = name or self.default_name
        self._identity = identity
        self._require_labels = require_labels

    def _key(self, s: Sample) -> SeriesKey:
        # No engine label: these producers count per server (or per worker, by identity).
        return (s.labels.get(config.LABEL_MODEL, ""), engine_id(s.labels, self._identity, engine=None))

    def score(self, exp: Exposition) -> int:
        return families_present(exp, self.spec_families, self._require_labels)

    def detect(self, exp: Exposition) -> bool:
        return self.score(exp) > 0
