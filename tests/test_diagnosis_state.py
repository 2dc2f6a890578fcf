"""Issue 32: every window of /api/v1/summary reads what the poller saw as the health window does.

The diagnosis state (diagnosis_state.DiagnosisState) holds the restarts and k changes per window,
each as the health window's would be were it the health window, with the model over that window
just before them. So /api/v1/summary?window=W of a sidecar whose health window is 5m names the
causes, with the same evidence, that /metrics, the landing page and the view of a sidecar whose
health window is W name. Before, the other windows read the health window's: a restart 15
minutes back was forgotten once 5 minutes had passed, and the 15m summary said "with no restart
or k change"; the 1m summary read the figures before a restart over 5 minutes.

Every expected figure is worked by hand from the served counters.
"""

from __future__ import annotations

import asyncio

from sidecar_harness import T0, Sidecar, dump
from test_restart_causes import HEALTHY, WEAK
from vllm_specdec_exporter.parser import parse

PRO = "deepseek-ai/DeepSeek-V4-Pro"


async def metrics_causes(s: Sidecar) -> set[str]:
    async with s.session.get(s.url + "/metrics") as r:
        samples = parse(await r.text()).samples
    return {x.labels["cause"] for x in samples.get("vllm_specdec_diagnosis_info", [])}


def same_causes_as_the_health_window(serve, until: float, window: str) -> list[tuple[str, str]]:
    """The summary over ``window`` of a sidecar on the default 5m health window, checked against
    what a sidecar whose health window is ``window`` shows on /metrics, the landing page and its
    view, polled alike; returns the summary's (cause, evidence)."""

    async def go():
        async with Sidecar(serve, T0 + 10) as a, Sidecar(serve, T0 + 10, {"health": {"window": window}}) as b:
            await a.poll_until(until)
            await b.poll_until(until)
            summary = [(d["cause"], d["evidence"]) for d in (await a.summary(window))["diagnosis"]]
            view = [(h.cause, h.evidence) for h in b.model().health_causes]
            assert summary == view
            assert await metrics_causes(b) == {c for c, _ in view}
            page = await b.page()
            assert all(evidence in page for _, evidence in view)
            return summary

    return asyncio.run(go())


def test_the_15m_summary_names_a_restart_the_5m_window_has_forgotten():
    """V4-Pro k=2 at 92.4 % / 68.7 % (AL 2.611) at 50 drafts/s, then a restart (_created 3,000 s
    later) into 80 % / 40 % (AL 2.200): the gain at 1.2 / 1.611 = 74.5 % of what it was, every
    position lower, above the profile's floor: ok, with a drift that came with the restart. 905 s
    on, the 5m health window has stood for over 5 minutes and forgot the restart; the 15m window
    still holds it (as a 15m health window does), so its summary names the drift with it, never
    "with no restart or k change"."""
    restart = T0 + 3000

    def serve(t: float) -> bytes:
        if t < restart:
            return dump(PRO, 50 * (t - T0), (0.924, 0.687), T0)
        return dump(PRO, 50 * (t - restart), (0.80, 0.40), restart)

    got = same_causes_as_the_health_window(serve, restart + 905, "15m")
    assert got == [
        ("configuration_change", "every position lower together: AL 2.200 against 2.611 before a restart of engine 0 "
                                 "(the gain at 74.5 % of it): a drift that came with it")]


def test_the_1m_summary_reads_the_figures_before_a_restart_over_1m():
    """100 drafts/s at 74 % / 50 % (AL 2.240), then a restart (_created 5,000 s later) into 30 % / 8 %
    (AL 1.380). The 1m window before the restart held 60 s x 100 = 6,000 drafts (the 5m one
    30,000): the 1m summary says 6,000, as a 1m health window does."""
    restart = T0 + 5000

    def serve(t: float) -> bytes:
        if t < restart:
            return dump("my-model", 100 * (t - T0), HEALTHY, T0)
        return dump("my-model", 100 * (t - restart), WEAK, restart)

    got = same_causes_as_the_health_window(serve, restart + 305, "1m")
    assert got == [
        ("configuration_change", "the draft head changed at a restart of engine 0: position 0 accepted in 30.0 % of "
                                 "drafts since it, against 74.0 % of 6,000 drafts before it (AL 1.380 since it, against "
                                 "2.240 before it)"),
        ("draft_head_partial", "every engine (1) and every position low since a restart of engine 0: position 0 at "
                               "30.0 %, then 26.7 % conditional")]
