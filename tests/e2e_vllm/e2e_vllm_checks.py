"""The real vLLM, end to end: `vllm serve` with speculative decoding, the real exporter.

Run by `make e2e-vllm` (and so by `make test` and CI), which first builds the vLLM
venv (setup_env.sh). The file name keeps it out of the plain `pytest` run: it starts
five vLLM servers, so it runs once, on its own.

The oracle is vLLM itself: with one API server vLLM logs a `SpecDecoding metrics`
line per stats interval, and an interval bracketed by two quiet moments must read the
same in the exporter's `diff` as in that line. In every configuration the exporter's
counters must equal vLLM's raw counters.

The five servers boot in turn, four at a time, on their own ports. Order matters and is the order
below: the sidecar polls ngram, a separate draft model is checked (its own sidecar), then the
sidecar polls EAGLE through the URL it polled ngram through (for the sidecar, a vLLM restart
mid-run), then data parallel 2 and spec decode off are checked.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, cli_json, cli_path, require, run_cli

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from driver import (
    MODEL_NAME,
    NGRAM,
    E2EError,
    Forwarder,
    K,
    Sidecar,
    SpecLine,
    VllmServer,
    drive_load,
    free_port,
    pick,
    samples,
    settle,
    wait_for,
)
from model_cache import model_dir

E2E = Path(os.environ.get("E2E_VLLM_DIR", REPO / ".e2e"))
VENV = E2E / "venv"
PINS_STAMP = VENV / ".e2e-installed"
RAW = "vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total", \
    "vllm:spec_decode_num_accepted_tokens_total"
EXPORTED = {"vllm:spec_decode_num_drafts_total": "vllm_specdec_drafts_total",
            "vllm:spec_decode_num_draft_tokens_total": "vllm_specdec_draft_tokens_total",
            "vllm:spec_decode_num_accepted_tokens_total": "vllm_specdec_accepted_tokens_total",
            "vllm:spec_decode_num_accepted_tokens_per_pos_total": "vllm_specdec_position_accepted_tokens_total",
            "vllm:generation_tokens_total": "vllm_specdec_generation_tokens_total"}

ALIVE = 4  # vLLM servers at once
AFTER = {"eagle": "ngram"}  # launched only once the other serves (Run.launch_all)
pytestmark = pytest.mark.timeout(1200)


class Run:
    """What the checks share: paths, the servers, the forwarder and sidecar, timings, figures."""

    def __init__(self, model: Path, scratch: Path):
        self.model, self.scratch, self.cache = model, scratch, E2E / "cache"
        self.servers: dict[str, VllmServer] = {}
        self.forwarder = Forwarder()
        self.sidecar: Sidecar | None = None
        self.timings: dict[str, float] = {}
        self.figures: list[dict] = []
        self.totals: dict[str, float] = {}  # drafts per configuration behind the forwarder

    def launch_all(self) -> None:
        """The servers boot in this order, at most ALIVE at a time (about 2.2 GB each with the
        uniprocess executor, DP=2 about twice that; the machine is shared): vLLM takes one to four
        minutes to start on two busy cores, and booting them one after the other would add those
        up. Each stop makes room for the next. DP=2, the biggest boot, is in the first four: last
        of five three at a time, its check waited 97 s for it.

        EAGLE boots only once ngram serves (AFTER): behind the forwarder it plays ngram
        restarted, and the sidecar tells a restart by the engine's start time (_created); an
        EAGLE that booted beside ngram and happened to start first reads as an older server
        answering, not a restart (seen with four at a time: draft, EAGLE, ngram ready in that
        order). The draft model's check runs between ngram's and EAGLE's while EAGLE boots."""
        eagle = {"method": "eagle", "model": str(self.model / "eagle"), "num_speculative_tokens": K}
        draft = {"method": "draft_model", "model": str(self.model / "draft"), "num_speculative_tokens": K}
        for name, spec, extra in (("ngram", NGRAM, ()), ("draft", draft, ()),
                                  ("dp2", NGRAM, ("--data-parallel-size", "2", "--max-num-seqs", "4")),
                                  ("eagle", eagle, ()), ("no-spec", None, ())):
            self.servers[name] = VllmServer(VENV, self.model, self.scratch, self.cache, name, free_port(), spec, extra)
        self.top_up()

    def top_up(self) -> None:
        """Launch the next servers in order while fewer than ALIVE run; one waiting for its
        AFTER server to serve holds back the ones behind it."""
        for name, server in self.servers.items():
            if sum(1 for s in self.servers.values() if s.proc is not None and s.proc.poll() is None) >= ALIVE:
                return
            if server.proc is None:
                if name in AFTER and self.servers[AFTER[name]].started_seconds is None:
                    return
                server.launch()

    def stop(self, name: str) -> None:
        self.servers[name].stop()
        self.top_up()

    def ready(self, name: str) -> VllmServer:
        self.top_up()
        server = self.servers[name]
        server.wait_ready()
        self.timings[f"start {name}"] = server.started_seconds
        self.top_up()  # a server waiting for this one to serve
        return server

    def close(self) -> None:
        if self.sidecar is not None:
            self.sidecar.stop()
        for server in self.servers.values():
            if server.proc is not None:
                server.stop()
        self.forwarder.close()


def build_model() -> Path:
    """The tiny model: setup_env.sh builds it while pip runs; rebuilt here only when the builder changed."""
    out = model_dir(E2E / "models")
    if not (out / ".built").exists():
        subprocess.run([str(VENV / "bin" / "python"), str(HERE / "build_model.py"), str(E2E / "models")], check=True,
                       env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}, timeout=600)
    return out


@pytest.fixture(scope="module")
def run(request):
    require(PINS_STAMP.exists(), f"the vLLM venv {VENV} (make e2e-vllm builds it with tests/e2e_vllm/setup_env.sh)")
    require(bool(cli_path()), "the vllm-specdec-exporter console script")
    started = time.monotonic()
    model = build_model()
    scratch = E2E / "run"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    r = Run(model, scratch)
    r.timings["model (build or reuse)"] = time.monotonic() - started
    try:
        r.launch_all()
        yield r
    finally:
        r.close()
        r.timings["e2e checks total"] = time.monotonic() - started
        summary = {"timings_seconds": {k: round(v, 1) for k, v in r.timings.items()}, "intervals": r.figures}
        (scratch / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        report_summary(request.config, summary)


def report_summary(config, summary: dict) -> None:
    """Timings and the exporter's figures next to vLLM's log line, on the terminal (not captured)."""
    lines = ["", "e2e-vllm: " + ", ".join(f"{k} {v:.0f} s" for k, v in summary["timings_seconds"].items())]
    for f in summary["intervals"]:
        for who in ("exporter", "vllm_log"):
            x = f[who]
            lines.append(f"  {f['config']:<6} {who:<8} AL {x['mean_acceptance_length']:.4f}  accepted {x['accepted']:>5}"
                         f"  drafted {x['drafted']:>5}  rate {x['acceptance_rate_percent']:.2f} %  per position "
                         + " ".join(f"{p:.4f}" for p in x["per_position"]))
    with config.pluginmanager.getplugin("capturemanager").global_and_fixture_disabled():
        print("\n".join(lines), flush=True)


# --- helpers -----------------------------------------------------------------------

def raw_by_engine(text: str, name: str) -> dict[tuple[str, ...], float]:
    """vLLM's raw samples of ``name`` for our model, keyed by (engine[, position])."""
    out = {}
    for labels, v in pick(samples(text), name, model_name=MODEL_NAME).items():
        d = dict(labels)
        out[(d["engine"], *([d["position"]] if "position" in d else []))] = v
    return out


def assert_exported_equals_raw(exported: dict, raw_text: str, engines: set[str]) -> None:
    """Every exported counter equals vLLM's own, engine by engine (and position by position)."""
    for raw_name, name in EXPORTED.items():
        raw = raw_by_engine(raw_text, raw_name)
        assert {key[0] for key in raw} == engines, f"{raw_name}: engines {sorted(raw)}"
        got = {}
        for labels, v in pick(exported, name, target="vllm", model_name=MODEL_NAME).items():
            d = dict(labels)
            got[(d["engine"], *([d["position"]] if "position" in d else []))] = v
        assert got == raw, f"{name} != {raw_name}: exporter {got}, vLLM {raw}"


def oracle_interval(r: Run, server: VllmServer, label: str, requests: int, max_tokens: int) -> tuple[dict, SpecLine]:
    """An interval vLLM logs in exactly one SpecDecoding line, read by the exporter's `diff`.

    Bracketed by quiet moments right after a stats tick (``settle``), so the line logged
    after the load covers the load and nothing else. A load that spans a tick is logged
    in two lines: then the interval is taken again.
    """
    for _ in range(3):
        settle(server)
        n0 = len(server.spec_lines())
        before = server.metrics()
        drive_load(server.url, requests, max_tokens, to_the_limit=3)
        settle(server)
        after = server.metrics()
        lines = server.spec_lines()[n0:]
        if len(lines) == 1:
            break
    else:
        raise E2EError(f"{label}: every interval spanned a stats tick ({len(lines)} lines)")
    (r.scratch / f"{label}-before.prom").write_text(before)
    (r.scratch / f"{label}-after.prom").write_text(after)
    (r.scratch / f"{label}-line.log").write_text(lines[0].text + "\n")
    out = cli_json("diff", str(r.scratch / f"{label}-before.prom"), str(r.scratch / f"{label}-after.prom"))
    return out, lines[0]


def assert_matches_log(label: str, r: Run, out: dict, line: SpecLine) -> dict:
    st = out["models"][MODEL_NAME]["all"]
    figures = {
        "config": label,
        "exporter": {"mean_acceptance_length": st["mean_acceptance_length"], "accepted": st["num_accepted_tokens"],
                     "drafted": st["num_draft_tokens"], "per_position": st["per_position_acceptance"],
                     "acceptance_rate_percent": st["acceptance_rate"] * 100},
        "vllm_log": {"mean_acceptance_length": line.mean_acceptance_length, "accepted": line.accepted,
                     "drafted": line.drafted, "per_position": list(line.per_position),
                     "acceptance_rate_percent": line.acceptance_percent},
    }
    r.figures.append(figures)
    assert st["num_accepted_tokens"] == line.accepted, figures
    assert st["num_draft_tokens"] == line.drafted, figures
    # vLLM prints AL with 2 decimals, per-position rates with 3, the rate in % with 1.
    assert abs(st["mean_acceptance_length"] - line.mean_acceptance_length) <= 0.005 + 1e-9, figures
    assert len(st["per_position_acceptance"]) == len(line.per_position) == K, figures
    for ours, theirs in zip(st["per_position_acceptance"], line.per_position, strict=True):
        assert abs(ours - theirs) <= 0.0005 + 1e-9, figures
    assert abs(st["acceptance_rate"] * 100 - line.acceptance_percent) <= 0.05 + 1e-9, figures
    assert st["num_drafts"] > 0
    return figures


def check_config(r: Run, server: VllmServer, label: str, sidecar: Sidecar | None = None) -> dict:
    """Warm up, take one oracle interval, then compare the sidecar (the shared one unless
    given) and `report` with vLLM's counters."""
    drive_load(server.url, 4, 32)  # a first load: later ticks are logged even when idle again
    out, line = oracle_interval(r, server, label, requests=6, max_tokens=48)
    figures = assert_matches_log(label, r, out, line)
    raw = server.metrics()
    assert_exported_equals_raw((sidecar or r.sidecar).caught_up(), raw, {"0"})
    # `report` against the live vLLM: totals since start equal the raw counters, and all
    # of vLLM's SpecDecoding lines since start add up to them too.
    totals = cli_json("report", server.url + "/metrics")["models"][MODEL_NAME]["all"]
    assert totals["num_drafts"] == raw_by_engine(raw, RAW[0])[("0",)]
    assert totals["num_accepted_tokens"] == sum(x.accepted for x in server.spec_lines())
    assert totals["num_draft_tokens"] == sum(x.drafted for x in server.spec_lines())
    r.totals[label] = totals["num_drafts"]
    return figures


# --- the checks, in order ----------------------------------------------------------------

def test_ngram_one_api_server_matches_vllms_own_log(run):
    server = run.ready("ngram")
    raw = server.metrics()
    # One API server: plain prometheus_client, with _created gauges; every series at 0 from the start.
    assert pick(samples(raw), "vllm:spec_decode_num_drafts_created", engine="0"), "no _created with one API server"
    assert set(raw_by_engine(raw, "vllm:spec_decode_num_accepted_tokens_per_pos_total")) == {("0", str(i)) for i in range(K)}
    run.forwarder.backend = server.port
    run.sidecar = Sidecar(cli_path(), run.scratch, "exporter", run.forwarder.url)
    figures = check_config(run, server, "ngram")
    assert figures["exporter"]["drafted"] > 0


def test_draft_model_matches_vllms_own_log(run):
    # A separate small model (1 layer, the target's tokenizer) drafts k tokens at every step.
    server = run.ready("draft")
    sidecar = Sidecar(cli_path(), run.scratch, "exporter-draft", server.url)
    try:
        figures = check_config(run, server, "draft", sidecar)
        assert figures["exporter"]["drafted"] > 0 and figures["exporter"]["accepted"] > 0, figures
    finally:
        sidecar.stop()
        run.stop("draft")


def test_eagle_after_a_restart_matches_vllms_own_log(run):
    require(run.sidecar is not None and "ngram" in run.totals, "the ngram run before this one")
    sidecar = run.sidecar
    restarts = sum(pick(sidecar.metrics(), "vllm_specdec_exporter_engine_restarts_total").values())
    # The URL the sidecar polls goes down, then comes back served by a fresh vLLM with the
    # same model name and its counters back at zero.
    run.stop("ngram")
    wait_for(lambda: pick(sidecar.metrics(), "vllm_specdec_up", target="vllm") == {frozenset({("target", "vllm")}): 0.0},
             60, "the sidecar to see vLLM down")
    server = run.ready("eagle")
    run.forwarder.backend = server.port
    # The sidecar's first poll of the new server must see its counters at zero, as after
    # a real restart; load sent before that poll could lift one counter above the old
    # server's and make the poll read as inconsistent instead.
    sidecar.caught_up()
    figures = check_config(run, server, "eagle")
    after = sidecar.caught_up()
    assert sum(pick(after, "vllm_specdec_exporter_engine_restarts_total").values()) == restarts + 1
    # Handled as a restart: the 1h window holds everything drafted by both servers, not a
    # negative step and not only the second server's share.
    window = pick(after, "vllm_specdec_window_drafts", window="1h")
    assert list(window.values()) == [run.totals["ngram"] + run.totals["eagle"]], window
    # A head trained for seconds: position 0 is usually right, later ones less and less.
    pos = figures["vllm_log"]["per_position"]
    assert pos[0] > 0.5 and pos[0] > pos[1] >= pos[2], pos
    run.stop("eagle")  # give its cores to the servers still to be checked


def test_data_parallel_2_multiprocess_mode(run):
    server = run.ready("dp2")
    sidecar = None
    try:
        drive_load(server.url, 8, 32)
        raw = server.metrics()
        (run.scratch / "dp2.prom").write_text(raw)
        found = samples(raw)
        # More than one API server: prometheus_client in multiprocess mode, no _created.
        assert not [n for n, _ in found if n.endswith("_created")], "_created with two API servers"
        drafts = raw_by_engine(raw, RAW[0])
        assert set(drafts) == {("0",), ("1",)}, drafts
        sidecar = Sidecar(cli_path(), run.scratch, "exporter-dp2", server.url)
        assert_exported_equals_raw(sidecar.caught_up(), raw, {"0", "1"})
        totals = cli_json("report", server.url + "/metrics")["models"][MODEL_NAME]
        assert set(totals["engines"]) == {"0", "1"}
        for raw_name, key in zip(RAW, ("num_drafts", "num_draft_tokens", "num_accepted_tokens"), strict=True):
            by_engine = raw_by_engine(raw, raw_name)
            assert totals["all"][key] == sum(by_engine.values()), (raw_name, totals["all"], by_engine)
            for e in ("0", "1"):
                assert totals["engines"][e][key] == by_engine[(e,)]
        assert sum(drafts.values()) > 0
    finally:
        if sidecar is not None:
            sidecar.stop()
        server.stop()


def test_spec_decode_off_reads_as_such(run):
    server = run.ready("no-spec")
    sidecar = Sidecar(cli_path(), run.scratch, "exporter-no-spec", server.url)
    try:
        drive_load(server.url, 2, 16)
        raw = server.metrics()
        (run.scratch / "no-spec.prom").write_text(raw)
        assert "vllm:spec_decode" not in raw, "spec-decode families with spec decode off"
        res = run_cli("report", server.url + "/metrics")
        assert res.returncode == 2, res
        assert b"spec" in res.stderr.lower() and len(res.stderr.strip().splitlines()) == 1, res.stderr
        exported = sidecar.caught_up("no_spec_decode")
        assert pick(exported, "vllm_specdec_up", target="vllm") == {frozenset({("target", "vllm")}): 1.0}
        assert not pick(exported, "vllm_specdec_drafts_total"), "drafts exported with spec decode off"
        gen = raw_by_engine(raw, "vllm:generation_tokens_total")
        assert gen[("0",)] >= 32
        exported_gen = {dict(k)["engine"]: v for k, v in pick(exported, "vllm_specdec_generation_tokens_total").items()}
        assert exported_gen == {"0": gen[("0",)]}
    finally:
        sidecar.stop()
        run.stop("no-spec")
