"""The landing page's charts (issue 34 item 5): the pure SVG builders (charts.py) worked by hand,
the per-model trend the history keeps for them (history.TrendPoint), and the page during a
collapse: the charts drawn from the sidecar's own history, no script, no external asset,
and no word inside the SVG (a terminal browser prints an element's text)."""

from __future__ import annotations

import ast
import re
import sys
from html.parser import HTMLParser

import pytest
from conftest import REPO
from sidecar_harness import harness, run
from vllm_specdec_exporter import charts, config
from vllm_specdec_exporter.charts import Frame
from vllm_specdec_exporter.history import TargetHistory
from vllm_specdec_exporter.model import Counters
from vllm_specdec_exporter.trend import TREND_POINTS

# 1 h over 360 px, AL 1 to 3 over 90 px: 10 s a pixel, 1/45 of AL a pixel.
FRAME = Frame(start=6400.0, end=10000.0, low=1.0, high=3.0)


def test_a_points_place_from_its_time_and_value():
    assert FRAME.x(8200.0) == 180.0  # half way through the hour
    assert FRAME.y(2.5) == 22.5  # 90 x (3 - 2.5) / 2
    assert (FRAME.x(6400.0), FRAME.y(3.0)) == (0.0, 0.0)  # oldest, top
    assert (FRAME.x(10000.0), FRAME.y(1.0)) == (360.0, 90.0)  # now, bottom
    assert FRAME.y(0.5) == 90.0 and FRAME.y(9.0) == 0.0  # drawn at the edge, never outside
    assert Frame(5.0, 5.0, 1.0, 1.0).x(5.0) == 360.0 and Frame(5.0, 5.0, 1.0, 1.0).y(1.0) == 45.0  # no span: no division


def test_a_point_without_a_value_breaks_the_line_and_a_lone_point_is_a_dot():
    points = [(6000.0, 2.0), (6400.0, 3.0), (8200.0, 2.5), (8300.0, None), (10000.0, 1.0)]
    assert charts.runs(FRAME, points) == [[(0.0, 0.0), (180.0, 22.5)], [(360.0, 90.0)]]  # 6000 s: before the frame
    drawn = charts.line(FRAME, points, "#123456")
    assert drawn == ('<polyline points="0,0 180,22.5" fill="none" stroke="#123456" stroke-width="1.5"/>'
                     '<circle cx="360" cy="90" r="2" fill="#123456"/>')
    assert charts.line(FRAME, [(7000.0, None)], "#123456") == ""


def test_the_acceptance_length_chart_draws_its_reference_and_threshold():
    # Healthy 2.2 at y = 90 x 0.8 / 2 = 36; degraded under 1.9 at 90 x 1.1 / 2 = 49.5.
    svg = charts.acceptance_length_chart(FRAME, [(8200.0, 2.5), (10000.0, 1.0)], 2.2, 1.9, 'AL "now" <1h>')
    assert svg.startswith('<svg class="chart" role="img" aria-label="AL &quot;now&quot; &lt;1h&gt;" width="360" height="90"')
    assert f'<line x1="0" y1="36" x2="360" y2="36" stroke="{charts.HEALTHY}"' in svg
    assert f'<line x1="0" y1="49.5" x2="360" y2="49.5" stroke="{charts.DEGRADED}"' in svg
    assert f'<polyline points="180,22.5 360,90" fill="none" stroke="{charts.LINE}"' in svg
    assert "<line" not in charts.acceptance_length_chart(FRAME, [(8200.0, 2.5)], None, None, "AL")  # no profile
    assert text_inside_svg(svg) == ""


def test_the_position_chart_has_a_line_per_position():
    frame = Frame(6400.0, 10000.0, 0.0, 1.0)
    svg = charts.position_chart(frame, [[(8200.0, 0.9), (10000.0, 0.05)], [(8200.0, 0.5), (10000.0, 0.0)]], "positions")
    assert f'<polyline points="180,9 360,85.5" fill="none" stroke="{charts.POSITIONS[0]}"' in svg  # 90 x (1 - 0.9)
    assert f'<polyline points="180,45 360,90" fill="none" stroke="{charts.POSITIONS[1]}"' in svg


def test_charts_is_pure():
    tree = ast.parse((REPO / "exporter" / "vllm_specdec_exporter" / "charts.py").read_text())
    imported = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert imported <= {"__future__", "html", "collections.abc", "dataclasses"}, imported


def engine(drafts: float, per_position: tuple[float, ...]) -> Counters:
    return Counters(drafts, len(per_position) * drafts, sum(per_position), per_position)


def test_the_history_keeps_one_point_per_step_of_its_longest_window():
    # 1h window: a step every 60 s. Two engines of "m", 100 drafts a step each; from the second
    # step on engine 1 accepts nothing.
    h = TargetHistory([("1m", 60.0), ("1h", 3600.0)], 7200.0)
    totals = {"0": (0.0, (0.0, 0.0)), "1": (0.0, (0.0, 0.0))}
    for t in range(0, 181, 30):
        if t:
            for e, (d, per) in totals.items():
                gain = (45.0, 30.0) if e == "0" or t <= 60 else (0.0, 0.0)
                totals[e] = (d + 50.0, (per[0] + gain[0], per[1] + gain[1]))
        h.observe(float(t), {("m", e): engine(d, per) for e, (d, per) in totals.items()})
    points = h.trends()["m"]
    assert [p.t for p in points] == [60.0, 120.0, 180.0]
    first, second = points[0], points[1]
    # First step: 2 engines x 100 drafts, 2 x 2 x (45 + 30) accepted: AL 1 + 300 / 200.
    assert (first.drafts, first.accepted, first.per_position) == (200.0, 300.0, (180.0, 120.0))
    assert first.mean_acceptance_length == 2.5 and first.position_acceptance == (0.9, 0.6)
    # Second: engine 1 adds nothing accepted: AL 1 + 150 / 200.
    assert second.mean_acceptance_length == 1.75 and second.position_acceptance == (0.45, 0.3)
    assert h.trend_window == ("1h", 3600.0)


def test_a_producer_without_per_position_counters_still_has_an_acceptance_length_trend():
    """helper-44: SGLang exposes no per-position counters (k unknown); the trend bounded its AL by
    k + 1 = 1 and drew no point, where derive and /metrics give 1 + accepted / drafts."""
    h = TargetHistory([("1h", 3600.0)], 7200.0)
    for i in range(4):  # 100 drafts and 150 accepted tokens a minute: AL 2.5
        h.observe(60.0 * i, {("m", "0"): Counters(100.0 * i, 300.0 * i, 150.0 * i, ())})
    points = h.trends()["m"]
    assert [p.mean_acceptance_length for p in points] == [2.5, 2.5, 2.5]
    assert all(p.position_acceptance == () for p in points)


def test_the_trend_is_bounded_by_its_window():
    h = TargetHistory([("1h", 3600.0)], 7200.0)
    for i in range(200):  # 200 minutes, then "m" goes away and only "n" is polled
        h.observe(60.0 * i, {("m", "0"): engine(100.0 * i, (80.0 * i,))} if i < 150 else {("n", "0"): engine(100.0 * i, (50.0 * i,))})
    trends = h.trends()
    assert len(trends["m"]) <= TREND_POINTS and all(p.t > 199 * 60.0 - 3600 for p in trends["m"])
    assert [p.t for p in trends["n"]][-1] == 199 * 60.0
    for _ in range(70):  # "m" unseen for over an hour: its points age out, and the model with them
        i += 1
        h.observe(60.0 * i, {("n", "0"): engine(100.0 * i, (50.0 * i,))})
    # 60 s steps: the points of the last 3,540 s and the step ending now (TREND_POINTS allows a step short).
    assert "m" not in h.trends() and len(h.trends()["n"]) == 60 <= TREND_POINTS


def deep_size(value, seen=None) -> int:
    """Bytes of ``value`` and everything it holds (each object once)."""
    seen = set() if seen is None else seen
    if id(value) in seen:
        return 0
    seen.add(id(value))
    size = sys.getsizeof(value)
    if isinstance(value, (tuple, list)):
        size += sum(deep_size(v, seen) for v in value)
    elif hasattr(value, "__slots__"):
        size += sum(deep_size(getattr(value, f), seen) for f in value.__slots__)
    return size


def test_the_trends_memory_per_model():
    """The bound said in the report: a model's full hour at k=8 (the largest k the rules cover)."""
    k = config.MAX_SPECULATIVE_TOKENS
    h = TargetHistory([("1h", 3600.0)], 7200.0)
    for i in range(TREND_POINTS + 5):
        h.observe(60.0 * i, {(f"model-{m}", "0"): engine(100.0 * i, tuple(10.0 * i / (p + 1) for p in range(k)))
                             for m in range(4)})
    trends = h.trends()
    assert all(len(t) == 60 for t in trends.values())
    per_model = deep_size(trends["model-0"])
    print(f"trend memory: {per_model:,} bytes per model (60 points, k={k})", file=sys.stderr)
    assert per_model < 32 * 1024


class Text(HTMLParser):
    """What a terminal browser prints: the text, and which of it is inside an <svg>."""

    def __init__(self) -> None:
        super().__init__()
        self.depth, self.inside, self.outside, self.tags = 0, [], [], set()

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        self.depth += tag == "svg"

    def handle_endtag(self, tag):
        self.depth -= tag == "svg"

    def handle_data(self, data):
        (self.inside if self.depth else self.outside).append(data)


def text_inside_svg(page: str) -> str:
    p = Text()
    p.feed(page)
    return "".join(p.inside).strip()


def test_the_landing_page_draws_each_models_hour_during_a_collapse():
    """The collapse scenario (8 engines of V4-Pro MTP k=2, 40 drafts/s each, the head breaks at
    2m) polled every 5 s for 5 min on the fake clock; default windows, so the chart spans the
    1h window, a point per minute."""

    async def go():
        async with harness("collapse") as h:
            await h.run_for(300)
            status, page = await h.get("/")
            assert status == 200
            # The frame ends at the last poll (1300 s); its hour starts at -2300 s: 10 s a pixel.
            # The first step (1000-1060 s) healthy, AL 2.611 on 1 to 3: y = 90 x (3 - 2.611) / 2.
            assert '<polyline points="336,17.5 342,17.5 ' in page
            # The last (1240-1300 s) broken, AL 1.0365: y = 88.4; at the frame's end.
            assert " 354,88.4 360,88.4\"" in page
            # Per position, 0.924 then 0.0357: y = 90 x (1 - 0.924) = 6.8, then 86.8.
            # (the simulator's counts are whole: the first step reads 0.923-0.925.)
            assert re.search(r'<polyline points="336,6\.[789] 342,6\.[789] 348,86.8 354,86.8 360,86.8"', page)
            # The reference 2.27 and the degraded threshold 1 + 0.75 x 1.27 = 1.9525, drawn and said.
            assert 'y1="32.9"' in page and 'y1="47.1"' in page
            text = Text()
            text.feed(page)
            words = " ".join(" ".join(text.outside).split())
            assert "Last 1h, one point per 1m with at least 100 drafts" in words
            assert "lowest 1.03" in words and "latest 1.03" in words and "(blue; 1 to k+1 = 3; lowest" in words
            assert "against the healthy reference 2.27 (green dashes, the profile) and the degraded threshold 1.95" in words
            assert "position 0" in words and "position 1" in words
            assert "".join(text.inside).strip() == ""  # nothing for a terminal browser to print
            assert "script" not in text.tags and "src=" not in page and "href=\"http" not in page
            assert page.count("<svg") == 2

    run(go())


def test_counters_that_break_vllms_invariants_draw_no_figure_on_the_landing_page():
    """helper-42: position 0 at 1.5 x the drafts (k=2). /metrics and the summary give no figure; the page
    drew a 0.0 % bar per position and captioned its chart "lowest 4.000" (AL 4 at k=2, over k+1)."""
    from sidecar_harness import T0, V1, Sidecar

    def serve(t: float) -> bytes:
        d, lab = 1000 + 100 * (t - T0), 'engine="0",model_name="m"'
        return (f"{V1}drafts_total{{{lab}}} {d:.0f}\n{V1}drafts_created{{{lab}}} {T0!r}\n"
                f"{V1}draft_tokens_total{{{lab}}} {4 * d:.0f}\n{V1}accepted_tokens_total{{{lab}}} {3 * d:.0f}\n"
                + "".join(f'{V1}accepted_tokens_per_pos_total{{{lab},position="{i}"}} {1.5 * d:.0f}\n' for i in (0, 1))
                ).encode()

    async def go():
        async with Sidecar(serve, T0) as s:
            await s.poll_until(T0 + 400)
            assert (await s.summary("5m"))["all"]["per_position_acceptance"] == [None, None]
            return await s.page()

    page = run(go())
    bars = re.findall(r"<div class=bar>.*?</div>", page)
    assert len(bars) == 2 and all("<meter min=0 max=1></meter> - <code>" in b for b in bars), bars
    assert "lowest" not in page and "<svg" not in page  # no chart of figures out of their range
    assert "mean acceptance length <b>-</b>" in page


def al_heights(page: str) -> set[float]:
    """The heights of the acceptance length chart's points (its first line), in pixels from the top."""
    first = re.search(r'<polyline points="([^"]+)"', page)
    assert first, page
    return {float(p.split(",")[1]) for p in first.group(1).split()}


def test_a_producer_without_per_position_counters_has_its_acceptance_length_drawn_to_scale():
    """k unknown (SGLang has no per-position counters): the chart spanned 1 to k + 1 with k taken as
    1, so an AL of 2.5 was drawn at 2, the chart's top. It now reaches the highest AL it draws."""
    from sidecar_harness import T0, V1, Sidecar

    def serve(t: float) -> bytes:
        d, lab = 100 * (t - T0), 'engine="0",model_name="m"'
        accepted = 1.5 * d if t <= T0 + 200 else 1.5 * 20_000 + 0.5 * (d - 20_000)  # AL 2.5, then 1.5
        return (f"{V1}drafts_total{{{lab}}} {d:.0f}\n{V1}draft_tokens_total{{{lab}}} {3 * d:.0f}\n"
                f"{V1}accepted_tokens_total{{{lab}}} {accepted:.0f}\n").encode()

    async def go():
        async with Sidecar(serve, T0) as s:
            await s.poll_until(T0 + 400)
            # The charts' cache (the last render's) tells k unknown from k = 1 (helper-45: one key for both).
            import dataclasses

            from vllm_specdec_exporter.landing import _trend
            from vllm_specdec_exporter.web import SETTINGS

            mv, cache, kept = s.model(), {}, {}
            _trend(mv, s.app[SETTINGS], T0 + 400, None, None, cache)
            again = _trend(dataclasses.replace(mv, k=1), s.app[SETTINGS], T0 + 400, None, cache, kept)
            # (AL 2.5 over k + 1 = 2, as after a rollout from a higher k, is drawn to scale and said.)
            assert again.count("<svg") == 2 and "1 to 2.50, k having been higher" in again
            return await s.page()

    page = run(go())
    heights = al_heights(page)
    # 90 px from 1 to 2.5: AL 2.5 at the top (0), AL 1.5 at 90 x (2.5 - 1.5) / 1.5 = 60 (the step
    # across the change between them); on 1 to 2, 1.5 was at 45 and 2.5 cut to the top.
    assert {0.0, 60.0} <= heights and all(0 <= h <= 60 for h in heights), heights
    # No per-position chart and no per-position legend: there is nothing to draw per position.
    assert page.count("<svg") == 1 and "acceptance per position none (no per-position counters)" in page
    assert "(blue; 1 up, k unknown;" in page and "k+1 = 2" not in page


def test_the_charts_are_built_again_only_when_a_step_added_a_point(monkeypatch):
    import vllm_specdec_exporter.landing as landing

    built = []
    monkeypatch.setattr(landing, "_charts", lambda *a: built.append(1) or "<svg></svg>")

    async def go():
        async with harness("healthy") as h:
            await h.run_for(120)  # two 1-minute steps
            pages = [(await h.get("/"))[1] for _ in range(3)]
            assert len(built) == 1 and all("<svg></svg>" in p for p in pages)  # the same step: drawn once
            await h.run_for(30)  # within the step: the last poll moves, the charts do not
            await h.get("/")
            assert len(built) == 1
            await h.run_for(30)  # a new step: drawn again
            await h.get("/")
            assert len(built) == 2

    run(go())


def test_no_more_charts_than_the_cap(monkeypatch):
    import vllm_specdec_exporter.landing as landing

    monkeypatch.setattr(landing, "LANDING_CHARTS", 1)

    async def go():
        async with harness(["healthy", "demo"]) as h:  # two targets, the same model: two sections
            await h.run_for(120)
            _, page = await h.get("/")
            assert page.count("<figure class=trend>") == 1
            assert "Charts drawn for the first 1 models only; 1 more have none." in page

    run(go())


def test_no_chart_without_enough_drafts():
    async def go():
        async with harness("healthy", {"min_drafts": 10**9}) as h:
            await h.run_for(180)
            _, page = await h.get("/")
            assert "<svg" not in page

    run(go())


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


def test_a_k_lowered_within_the_hour_keeps_its_earlier_acceptance_length_to_scale():
    """Stop 56 noticed: the chart spanned 1 to the new k + 1, so a rollout from k=4 (AL 4.5) to k=2
    (AL 2.5) within the hour drew the earlier points at 3, the chart's top."""
    from sidecar_harness import T0, V1, Sidecar

    def serve(t: float) -> bytes:
        second = t > T0 + 200  # a rollout to k=2: a new process, its counters from zero
        k, al, start = (2, 2.5, T0 + 200) if second else (4, 4.5, T0)
        d, lab = 100 * (t - start), 'engine="0",model_name="m"'
        per_pos = (0.8, 0.7) if second else (0.95, 0.9, 0.85, 0.8)  # sums to AL - 1
        return (f"{V1}drafts_total{{{lab}}} {d:.0f}\n{V1}drafts_created{{{lab}}} {start!r}\n"
                f"{V1}draft_tokens_total{{{lab}}} {k * d:.0f}\n{V1}accepted_tokens_total{{{lab}}} {(al - 1) * d:.0f}\n"
                + "".join(f'{V1}accepted_tokens_per_pos_total{{{lab},position="{i}"}} {s * d:.0f}\n'
                          for i, s in enumerate(per_pos))).encode()

    async def go():
        async with Sidecar(serve, T0) as s:
            await s.poll_until(T0 + 500)
            assert s.model().k == 2
            return await s.page()

    page = run(go())
    heights = al_heights(page)
    # 90 px from 1 to 4.5: AL 4.5 at the top (0), AL 2.5 at 90 x (4.5 - 2.5) / 3.5 = 51.4; on 1 to 3
    # (the new k + 1) 2.5 was at 22.5 and 4.5 cut to the top.
    assert {0.0, 51.4} <= heights and all(0 <= h <= 51.4 for h in heights), heights
    assert "(blue; 1 to 4.50, k having been higher within the window;" in page and "k+1 = 3" not in page
