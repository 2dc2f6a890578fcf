"""The alerts' expressions and descriptions: one builder per alert, from what every alert is built
from (X: the variant, the options, the levels' labels and the series the alerts read). The registry
(registry.py) names each alert and pairs it with its builder.
"""

from __future__ import annotations

from ... import config as c
from ... import durations
from ... import metrics as m
from ...baselines import NO_BASELINE
from .context import ENGINE_LABEL, POSITION_LABEL, TARGET_AT_INSTANCE, Expr, X, cost, label
from .options import (
    DAY,
    ENGINE,
    K_LABEL,
    K_LEVEL,
    K_SERVER,
    MODEL_LEVEL,
    SIDECAR,
    base_window,
    by,
    minus,
    name,
    selector_of,
    young,
)


def collapsed(x: X) -> tuple[str, str]:
    return (
        f"{x.al5} < {x.collapse}\nand {x.on} {x.d5} >= {x.floor}",
        f'Mean acceptance length of {x.where} is {{{{ $value | printf "%.3f" }}}} over {x.w} (1.0 means no draft '
        f"token is accepted) with real traffic. Decoding still works but runs at non-speculative speed: "
        f"suspect the draft head (quantised conversion, loader) or draft sampling.{cost(x)}",
    )


def collapsed_fast(x: X) -> tuple[str, str]:
    # The fast page: at production traffic a collapse is certain within a couple of minutes
    # (config.ALERT_FAST_COLLAPSE_*: the binomial bound); below the floor the slow path pages.
    fr = x.o.range(c.ALERT_FAST_COLLAPSE_RANGE)
    fd = f"sum by ({by(x.lv[c.ALERT_LEVEL])}) (rate({x.src.drafts}{selector_of(x.o)}[{fr}]))"
    fa = f"sum by ({by(x.lv[c.ALERT_LEVEL])}) (rate({x.src.accepted}{selector_of(x.o)}[{fr}]))"
    return (
        f"1 + {fa}\n  / ({fd} >= {x.t['fast_collapse_min_drafts_per_second']})\n< {x.collapse}",
        f'Mean acceptance length of {x.where} is {{{{ $value | printf "%.3f" }}}} over the last '
        f"{c.ALERT_FAST_COLLAPSE_RANGE} with at least {x.t['fast_collapse_min_drafts_per_second']} drafts/s: "
        f"enough drafts to make it certain. Decoding runs at non-speculative speed: suspect the draft head "
        f"(quantised conversion, loader) or draft sampling.{cost(x)}",
    )


def engine_collapsed(x: X) -> tuple[str, str]:
    return (
        f"1 + {x.egain} < {x.collapse}\nunless {x.on} {x.al5} < {x.collapse}",
        f"Engine {ENGINE_LABEL} of {x.where} has a mean acceptance length of "
        f'{{{{ $value | printf "%.3f" }}}} over {x.w} with real traffic, while the server as a whole has not '
        f"collapsed: one data-parallel rank decodes at non-speculative speed (its draft head failed to load or "
        f"is corrupt on that rank).",
    )


def engine_lagging(x: X) -> tuple[str, str]:
    f = x.t["engine_lag_fraction"]
    return (
        # Not a collapsed engine (EngineCollapsed's case).
        f"({x.egain} >= {x.t['collapse_margin']})\n  < {x.on} group_left() {f} * ({x.al5} - 1)",
        f"The speculative gain (mean acceptance length - 1) of engine {ENGINE_LABEL} of {x.where} is "
        f'{{{{ $value | printf "%.3f" }}}} over {x.w}, below {f} x the whole server\'s. '
        f"Engines of one server share traffic and weights and differ by a few percent: this rank is broken.",
    )


def _position0_floor(x: X) -> str:
    """Position 0's floor per server: where a profile matches, config.Detection.position0_floor_under's
    (config.position0_share: degraded_fraction x (profile AL - 1) / k, at most position0_floor); without one,
    position0_floor once the model's position 0 reached it within the day (in any of its pods,
    so a rollout keeps it). A steady weak drafter with neither (vLLM's Qwen3-VL EAGLE3
    reference: 0.29) has not fallen."""
    L, floor = c.ALERT_LEVEL, x.t["position0_floor"]
    baseline = name(L, "baseline_mean_acceptance_length", "max")
    best = name(MODEL_LEVEL, "position_acceptance_ratio", f"max_over_time{DAY}")  # position 0's best hour
    # config.position0_share, the formula the sidecar judges with; `on(...) k` is the divisor (the
    # division's vector matching rides with its right operand), clamp_max the min.
    share = c.position0_share(Expr(x.t["degraded_fraction"]), Expr(baseline), Expr(f"{x.on} {x.k}"))
    return (
        f"clamp_max({share}, {floor})\n"
        f"  or {x.on} (0 * {x.d5} + {floor} and {x.on_model} max without(position) ({best}) >= {floor})"
    )


def _position(x: X, i: int) -> str:
    return f'max without(position) ({name(c.ALERT_LEVEL, "position_accepted_tokens", f"rate{x.w}")}{{position="{i}"}})'


def _position_drafts(x: X) -> str:
    """The drafts a server's positions are divided by: read with them, in the same group (recording.py)."""
    return f"({name(c.ALERT_LEVEL, 'position_drafts', f'rate{x.w}')} >= {x.floor})"


def position0_low(x: X) -> tuple[str, str]:
    floor = x.t["position0_floor"]
    return (
        f"{_position(x, 0)} / {x.on} {_position_drafts(x)}\n  < {x.on} (\n  {_position0_floor(x)}\n)",
        f"Position 0 of {x.where} was accepted in {{{{ $value | humanizePercentage }}}} of drafts over {x.w} "
        f"(healthy MTP: 66 % or more, whatever k): below what its profile allows (at most {floor}), or below "
        f"{floor} after the model was at {floor} or more within {x.o.day_range}. Either a broken draft path (draft "
        f"sampling, missing draft context, a partly broken head), or synthetic random-token load such as a "
        f"benchmark, which gives the same counters.",
    )


# Without a profile, DraftChainBroken judges a model whose chain was healthy within the day: position 1's
# conditional at this many times chain_conditional_floor or more.
CHAIN_HEALTHY_FACTOR = 2


def chain_broken(x: X) -> tuple[str, str]:
    # Position 1's conditional acceptance (of the drafts whose position 0 was accepted), with
    # position 0 healthy: a chain that breaks after its first token passes every AL-based
    # alert when k is small (SGLang's V4 MTP k=3 bug: AL 2.17 against a profile floor of 2.12).
    # Against a profile, or after the model's chain was healthy within the day.
    floor, cfloor = x.t["position0_floor"], x.t["chain_conditional_floor"]
    baseline = name(c.ALERT_LEVEL, "baseline_mean_acceptance_length", "max")
    best = name(MODEL_LEVEL, "position1_conditional_acceptance_ratio", f"max_over_time{DAY}")
    p0 = _position(x, 0)
    return (
        f"{_position(x, 1)} / {x.on} ({p0} > 0) < {cfloor}\n"
        f"and {x.on} {p0} / {x.on} {_position_drafts(x)} >= {floor}\n"
        f"and {x.on_model} (max by ({by(x.lv[MODEL_LEVEL])}) ({baseline}) or {best} >= {CHAIN_HEALTHY_FACTOR} * {cfloor})",
        f"Of the drafts of {x.where} whose position 0 was accepted, position 1 was accepted in "
        f"{{{{ $value | humanizePercentage }}}} over {x.w} (healthy: 41 % or more), while position 0 is healthy: "
        f"the draft chain breaks after its first token.",
    )


def below_baseline(x: X) -> tuple[str, str]:
    baseline = name(c.ALERT_LEVEL, "baseline_mean_acceptance_length", "max")
    f = x.t["degraded_fraction"]
    # config.degraded_floor, the formula the sidecar's health judges with: 1 + f * (baseline - 1).
    return (
        f"{x.al5}\n  < {x.on} {c.degraded_floor(Expr(f), Expr(baseline))}\nand {x.on} {x.d5} >= {x.floor}",
        f'Mean acceptance length of {x.where} is {{{{ $value | printf "%.3f" }}}} over {x.w}, below '
        f"1 + {f} x (baseline - 1) for its baseline profile "
        f"({baseline}).{cost(x)}",
    )


def dropped(x: X) -> tuple[str, str]:
    # Against the model's best hour of the day at the server's own k (kept per model, so a
    # rollout does not reset it, and per k, so a k change starts a new history): a fall of more
    # than drop_fraction of the gain within minutes, whether it came at once or slowly.
    # Not before the server's k has held for ALERT_DROPPED_SETTLE: a new pod's warm-up requests.
    ref = name(K_LEVEL, "mean_acceptance_length", f"max_over_time{DAY}")
    k_label = name(K_SERVER, "num_speculative_tokens", "count_values")
    keep = f"(1 - {x.t['drop_fraction']})"
    return (
        f"({x.al5} - 1)\n  < {x.on} {keep} * ({ref} + on({by(x.lv[MODEL_LEVEL])}, {K_LABEL}) group_right() (0 * {k_label}) - 1)\n"
        f"and {x.on} {x.d5} >= {x.floor}\nunless {x.on} ({young(x.o, x.o.range(c.ALERT_DROPPED_SETTLE))})",
        f'The speculative gain (mean acceptance length - 1) of {x.where} is {{{{ $value | printf "%.3f" }}}} '
        f"over {x.w}, more than {x.t['drop_fraction']} below the model's best hour of the last "
        f"{x.o.day_range} at the same k.{cost(x)}",
    )


def shifted(x: X) -> tuple[str, str]:
    # Gated on a rollout, not on a threshold beyond workload: the newcomers against the settled
    # servers they join over the same window at the same time, while those serve beside them
    # (config.ALERT_SHIFT_SETTLED_MIN_SHARE of the newcomers' drafts: at night under the reference
    # floor too, where their figure of before the lull is other traffic: helper-41); else (gone,
    # idle, or left with a blue/green's health checks: helper-43) the last figure they left at the
    # reference floor within the hour, at the same k. Same traffic, same time: a drift within the
    # workload's spread (the gain 22 % lower) is then a fault of what was rolled out.
    hw, sw = x.o.hourly_window, c.ALERT_SHIFT_WINDOW
    on = f"on({by(x.lv[MODEL_LEVEL])}, {K_LABEL})"
    settled = name(K_LEVEL, "settled_mean_acceptance_length", f"ratio_rate{sw}")
    now = base_window(x.o)
    beside = (
        f"{name(K_LEVEL, 'settled_drafts', f'rate{now}')}\n"
        f"    >= {on} {c.ALERT_SHIFT_SETTLED_MIN_SHARE} * {name(K_LEVEL, 'newcomers_drafts', f'rate{now}')}"
    )
    last = f"last_over_time({name(K_LEVEL, 'settled_reference_mean_acceptance_length', f'ratio_rate{sw}')}[{x.o.range(hw)}])"
    new = name(K_LEVEL, "newcomers_mean_acceptance_length", f"ratio_rate{sw}")
    ns = f"$labels.{x.o.namespace_label}"
    at = f"{label(c.LABEL_MODEL)}{{{{ if {ns} }}}} in {label(x.o.namespace_label)}{{{{ end }}}}"
    return (
        f"({new} - 1)\n  < (1 - {x.t['shift_fraction']}) * (({settled} and {on} ({beside}) or {last}) - 1)",
        f"The speculative gain (mean acceptance length - 1) of the servers of {at} that started or changed k "
        f'within the last {hw} is {{{{ $value | printf "%.3f" }}}} over {sw} at k={label(K_LABEL)}: more than '
        f"{x.t['shift_fraction']} below the servers they join or replace over the same {sw} (or, once those "
        f"no longer serve beside them, their last {sw} at production traffic within the last {hw}, same k). What was rolled out drafts worse on the same traffic.",
    )


def not_drafting(x: X) -> tuple[str, str]:
    L = c.ALERT_LEVEL
    g5 = name(L, "generation_tokens", f"rate{x.w}")
    return (
        f"{g5} > {x.t['min_generation_tokens_per_second']}\nunless {x.on} {x.d5} > 0\n"
        f"and {x.on_model} {name(MODEL_LEVEL, 'drafts', f'max_over_time{DAY}')} >= {x.floor}",
        f"{x.where} generates {{{{ $value | humanize }}}} tokens/s with no drafts over {x.w}, although it was "
        f"drafting within the last day: speculative decoding is off or silently disabled.",
    )


def target_down(x: X) -> tuple[str, str]:
    o = x.o
    fail = "|".join(c.TARGET_MISCONFIGURED_RESULTS)
    unreachable = o.unreachable_range or minus(c.TARGET_UNREACHABLE_AFTER, x.for_)
    up = m.name("up")
    return (
        f"(\n  {up}{selector_of(o)} == 0\n  and ignoring(result) "
        f"increase({m.sample('exporter_polls')}{selector_of(o, f'result=~{chr(34)}{fail}{chr(34)}')}[5m]) > 0\n)\n"
        # ... and the series was there a range ago: a new pod's sidecar reads up 0 from its first poll
        # while vLLM loads its weights, which fired on every rollout (helper-41).
        f"or max_over_time({up}{selector_of(o)}[{unreachable}]) == 0 and {up}{selector_of(o)} offset {unreachable}",
        f"{TARGET_AT_INSTANCE} either answers with something "
        "that is not vLLM's metrics (an HTTP error, an auth failure, a body that is not Prometheus text: a "
        f"misconfiguration), or has been unreachable for {c.TARGET_UNREACHABLE_AFTER}, longer than any "
        f"weight reload. See {m.sample('exporter_polls')} by result and the sidecar's log.",
    )


def target_inconsistent(x: X) -> tuple[str, str]:
    w, share = c.TARGET_INCONSISTENT_WINDOW, c.TARGET_INCONSISTENT_SHARE
    ok = f"increase({m.sample('exporter_polls')}{selector_of(x.o, 'result=' + chr(34) + 'success' + chr(34))}[{w}])"
    return (
        f"increase({m.sample('exporter_inconsistent_polls')}{selector_of(x.o)}[{w}])\n"
        f"  >= ignoring(result) {share} * {ok}\nand ignoring(result) {ok} > 0",
        f"{TARGET_AT_INSTANCE} gave {{{{ $value | humanize }}}} "
        f"inconsistent engine polls in {w} (counters that went down without a restart, drafts faster than "
        f"any engine, two servers behind one URL): they are not counted, so its figures and alerts are blind. "
        "See the sidecar's log (target_warning) for the reason.",
    )


def exporter_absent(x: X) -> tuple[str, str]:
    return (
        f"absent({m.name('exporter_build_info')}{selector_of(x.o)})",
        f"Prometheus has no {m.name('exporter_build_info')} series: the sidecar is not running, not "
        "scraped, or its series are dropped.",
    )


def invariant(x: X) -> tuple[str, str]:
    if x.src is SIDECAR:
        return (
            f"increase({m.sample('exporter_invariant_violations')}{selector_of(x.o)}[{c.ALERT_INVARIANT_WINDOW}]) > 0",
            f"The exporter at {label('instance')} (target {label(c.LABEL_TARGET)}) saw {{{{ $value | humanize }}}} "
            f"invariant violations in {c.ALERT_INVARIANT_WINDOW}: a partial scrape, a parse problem or a broken producer. The "
            "figures of the affected engine are suspect.",
        )
    # Per engine, from the raw counters: a per-server sum (tried for issue 35's cost) hides one
    # engine of eight behind its siblings' margin, and swapped positions cancel out.
    # On the totals at one instant, not on rates over a range (issue 35 item 3): vLLM counts the
    # three counters together in one process and serves them in one payload, and Prometheus appends
    # a scrape at once, so the latest sample of each is one snapshot and vLLM's invariants hold on it
    # exactly (accepted <= draft tokens, accepted == the sum over positions: integers carried as
    # floats, with the sidecar's relative slack for float noise, not the rates' 0.001). A rate over
    # the range read only the window's two ends too (and resets), but decoded every sample between.
    # - A violation in the past stays in the totals until the process restarts (vLLM resets every
    #   counter together; a restart leaves nothing to flag, mid-window or not): the alert stays on for
    #   as long as the engine's totals disagree, where a rate dropped it 5 minutes later. The slack is
    #   relative but tiny (10 tokens at 10^10), so a late glitch is not hidden by a long uptime.
    # - A fresh engine: 0 / 0 gives no sample, and small totals are exact (no absolute slack needed).
    # - A partial scrape: a series missing from a scrape is marked stale, so the sum lacks it and the
    #   alert fires while it is missing (a rate saw it only when it fell on the window's ends). A
    #   failed scrape marks the whole target stale: nothing. Two servers behind one URL give each
    #   scrape one server's consistent snapshot: not seen here (a rate saw it by accident, when
    #   the counters' resets disagreed; the sidecar's TargetInconsistent is the check for it).
    # - ALERT_INVARIANT_FOR stays 0m: the group reads every 3 minutes the latest scrape; a `for` would
    #   only drop a snapshot broken once (a torn scrape), which the rate form also saw at both ends.
    # accepted is read twice, not three times: |1 - positions / accepted| is the relative gap.
    eb = by(x.lv[ENGINE])
    sel, src, tol = selector_of(x.o), x.src, c.INVARIANT_RELATIVE_TOLERANCE
    acc = f"sum by ({eb}) ({src.accepted}{sel})"
    return (
        f"{acc}\n  > on({eb}) {1 + tol:.12g} * sum by ({eb}) ({src.draft_tokens}{sel})\n"
        f"or\nabs(1 - sum by ({eb}) ({src.per_pos}{sel}) / on({eb}) {acc}) > {tol:g}",
        f"Engine {ENGINE_LABEL} of {x.where} reports accepted tokens that exceed its draft tokens "
        f"or differ from the sum of its per-position counts: a partial scrape or a broken producer.",
    )


def no_baseline(x: X) -> tuple[str, str]:
    info, unmatched = m.name("model_info"), 'profile_matched_by="none"'
    return (
        f"max by ({by(x.lv[c.ALERT_LEVEL])}) ({info}{selector_of(x.o, unmatched)})\nand {x.on} {x.d5} >= {x.floor}",
        f"{x.where} drafts with no baseline profile: none matches its served name, the model vLLM's /v1/models "
        f"names as its root, or an alias. {NO_BASELINE[:1].upper()}{NO_BASELINE[1:]} ({info} shows the root).",
    )


def wasted(x: X) -> tuple[str, str]:
    hw = x.o.hourly_window
    pos1h = name(c.ALERT_LEVEL, "position_acceptance_ratio", f"ratio_rate{hw}")
    clauses = [
        f'({pos1h}{{position="{i}"}} < {x.t["wasted_position_ratio"]} and {x.on} {x.k} == {i + 1})'
        for i in range(1, c.MAX_SPECULATIVE_TOKENS)
    ]
    return (
        "(\n  " + "\n  or ".join(clauses) + f"\n)\nand {x.on} {name(c.ALERT_LEVEL, 'drafts', f'rate{hw}')} >= {x.floor}",
        f"The last draft position (position {POSITION_LABEL}) of {x.where} was accepted in "
        f"{{{{ $value | humanizePercentage }}}} of drafts over {hw}. Each draft still pays for it; consider "
        f"num_speculative_tokens = {POSITION_LABEL}.",
    )


def suspicious(x: X) -> tuple[str, str]:
    rate30 = name(c.ALERT_LEVEL, "acceptance_ratio", f"ratio_rate{x.o.trend_window}")
    return (
        f"{rate30} > {x.t['suspicious_acceptance_ratio']}\nand {x.on} {x.dtr} >= {x.floor}",
        f"Draft acceptance of {x.where} is {{{{ $value | humanizePercentage }}}} over {x.o.trend_window}. Sustained acceptance "
        f"this high goes with repetition loops (draft and target agree on repeating text).",
    )


def request_extremes(x: X) -> tuple[str, str]:
    """vLLM's per-request histogram (PR #44487): vLLM-direct reads its buckets at le="0.05" and
    le="0.98" (no figure without those edges); the sidecar's gauges are read at its nearest edge."""
    lb, w = by(x.lv[c.ALERT_LEVEL]), x.o.request_extremes_window
    share, least = c.ALERT_REQUEST_EXTREMES_SHARE, c.ALERT_REQUEST_EXTREMES_MIN_REQUESTS
    low, high = f"{c.REQUEST_ACCEPTANCE_LOW:g}", f"{c.REQUEST_ACCEPTANCE_HIGH:g}"
    if x.src is SIDECAR:
        sel = selector_of(x.o, f'{c.LABEL_WINDOW}="{w}"')
        below, above = (f"max by ({lb}) ({m.name(f'request_acceptance_{side}_ratio')}{sel})" for side in ("below", "above"))
        finished = f"max by ({lb}) ({m.name('window_requests')}{sel})"
    else:
        # Recorded in the long group (recording_rules): the rates over the window, per server.
        L = c.ALERT_LEVEL
        count, le_low, le_high = (
            name(L, n, f"rate{w}") for n in ("requests_finished", "requests_acceptance_le_low", "requests_acceptance_le_high")
        )
        finished = f"{count} * {durations.parse_duration(x.o.range(w)):g}"
        below, above = f"{le_low} / on({lb}) {count}", f"1 - {le_high} / on({lb}) {count}"
    return (
        f"(\n  {below} > {share}\nor\n  {above} > {share}\n)\nand on({lb}) {finished} >= {least}",
        f"Over {w}, {{{{ $value | humanizePercentage }}}} of the finished requests of {x.where} had a draft "
        f"acceptance at or below {low} or above {high} (vLLM's per-request histogram). Very low goes with garbled output, "
        f"very high with repetition loops; look at the dashboard's extremes panel for which end.",
    )
