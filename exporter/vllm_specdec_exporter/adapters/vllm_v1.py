"""vLLM V1 (>= 0.9): the four spec_decode counters plus generation tokens."""

from __future__ import annotations

import math
from collections.abc import Iterable

from .. import config
from ..model import Counters, RequestHistogram, SeriesKey, Snapshot, series_name
from ..parser import Exposition, Sample
from .common import bounded, positions, short

_TOTALS = (config.VLLM_V1_DRAFTS, config.VLLM_V1_DRAFT_TOKENS, config.VLLM_V1_ACCEPTED)


def _key(sample: Sample) -> SeriesKey:
    return (sample.labels.get(config.LABEL_MODEL, ""), sample.labels.get(config.LABEL_ENGINE, ""))


def _collect(
    samples: Iterable[Sample],
    warnings: list[str],
    impossible: list[str] | None = None,
) -> dict[SeriesKey, float]:
    out: dict[SeriesKey, float] = {}
    for s in samples:
        key = _key(s)
        if not bounded(s, key, warnings, impossible):
            continue
        if key in out:  # same model/engine under extra labels: refuse to guess
            warnings.append(f"{short(s)} repeats ({series_name(key)}); first value kept")
            continue
        out[key] = s.value
    return out


def _histograms(exp: Exposition, warnings: list[str]) -> tuple[dict[SeriesKey, RequestHistogram], str | None]:
    """The per-request acceptance histogram per engine, when vLLM exposes it (PR #44487),
    and the family name it was read under (either of config.VLLM_V1_REQUEST_ACCEPTANCE_NAMES).

    Optional: an engine whose buckets are malformed just has none (a warning says why);
    its counters and every other figure are unaffected.
    """
    present = [n for n in config.VLLM_V1_REQUEST_ACCEPTANCE_NAMES if exp.samples.get(n + "_bucket")]
    if not present:
        return {}, None
    name = present[0]
    if len(present) > 1:
        warnings.append(f"both {' and '.join(present)} are present; {name} read")
    counts = _collect(exp.samples.get(name + "_count", ()), warnings)
    buckets: dict[SeriesKey, dict[float, float]] = {}
    for s in exp.samples.get(name + "_bucket", ()):
        try:
            edge = float(s.labels.get("le", ""))
        except ValueError:
            warnings.append(f"{short(s)} has no numeric le label; ignored")
            continue
        key = _key(s)
        if bounded(s, key, warnings) and not math.isnan(edge):
            buckets.setdefault(key, {}).setdefault(edge, s.value)
    out: dict[SeriesKey, RequestHistogram] = {}
    for key, by_edge in buckets.items():
        if len(by_edge) > config.MAX_REQUEST_HISTOGRAM_BUCKETS:
            warnings.append(
                f"{series_name(key)}: {name} has {len(by_edge):,} buckets, over {config.MAX_REQUEST_HISTOGRAM_BUCKETS}; "
                "per-request acceptance left out"
            )
            continue
        edges = tuple(sorted(e for e in by_edge if math.isfinite(e)))
        cumulative = tuple(by_edge[e] for e in edges)
        count = counts.get(key, by_edge.get(math.inf))
        if count is None or not edges or any(a > b for a, b in zip(cumulative, (*cumulative[1:], count), strict=True)):
            warnings.append(
                f"{series_name(key)}: {name} buckets are not cumulative or have no count; per-request acceptance left out"
            )
            continue
        out[key] = RequestHistogram(edges, cumulative, count)
    return out, name


class VllmV1Adapter:
    name = "vllm-v1"
    spec_families = (*_TOTALS, config.VLLM_V1_ACCEPTED_PER_POS)
    families = (
        *spec_families,
        config.VLLM_V1_DRAFTS_CREATED,
        config.VLLM_V1_GENERATION_TOKENS,
        *(n + suffix for n in config.VLLM_V1_REQUEST_ACCEPTANCE_NAMES for suffix in ("_bucket", "_count")),
    )

    def generation_tokens(self, exp: Exposition) -> dict[SeriesKey, float]:
        return _collect(exp.samples.get(config.VLLM_V1_GENERATION_TOKENS, ()), [])

    def snapshot(self, exp: Exposition) -> Snapshot | None:
        if not any(exp.samples.get(n) for n in self.spec_families):
            return None
        warnings: list[str] = []
        impossible: list[str] = []  # values no counter can hold: invariant violations
        totals = [_collect(exp.samples.get(n, ()), warnings, impossible) for n in _TOTALS]
        generation = _collect(exp.samples.get(config.VLLM_V1_GENERATION_TOKENS, ()), warnings, impossible)

        # A position beyond MAX_K is a bad series of its own: the engine's totals are its own counters.
        per_pos, _ = positions(
            exp.samples.get(config.VLLM_V1_ACCEPTED_PER_POS, ()), config.LABEL_POSITION, _key, warnings, impossible
        )
        histograms, histogram_family = _histograms(exp, warnings)
        started = _collect(exp.samples.get(config.VLLM_V1_DRAFTS_CREATED, ()), warnings)
        # vLLM creates all k position series at start-up; the lazy Rust frontend
        # creates them on first acceptance. Either way, once the family exists an
        # engine without it was cut off (truncated or partial scrape); so is every engine
        # of a payload cut at max_samples (prometheus_client writes the positions last:
        # a cut before them read every engine as k=0).
        positions_expected = bool(exp.samples.get(config.VLLM_V1_ACCEPTED_PER_POS)) or exp.cut_at is not None
        engines: dict[SeriesKey, Counters] = {}
        keys = set().union(*totals, per_pos)
        for key in sorted(keys):  # label values are strings: any of them sorts
            missing = [n for n, values in zip(_TOTALS, totals, strict=True) if key not in values]

            if missing:
                warnings.append(f"{series_name(key)}: missing {', '.join(missing)}; engine left out")
                continue
            pos = per_pos.get(key, {})
            if not pos and positions_expected:
                warnings.append(f"{series_name(key)}: no {config.VLLM_V1_ACCEPTED_PER_POS}; engine left out")
                continue
            if sorted(pos) != list(range(len(pos))):
                warnings.append(f"{series_name(key)}: positions {sorted(pos)} are not 0..k-1; engine left out")
                continue
            engines[key] = Counters(
                drafts=totals[0][key],
                draft_tokens=totals[1][key],
                accepted=totals[2][key],
                per_position=tuple(pos[i] for i in range(len(pos))),
                generation_tokens=generation.get(key),
                request_acceptance=histograms.get(key),
                started=started.get(key),
            )
        return Snapshot(
            producer=self.name,
            engines=engines,
            warnings=tuple(warnings) + tuple(exp.issue_messages()),
            malformed_lines=exp.malformed_lines,
            duplicate_series=exp.duplicate_series,
            impossible_values=len(impossible),
            request_acceptance_family=histogram_family if histograms else None,
        )


ADAPTER = VllmV1Adapter()
