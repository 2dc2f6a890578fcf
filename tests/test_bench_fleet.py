"""bench/bench_fleet.py's history model: every recorded series the shipped rules read over a
range gets a day of history before they load (a 10,000-engine run takes ~25 minutes, and a
record added without a model stopped it at once: 816773c's position-0 history, found at stop 41)."""

from __future__ import annotations

import sys

import pytest
from conftest import REPO
from vllm_specdec_exporter.generators import rules

sys.path.insert(0, str(REPO / "bench"))
import bench_fleet


@pytest.fixture(scope="module")
def payloads(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """One pod's sidecar and vLLM /metrics, captured from the real programs as the bench does."""
    return bench_fleet.capture_payloads(tmp_path_factory.mktemp("capture"))


@pytest.mark.parametrize("variant", ["sidecar", "vllm-direct"])
def test_every_recorded_series_read_over_a_range_has_a_history(variant: str, payloads: tuple[str, str]):
    text = rules.dump(rules.rule_file(variant), "")
    fleet = bench_fleet.build_fleet(variant, 2, *payloads, 0.0, text)
    history = bench_fleet.recorded_history(fleet, rules.default_options(), text)
    _, needs = bench_fleet.read_over_range(text)
    assert {name for name, *_ in history} == set(needs)
    # The position-0 history of the model: the simulator's 0.9 at position 0 (capture_payloads).
    p0 = [v for name, labels, v, _ in history if name.endswith(":vllm_specdec_position0_acceptance_ratio:ratio_rate1h")]
    assert p0 and all(v == pytest.approx(0.9, abs=0.02) for v in p0), p0
    # The drafts the positions are divided by (recorded with them) are the drafts, one series a server,
    # not a series a position (the first model of it took them for positions: many-to-many in every ratio).
    drafts = {(name.split(":")[0], labels.get("pod"), v) for name, labels, v, _ in history
              if name.split(":")[1] == "vllm_specdec_drafts" and name.endswith(":rate5m") and "engine" not in labels}
    read_with = [(name.split(":")[0], labels, v) for name, labels, v, _ in history if ":vllm_specdec_position_drafts:rate5m" in name]
    assert read_with and all("position" not in labels for _, labels, _ in read_with), read_with
    assert {(level, labels.get("pod"), v) for level, labels, v in read_with} <= drafts


def test_each_groups_last_evaluation_is_read_by_its_own_name_after_the_file():
    """The reference ratio reads the reference group's durations as the rules' are read: a group's
    name after "<file>;", never a longer name that starts with it."""
    key = 'prometheus_rule_group_last_{}{{rule_group="/tmp/b/{}.yaml;{}"}}'
    pm = {
        key.format("duration_seconds", "rules", "recording"): 0.5,
        key.format("evaluation_timestamp_seconds", "rules", "recording"): 100.0,
        key.format("duration_seconds", "rules", "recording-long"): 2.0,
        key.format("evaluation_timestamp_seconds", "rules", "recording-long"): 90.0,
        key.format("duration_seconds", "reference", "reference"): 0.25,  # not yet evaluated: no timestamp
    }
    assert bench_fleet.evaluations(pm, ["recording"]) == {"recording": (100.0, 0.5)}
    assert bench_fleet.evaluations(pm, ["recording-long", "reference"]) == {"recording-long": (90.0, 2.0)}
    assert bench_fleet.median([0.3, 0.1, 0.2]) == 0.2
    assert bench_fleet.median([]) != bench_fleet.median([])  # nan: no evaluation is no figure


def test_a_cpu_window_spans_whole_garbage_collection_cycles(monkeypatch: pytest.MonkeyPatch):
    """A collection marks the whole heap (~1.5 CPU s at 10,000 engines), a few a window: the window
    starts at the end of one and ends at the end of the first one at least ``seconds`` later, so it
    holds whole cycles (a window cut by the clock held two or three in one run: 0.82 and 0.96 CPU s)."""
    clock = {"t": 0.0}
    # (time, collections so far, Prometheus's CPU seconds so far), one a poll
    polls = iter([(0, 5, 0), (10, 5, 1), (20, 6, 3), (200, 7, 20), (320, 7, 30), (330, 7, 31), (345, 8, 35), (350, 9, 36)])

    def metrics() -> dict[str, float]:  # prom_metrics' read at each poll
        t, n, cpu = next(polls)
        clock["t"], clock["cpu"] = t, cpu
        return {"go_gc_duration_seconds_count": n}

    monkeypatch.setattr(bench_fleet, "cpu_seconds", lambda pid: clock["cpu"])
    monkeypatch.setattr(bench_fleet.time, "monotonic", lambda: clock["t"])
    monkeypatch.setattr(bench_fleet.time, "time", lambda: 5000 + clock["t"])  # Unix time, as evaluations are stamped
    w = bench_fleet.CpuWindow(metrics(), 1, seconds=300)  # the first read: 5 collections
    got = [w.poll(metrics()) for _ in range(6)]
    # Starts at the 6th collection's end (t=20, 3 CPU s); 300 s later (t=320) 7 have ended; the 8th
    # ends the window at t=345: two whole cycles in 325 s, 32 CPU s.
    assert got[:5] == [None] * 5
    assert got[5] == pytest.approx(32 / 325)
    assert (w.cycles, w.length) == (2, 325)
    assert w.span == (5020, 5345)


def test_a_cpu_window_that_holds_a_compaction_starts_again(monkeypatch: pytest.MonkeyPatch):
    """Prometheus compacts its head at every odd UTC hour here, 4-7 CPU s more at 10,000 engines: in a
    window of the rules, up to 0.6 CPU s an interval charged to them (stop 66 saw one in the scraping
    window after the rules). A window that holds one starts again at the next collection's end."""
    clock = {"t": 0.0}
    # (time, collections so far, compactions so far, Prometheus's CPU seconds so far), one a poll
    polls = iter([(0, 5, 15, 0), (20, 6, 15, 3), (200, 7, 15, 20), (230, 7, 17, 30), (240, 8, 17, 38),
                  (250, 8, 17, 39), (550, 9, 17, 70), (560, 10, 17, 72)])

    def metrics() -> dict[str, float]:
        t, n, compactions, cpu = next(polls)
        clock["t"], clock["cpu"] = t, cpu
        return {"go_gc_duration_seconds_count": n, "prometheus_tsdb_compactions_total": compactions}

    monkeypatch.setattr(bench_fleet, "cpu_seconds", lambda pid: clock["cpu"])
    monkeypatch.setattr(bench_fleet.time, "monotonic", lambda: clock["t"])
    monkeypatch.setattr(bench_fleet.time, "time", lambda: 5000 + clock["t"])
    w = bench_fleet.CpuWindow(metrics(), 1, seconds=300)
    got = [w.poll(metrics()) for _ in range(7)]
    # Started at t=20; the compaction seen at t=230 voids it (210 s lost); it starts again at the
    # 8th collection's end (t=240, 38 CPU s) and ends at the 10th's (t=560): 34 CPU s in 320 s.
    assert got[:6] == [None] * 6
    assert got[6] == pytest.approx(34 / 320)
    assert (w.restarts, w.lost, w.cycles, w.length, w.span) == (1, 210, 2, 320, (5240, 5560))


def test_each_group_is_charged_its_share_of_the_rules_window():
    """The rules' window ends at a collection, not at an evaluation: one of 389 s held two evaluations
    of a 3-minute group whose share was 2.16 (stop 60). The window's CPU is scaled by the evaluation
    time its length calls for over the evaluation time it held; an evaluation counts where it ended."""
    w = bench_fleet.CpuWindow({"go_gc_duration_seconds_count": 0}, 1, seconds=360)
    w.span, w.length = (1000.0, 1389.0), 389.0
    # Every 30 s, 0.8 s each: the first straddles the start (ends at 1000.3: held); 13 held,
    # the one starting at 1389.5 is after the end.
    fast = {999.5 + 30 * k: 0.8 for k in range(14)}
    # Every 3 minutes, 3 s each: 847 ended before the start; 1387 straddles the end (ends at 1390: not held).
    slow = {847.0: 3.0, 1027.0: 3.0, 1207.0: 3.0, 1387.0: 3.0}
    medians = {"fast": 0.8, "slow": 3.0}
    share = bench_fleet.share_of_window(w, {"fast": fast, "slow": slow}, medians, {"fast": 30.0, "slow": 180.0})
    assert share == pytest.approx((389 / 30 * 0.8 + 389 / 180 * 3.0) / (13 * 0.8 + 2 * 3.0))
    assert share == pytest.approx(1.0278, abs=1e-4)
    # A window that held each group's exact share is not scaled.
    w.span, w.length = (1000.0, 1360.0), 360.0
    exact = {"fast": {1000.0 + 30 * k: 0.8 for k in range(12)}, "slow": {1100.0: 3.0, 1280.0: 3.0}}
    assert bench_fleet.share_of_window(w, exact, medians, {"fast": 30.0, "slow": 180.0}) == pytest.approx(1.0)


def test_rule_files_alternate_in_one_prometheus_each_charged_net_of_scraping(monkeypatch: pytest.MonkeyPatch, tmp_path):
    """`--alternate`: the shipped rules and another file measured in turn in the same Prometheus
    (stop 63 compared three forms of the per-engine rates so), each once every group of it has
    evaluated since its reload, over whole collection cycles, net of scraping alone. A fake
    Prometheus here: a collection every 40 s, scraping 0.05 cores, each file's rules their own cores."""
    cores = {"shipped": 0.10, "inline": 0.12}  # what each file costs beyond scraping
    files = {}
    for name in cores:
        files[name] = tmp_path / f"{name}.yaml"
        files[name].write_text("groups:\n- name: fast\n  rules: []\n- name: slow\n  interval: 3m\n  rules: []\n")
    clock = {"t": 0.0, "cpu": 0.0, "loaded": None, "at": 0.0}
    loads = []

    def sleep(dt: float) -> None:
        clock["t"] += dt
        clock["cpu"] += dt * (0.05 + (cores[clock["loaded"]] if clock["loaded"] else 0.0))

    def load(paths: list[str]) -> None:
        loads.append([bench_fleet.Path(p).stem for p in paths])
        clock["loaded"], clock["at"] = loads[-1][0], clock["t"]

    def prom_metrics(base: str) -> dict[str, float]:
        pm = {"go_gc_duration_seconds_count": float(clock["t"] // 40)}
        path = files[clock["loaded"]]
        for group, every in (("fast", 30.0), ("slow", 180.0)):
            since = clock["t"] - clock["at"]
            if since >= 1:  # each group evaluates a second after the reload, then every interval
                last = clock["at"] + 1 + (since - 1) // every * every
                pm[f'prometheus_rule_group_last_evaluation_timestamp_seconds{{rule_group="{path};{group}"}}'] = 5000 + last
                pm[f'prometheus_rule_group_last_duration_seconds{{rule_group="{path};{group}"}}'] = 0.5
        return pm

    monkeypatch.setattr(bench_fleet.time, "sleep", sleep)
    monkeypatch.setattr(bench_fleet.time, "monotonic", lambda: clock["t"])
    monkeypatch.setattr(bench_fleet.time, "time", lambda: 5000 + clock["t"])
    monkeypatch.setattr(bench_fleet, "cpu_seconds", lambda pid: clock["cpu"])
    monkeypatch.setattr(bench_fleet, "prom_metrics", prom_metrics)
    got = bench_fleet.alternate("http://x", 1, load, files, rounds=2, scrape_cpu=0.05)
    assert loads == [["shipped"], ["inline"], ["shipped"], ["inline"]]
    # Each figure is its file's own cores x 30 s (the share of the window is about 1 here: even groups).
    for name, figures in got.items():
        assert len(figures) == 2
        assert figures == [pytest.approx(cores[name] * 30, rel=0.05)] * 2, (name, figures)


@pytest.mark.parametrize("given, said", [
    ("vllm=rules.yaml", "VARIANT one of ['sidecar', 'vllm-direct']"),
    ("vllm-direct=missing.yaml", "no such file 'missing.yaml'"),
    ("vllm-direct=shipped.yaml", "name each file apart, and not 'shipped'"),
])
def test_alternate_files_are_checked_before_a_run(given: str, said: str, tmp_path, monkeypatch: pytest.MonkeyPatch):
    """A mistyped --alternate fails at once on one line, not after half an hour of benchmark."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rules.yaml").write_text("groups: []\n")
    (tmp_path / "shipped.yaml").write_text("groups: []\n")
    monkeypatch.setattr(bench_fleet, "capture_payloads", lambda tmp: pytest.fail("the run started"))
    with pytest.raises(SystemExit) as e:
        bench_fleet.main(["--engines", "80", "--alternate", given])
    assert said in str(e.value) and given in str(e.value)


def test_two_alternate_files_need_two_names(tmp_path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for d in ("a", "b"):
        (tmp_path / d / "same.yaml").write_text("groups: []\n")
    monkeypatch.setattr(bench_fleet, "capture_payloads", lambda tmp: pytest.fail("the run started"))
    with pytest.raises(SystemExit, match="name each file apart"):
        bench_fleet.main(["--alternate", f"vllm-direct={tmp_path / 'a' / 'same.yaml'}",
                          "--alternate", f"vllm-direct={tmp_path / 'b' / 'same.yaml'}"])


# The figures of a run that main's summary lines read, for a stubbed run.
READ_BY_MAIN = {"rule_eval_seconds": 0.5, "rule_eval_long_share": 0.01, "rules_cpu_seconds_per_interval": 0.4,
                "recorded_series_per_engine": 6.5, "rss_mb": 300.0, "rules_cpu_to_reference_ratio": 3.0,
                "rules_cpu_to_scrape_ratio": 1.5, "rule_eval_to_reference_eval_ratio": 3.5, "load_average": 0.2}


def test_every_figure_of_a_run_is_printed(tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """main prints each figure run returns: a second hand-kept list of names once computed the heap
    goals and dropped them."""
    figures = {**READ_BY_MAIN, "engines": 80, "heap_goal_mb_rules": 123.456, "a_figure_added_later": 7.25}
    monkeypatch.setattr(bench_fleet, "capture_payloads", lambda tmp: ("", ""))
    monkeypatch.setattr(bench_fleet, "run", lambda *a: dict(figures))
    assert bench_fleet.main(["--engines", "80", "--variants", "vllm-direct"]) == 0
    out = capsys.readouterr().out
    assert "fleet_vllm_direct_80_heap_goal_mb_rules: 123.456\n" in out
    assert "fleet_vllm_direct_80_a_figure_added_later: 7.250\n" in out
    assert "fleet_vllm_direct_80_engines: 80\n" in out


def test_prometheus_runs_with_the_documented_gogc_unless_told(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """The bench runs Prometheus as docs/scale.md sizes it (GOGC=200), so the command an outsider
    types reproduces the documented figures; $GOGC or --gogc measure another setting, and say so."""
    given: list[str] = []
    monkeypatch.setattr(bench_fleet, "capture_payloads", lambda tmp: ("", ""))
    monkeypatch.setattr(bench_fleet, "run", lambda *a: given.append(a[-1]) or dict(READ_BY_MAIN))
    monkeypatch.delenv("GOGC", raising=False)
    for argv, env, want in ((), None, "200"), (("--gogc", "100"), None, "100"), ((), "150", "150"), (("--gogc", "off"), "150", "off"):
        if env:
            monkeypatch.setenv("GOGC", env)
        assert bench_fleet.main(["--engines", "80", "--variants", "vllm-direct", *argv]) == 0
        assert given.pop() == want
        assert f"fleet_prometheus_gogc: {want}\n" in capsys.readouterr().out


@pytest.mark.parametrize("bad", ["0", "-5", "2OO", "", "200 ", "\u00b2", "Off"])
def test_a_bad_gogc_is_refused_before_a_run(bad: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(bench_fleet, "capture_payloads", lambda tmp: pytest.fail("ran"))
    with pytest.raises(SystemExit, match=f"--gogc '{bad}': want a positive whole percentage"):
        bench_fleet.main(["--engines", "80", "--gogc", bad])
