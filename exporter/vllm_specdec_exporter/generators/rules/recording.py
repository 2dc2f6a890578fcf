"""Recording rules: the rates and ratios per level and window, k and the baseline per server (the
vllm-direct variant's baseline profiles as rules), the model's healthy reference per k and its
day's best, and the pruning of what no rule reads per server.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from ... import config as c
from ... import durations
from ... import metrics as m
from ...model import BaselineProfile
from ...settings import default_profiles
from .options import (
    DAY,
    DIRECT,
    ENGINE,
    ENGINE_RATES,
    K_LABEL,
    K_LEVEL,
    K_SERVER,
    MODEL_LEVEL,
    SERVER,
    SIDECAR,
    Options,
    Rule,
    Source,
    base_window,
    by,
    levels,
    long_windows,
    minus,
    name,
    selector_of,
    young,
)
from .references import references


def _model_regex(profile: BaselineProfile, o: Options, index: int) -> str:
    """A profile's Python regex (re.search) as an anchored RE2 for =~, plus the served
    names that are aliases of a model it matches."""
    pattern = profile.model.pattern
    body = f"(?i:.*{pattern[4:]}.*)" if pattern.startswith("(?i)") else f".*(?:{pattern}).*"
    served = [re.escape(s) for s, model in o.aliases if profile.model.search(model)]
    return "|".join([body, *served]) + (alias_placeholder(index) if o.alias_placeholders else "")


def alias_placeholder(index: int) -> str:
    return f"__ALIASES_{index}__"


def baseline_expr(src: Source, o: Options, by_labels: Iterable[str]) -> str:
    if src is SIDECAR:
        return f"max by ({by(by_labels)}) ({m.name('baseline_mean_acceptance_length')}{selector_of(o)})"
    # vllm-direct: the shipped profiles as rules, keyed by model regex and k; first match wins.
    k = name(c.ALERT_LEVEL, "num_speculative_tokens", "max")
    profiles = o.profiles or tuple(default_profiles())
    clauses = [
        f"label_replace({p.mean_acceptance_length:g} + 0 * ({k}{{{c.LABEL_MODEL}=~`{_model_regex(p, o, i)}`}} "
        f'== {p.k}), "profile", "{p.name}", "", "")'
        for i, p in enumerate(profiles)
    ]
    return f"\n  or on({by(by_labels)}) ".join(clauses)


def recording_rules(src: Source, o: Options) -> tuple[list[Rule], list[Rule]]:
    """(the evaluation-interval group, the long group). Fleet scale (docs/scale.md): only the
    shortest window reads the raw counters; a longer window w is the mean of the shortest
    window's recorded rates over w minus that window (so it spans w), taken per server (and
    position) after the engines are summed, and per engine nothing but the shortest window is
    kept. The hourly window, the day-long series and the day's range of k are recorded in the
    long group, so the `[1d]` reads see a sample every few minutes, not every evaluation."""
    fast: list[Rule] = []
    slow: list[Rule] = []

    def record(to: list[Rule], record: str, expr: str) -> None:
        to.append({"record": record, "expr": expr})

    sel = selector_of(o)
    counters = {
        "drafts": src.drafts,
        "draft_tokens": src.draft_tokens,
        "accepted_tokens": src.accepted,
        "generation_tokens": src.generation,
    }
    lv = levels(src, o)
    base, long = base_window(o), long_windows(o)
    for w in o.windows:
        to = slow if w in long else fast
        rng = o.range(w)
        span = minus(rng, o.range(base)) if w != base else ""
        if span and durations.parse_duration(span) <= 0:
            span = ""
        # A longer window at every level is the mean of that level's own shortest-window rates:
        # a namespace reads its few series, not every server's (docs/scale.md).
        from_base = bool(span)
        finer: str | None = None  # the level just recorded, which the next one sums
        for level, labels in lv:
            if from_base and level == ENGINE:
                continue  # per engine: the shortest window only (the engine panel averages it)
            for metric, counter in counters.items():
                if level == ENGINE and metric not in ENGINE_RATES:
                    continue
                dest = slow if metric == LONG_GROUP_RATE else to
                if from_base:
                    record(dest, name(level, metric, f"rate{w}"), f"avg_over_time({name(level, metric, f'rate{base}')}[{span}])")
                    continue
                if finer is None or (finer == ENGINE and metric not in ENGINE_RATES):
                    source = f"rate({counter}{sel}[{rng}])"
                else:
                    source = name(finer, metric, f"rate{w}")
                record(dest, name(level, metric, f"rate{w}"), f"sum by ({by(labels)}) ({source})")
            if level != ENGINE:
                # Positions are not kept per engine: the first level below reads the counters. The drafts they
                # are divided by are read with them ("position_drafts"): divided by drafts read at another time,
                # a pod's first minutes read over 1 and an hour of bursts weighed the positions' samples apart.
                # Every window's in the long group: the raw per-position read is the costliest of an evaluation
                # (every engine's positions, docs/scale.md), no alert reading them judges faster than its 15m
                # `for`, and a longer window's mean changes only when the group adds a sample.
                # The accepted tokens are read with them too, for the ratios over the draft tokens (LONG_GROUP_RATE):
                # over the 30 s group's, read up to an evaluation apart, a first window read 0.72 for 0.81 (test_rules).
                for metric, counter, position in (
                    ("position_accepted_tokens", src.per_pos, ", position"),
                    ("position_drafts", src.drafts, ""),
                    (LONG_GROUP_ACCEPTED, src.accepted, ""),
                ):
                    if from_base:
                        record(
                            slow, name(level, metric, f"rate{w}"), f"avg_over_time({name(level, metric, f'rate{base}')}[{span}])"
                        )
                        continue
                    source = (
                        f"rate({counter}{sel}[{rng}])" if finer is None or finer == ENGINE else name(finer, metric, f"rate{w}")
                    )
                    record(slow, name(level, metric, f"rate{w}"), f"sum by ({by(labels)}{position}) ({source})")
            drafts = name(level, "drafts", f"rate{w}")
            accepted = name(level, "accepted_tokens", f"rate{w}")
            if level == ENGINE:
                # No ratio per engine: the engine alerts divide the two rates themselves (one join
                # each, not a recorded ratio read three times: docs/scale.md).
                finer = level
                continue
            # Dividing by "(x > 0)" leaves no sample, not NaN, when there were no drafts.
            record(to, name(level, "mean_acceptance_length", f"ratio_rate{w}"), f"1 + {accepted} / ({drafts} > 0)")
            # The two ratios over the draft tokens (LONG_GROUP_RATE), in its group, over the rates read with them.
            with_long = name(level, LONG_GROUP_ACCEPTED, f"rate{w}")
            record(
                slow,
                name(level, "acceptance_ratio", f"ratio_rate{w}"),
                f"{with_long} / ({name(level, 'draft_tokens', f'rate{w}')} > 0)",
            )
            record(
                slow,
                name(level, "position_acceptance_ratio", f"ratio_rate{w}"),
                f"{name(level, 'position_accepted_tokens', f'rate{w}')} / ignoring(position) group_left() "
                f"({name(level, 'position_drafts', f'rate{w}')} > 0)",
            )
            record(
                slow,
                name(level, "effective_draft_length", f"ratio_rate{w}"),
                f"{name(level, 'draft_tokens', f'rate{w}')} / ({name(level, 'position_drafts', f'rate{w}')} > 0)",
            )
            record(
                to,
                name(level, "draft_token_share", f"ratio_rate{w}"),
                f"{accepted} / ({name(level, 'generation_tokens', f'rate{w}')} > 0)",
            )
            if level != SERVER:
                # Only where the dashboards read them (a clause per position each): not per server.
                record(slow, name(level, "position_conditional_acceptance_ratio", f"ratio_rate{w}"), _conditional(level, w))
                record(slow, name(level, "acceptance_count_ratio", f"ratio_rate{w}"), _count_distribution(level, w))
            finer = level

    # k and the baseline, per server (the alert level).
    level, labels = c.ALERT_LEVEL, dict(lv)[c.ALERT_LEVEL]
    if src is SIDECAR:
        k_expr = f"max by ({by(labels)}) ({m.name('num_speculative_tokens')}{sel})"
    else:
        # k = the number of distinct positions an engine reports (grouped first: a pod scraped by
        # two jobs has each position twice).
        eng = f"{by(labels)}, instance, {c.LABEL_ENGINE}"
        k_expr = f"max by ({by(labels)}) (\n  count by ({eng}) (group by ({eng}, position) ({src.per_pos}{sel}))\n)"
    # k and the baseline change with a restart at most: recorded in the long group, they cost a
    # sixth (vLLM-direct counts every engine's position series) and are up to its interval late.
    k = name(level, "num_speculative_tokens", "max")
    record(slow, k, k_expr)
    record(slow, name(level, "baseline_mean_acceptance_length", "max"), baseline_expr(src, o, labels))
    # The healthy reference, kept per namespace and model (MODEL_LEVEL), never per pod: a rolling
    # update replaces every pod, and a broken rollout's new pods must still be compared with
    # their predecessors' history. Each is the best hour of the day (max_over_time of the hourly
    # rates, recorded here every few minutes): a fault only lowers hours, so the reference stays
    # healthy for as long as a healthy hour is within the day.
    hw, ml, mlabels = o.hourly_window, MODEL_LEVEL, dict(lv)[MODEL_LEVEL]
    # Each server's k as a label, so that the reference is kept per k: AL moves with k, and a k
    # change starts a new history instead of blinding the comparison for a day. A server whose k
    # changed within the hour adds nothing to that hour.
    k_label = name(K_SERVER, "num_speculative_tokens", "count_values")
    record(slow, k_label, f'count_values by ({by(labels)}) ("{K_LABEL}", {k})')
    # Only full hours count (k recorded at nine tenths of this group's evaluations over the hour:
    # a younger pod's "hour" is shorter, a warm-up's), at production traffic.
    rng = o.range(hw)

    def per_k(rate: str, servers: str) -> str:
        """A model's ``rate`` (a per-server series) at each k, summed over ``servers`` (a recorded set
        of servers with their k as a label)."""
        return f"sum by ({by(mlabels)}, {K_LABEL}) ({rate} * on({by(labels)}) group_left({K_LABEL}) ({servers}))"

    def hourly(metric: str) -> str:
        return name(level, metric, f"rate{hw}")

    at_k = name(K_LEVEL, "mean_acceptance_length", f"ratio_rate{hw}")
    floor = o.thresholds["reference_min_drafts_per_second"]
    sw = o.range(c.ALERT_SHIFT_WINDOW)
    # The settled servers (the reference's) and a rollout's newcomers (AcceptanceShifted's): each
    # set recorded once, its k as a label, and read by every rule below that sums over it, so that
    # which servers are young (each server's k over the hour) is worked out once an evaluation.
    settled = name(K_SERVER, "settled_num_speculative_tokens", "count_values")
    record(slow, settled, f"{k_label} unless on({by(labels)}) ({young(o, rng)})")
    newcomers = name(K_SERVER, "newcomer_num_speculative_tokens", "count_values")
    record(slow, newcomers, f"{k_label} and on({by(labels)}) ({young(o, rng)}) unless on({by(labels)}) ({young(o, sw)})")
    record(slow, at_k, f"1 + {per_k(hourly('accepted_tokens'), settled)}\n  / ({per_k(hourly('drafts'), settled)} >= {floor})")
    # A rollout's newcomers (AcceptanceShifted): the servers the reference leaves out, once their k
    # has held for the whole shift window (no warm-up, no blend of two k), against the settled
    # servers over the same window at the same time, per k. Each a mean of 5m rates, as the longer
    # windows are, at the traffic floor that judges, with their drafts (over the window, and now:
    # the alert weighs the two sides' traffic). And the settled figure at the reference floor,
    # which the newcomers meet once the settled servers no longer serve alongside them.

    def recent(metric: str) -> str:
        return f"avg_over_time({name(level, metric, f'rate{base}')}[{minus(sw, o.range(base))}])"

    shift = c.ALERT_SHIFT_WINDOW
    for who, servers in (("settled", settled), ("newcomers", newcomers)):
        drafts_at_k = name(K_LEVEL, f"{who}_drafts", f"rate{shift}")
        record(slow, drafts_at_k, per_k(recent("drafts"), servers))
        # Now (over the shortest window): whether the settled servers still serve beside the
        # newcomers follows a blue/green switch within minutes, not the shift window's mean.
        record(slow, name(K_LEVEL, f"{who}_drafts", f"rate{base}"), per_k(name(level, "drafts", f"rate{base}"), servers))
        record(
            slow,
            name(K_LEVEL, f"{who}_mean_acceptance_length", f"ratio_rate{shift}"),
            f"1 + {per_k(recent('accepted_tokens'), servers)}\n  / ({drafts_at_k} >= {o.thresholds['min_drafts_per_second']})",
        )
    record(
        slow,
        name(K_LEVEL, "settled_reference_mean_acceptance_length", f"ratio_rate{shift}"),
        f"{name(K_LEVEL, 'settled_mean_acceptance_length', f'ratio_rate{shift}')}\n"
        f"  and on({by(mlabels)}, {K_LABEL}) {name(K_LEVEL, 'settled_drafts', f'rate{shift}')} >= {floor}",
    )
    record(slow, name(K_LEVEL, "mean_acceptance_length", f"max_over_time{DAY}"), f"max_over_time({at_k}[{o.day_range}])")
    # Whether the model was drafting (NotDrafting), its position 0 healthy (FirstPositionAcceptanceLow)
    # and its chain past position 0 healthy (DraftChainBroken) within the day: position 0 and the
    # conditional acceptance of position 1 do not depend on k.
    record(slow, name(ml, "drafts", f"max_over_time{DAY}"), f"max_over_time({name(ml, 'drafts', f'rate{hw}')}[{o.day_range}])")
    # Both from the model's best server over a full hour at production traffic (as AL at k above),
    # not a blend: a busy server whose chain is broken from the start, with 30 % of the drafts,
    # held a blend at 0.527 beside a healthy server's 0.71, under the gate (2 x the floor), and
    # kept its own alert shut. And not a pod's first minutes: a handful of drafts whose ratio was
    # the whole "hour" recorded a position 0 acceptance of 1.04 in the e2e stack, kept for the day.
    # A server without a position 1 (k=1) has no conditional at all.
    pos = name(SERVER, "position_accepted_tokens", f"rate{hw}")
    reference = f"on({by(labels)}) ({name(SERVER, 'drafts', f'rate{hw}')} >= {floor}) unless on({by(labels)}) ({young(o, rng)})"
    p0 = name(ml, "position0_acceptance_ratio", f"ratio_rate{hw}")
    record(
        slow,
        p0,
        f'max by ({by(mlabels)}, position) (\n  {name(SERVER, "position_acceptance_ratio", f"ratio_rate{hw}")}{{position="0"}}\n'
        f"  and {reference}\n)",
    )
    record(slow, name(ml, "position_acceptance_ratio", f"max_over_time{DAY}"), f"max_over_time({p0}[{o.day_range}])")
    chain = name(ml, "position1_conditional_acceptance_ratio", f"ratio_rate{hw}")
    record(
        slow,
        chain,
        f'max by ({by(mlabels)}) (\n  max without(position) ({pos}{{position="1"}})\n'
        f'    / on({by(labels)}) (max without(position) ({pos}{{position="0"}}) > 0)\n'
        f"  and {reference}\n)",
    )
    record(
        slow, name(ml, "position1_conditional_acceptance_ratio", f"max_over_time{DAY}"), f"max_over_time({chain}[{o.day_range}])"
    )
    _capacity(record, fast, slow, o, lv, k, k_label)
    if src is DIRECT:
        # vLLM's per-request histogram over the request-extremes window (the sidecar has gauges).
        w, rng = o.request_extremes_window, o.range(o.request_extremes_window)
        for metric, suffix, edge in (
            ("requests_finished", "_count", ""),
            ("requests_acceptance_le_low", "_bucket", f"{c.REQUEST_ACCEPTANCE_LOW:g}"),
            ("requests_acceptance_le_high", "_bucket", f"{c.REQUEST_ACCEPTANCE_HIGH:g}"),
        ):
            bsel = selector_of(o, f'le="{edge}"') if edge else sel
            # Both names vLLM may use (config.VLLM_V1_REQUEST_ACCEPTANCE_NAMES); the first wins when both are there.
            either = " or ".join(f"rate({n}{suffix}{bsel}[{rng}])" for n in c.VLLM_V1_REQUEST_ACCEPTANCE_NAMES)
            record(slow, name(level, metric, f"rate{w}"), f"sum by ({by(labels)}) ({either})")
    return fast, slow


# Recorded every long-group interval at every window, with the acceptance ratio and effective draft length
# over it (issue 35): the raw read was among the costliest of a 30 s evaluation (docs/scale.md), and no page
# reads it (those panels step at that interval). Not the generation tokens: NotDrafting reads them per
# server, and a record of the long group outlives a removed pod's drafts by up to its interval, which
# would set it pending on every pod a rollout removes.
LONG_GROUP_RATE = "draft_tokens"
LONG_GROUP_ACCEPTED = "long_group_accepted_tokens"

# What a head costs, kept per server although no rule reads it (the on-call page and the dashboard do).
COST_PER_SERVER = ("decode_step_factor", "decode_steps_wasted", "healthy_output_tokens")


def _capacity(
    record: Callable[[list[Rule], str, str], None],
    fast: list[Rule],
    slow: list[Rule],
    o: Options,
    lv: list[tuple[str, tuple[str, ...]]],
    k: str,
    k_label: str,
) -> None:
    """What a head costs in decode steps (capacity.py, issue 34), per server and per model, over the
    shortest window, against the healthy reference: the profile where one matches, otherwise the
    model's best hour of the day at the server's k. No reference, no figure (never a fake 1)."""
    labels, mlabels, w = dict(lv)[SERVER], dict(lv)[MODEL_LEVEL], base_window(o)
    baseline = name(SERVER, "baseline_mean_acceptance_length", "max")
    best = name(K_LEVEL, "mean_acceptance_length", f"max_over_time{DAY}")
    healthy = name(SERVER, "healthy_mean_acceptance_length", "max")
    record(
        slow,
        healthy,
        f"max by ({by(labels)}) ({baseline})\n  or on({by(labels)}) max without({K_LABEL}) (\n"
        f"  {best} + on({by(mlabels)}, {K_LABEL}) group_right() (0 * {k_label})\n)",
    )
    # Below it drafting costs more than it returns (config.Detection.draft_step_cost).
    record(slow, name(SERVER, "break_even_mean_acceptance_length", "max"), f"1 + {o.thresholds['draft_step_cost']} * {k}")
    drafts, accepted = name(SERVER, "drafts", f"rate{w}"), name(SERVER, "accepted_tokens", f"rate{w}")
    # With traffic only (the alerts' floor): an idle server's few drafts are noise, not a cost.
    busy = f"({drafts} > {o.thresholds['min_drafts_per_second']})"
    server_steps, server_tokens = (
        name(SERVER, "healthy_decode_steps", f"rate{w}"),
        name(SERVER, "healthy_output_tokens", f"rate{w}"),
    )
    # The steps a healthy head would need for the same output (output / AL_healthy), and the output
    # the same steps would give with it (drafts x AL_healthy).
    record(fast, server_steps, f"({drafts} + {accepted}) / on({by(labels)}) {healthy}\nand on({by(labels)}) {busy}")
    record(fast, server_tokens, f"{drafts} * on({by(labels)}) {healthy}\nand on({by(labels)}) {busy}")
    # A model's figure only where every busy server of it has a reference (sums before the ratio):
    # a model half at its profile and half broken with no reference would otherwise read healthy.
    uncovered = f"unless on({by(mlabels)}) ({busy} unless on({by(labels)}) {healthy})"
    model_steps, model_tokens = (
        name(MODEL_LEVEL, "healthy_decode_steps", f"rate{w}"),
        name(MODEL_LEVEL, "healthy_output_tokens", f"rate{w}"),
    )
    record(fast, model_steps, f"sum by ({by(mlabels)}) ({server_steps})\n{uncovered}")
    record(fast, model_tokens, f"sum by ({by(mlabels)}) ({server_tokens})\n{uncovered}")
    model_drafts = f"sum by ({by(mlabels)}) ({drafts} and on({by(labels)}) {server_steps})"
    for level, d, steps in ((SERVER, drafts, server_steps), (MODEL_LEVEL, model_drafts, model_steps)):
        record(fast, name(level, "decode_step_factor", f"ratio_rate{w}"), f"{d} / ({steps} > 0)")
        record(fast, name(level, "decode_steps_wasted", f"ratio_rate{w}"), f"clamp_min(1 - {steps} / ({d} > 0), 0)")


def _conditional(level: str, w: str) -> str:
    """per_pos[i] / per_pos[i-1], with per_pos[-1] = drafts: relabel i-1 as i so the two sides
    match, one clause per position (one rule, so the record name is not duplicated)."""
    pos, drafts = name(level, "position_accepted_tokens", f"rate{w}"), name(level, "position_drafts", f"rate{w}")
    clauses = [f'{pos}{{position="0"}} / ignoring(position) group_left() ({drafts} > 0)']
    clauses += [
        f'{pos}{{position="{i}"}} / label_replace({pos}{{position="{i - 1}"}} > 0, "position", "{i}", "position", ".*")'
        for i in range(1, c.MAX_SPECULATIVE_TOKENS)
    ]
    return "\n  or ".join(clauses)


def _count_distribution(level: str, w: str) -> str:
    """The acceptance-count distribution: drafts that accepted exactly j tokens, as a share,
    = survival[j-1] - survival[j] (survival[-1] = 1, survival[k] = 0: a missing position counts
    as 0). The position label goes, `accepted` = j comes."""
    surv = name(level, "position_acceptance_ratio", f"ratio_rate{w}")
    clauses = [f'1 - {surv}{{position="0"}}']
    clauses += [
        f'{surv}{{position="{j - 1}"}} - ignoring(position) ({surv}{{position="{j}"}} '
        f'or ignoring(position) 0 * {surv}{{position="{j - 1}"}})'
        for j in range(1, c.MAX_SPECULATIVE_TOKENS + 1)
    ]
    clauses = [
        f'label_replace(label_replace({x}, "accepted", "{j}", "", ""), "position", "", "", "")' for j, x in enumerate(clauses)
    ]
    return "\n  or ".join(clauses)


def prune_server_series(fast: list[Rule], slow: list[Rule], alerting: list[Rule]) -> tuple[list[Rule], list[Rule]]:
    """Per server, only the rates and ratios a rule reads (docs/scale.md): each costs a read or a
    join per server every evaluation, and the dashboards read the namespace and model levels.
    Repeated until nothing more goes: a dropped ratio may leave its rates unread."""

    def kept(r: Rule, read: set[str]) -> bool:
        level, metric, op = r.get("record", "::").split(":")
        if metric.removeprefix(f"{c.PREFIX}_") in COST_PER_SERVER:
            return True  # what a head costs, per server: for the on-call page and the dashboard
        return not (level == c.ALERT_LEVEL and op.startswith(("rate", "ratio_rate"))) or r["record"] in read

    while True:
        # An alert's description reads series too (its query templates: what the head costs).
        texts = [r["expr"] for r in (*fast, *slow, *alerting)] + [v for r in alerting for v in r.get("annotations", {}).values()]
        read = set().union(*(references(t) for t in texts))
        pruned = [r for r in fast if kept(r, read)], [r for r in slow if kept(r, read)]
        if len(pruned[0]) + len(pruned[1]) == len(fast) + len(slow):
            return pruned
        fast, slow = pruned
