"""The simulator's payloads are real vLLM payloads to our parser and to prometheus_client."""

from __future__ import annotations

import pytest
from conftest import run_cli
from prometheus_client.parser import text_string_to_metric_families
from vllm_specdec_exporter.adapters import extract
from vllm_specdec_exporter.derive import invariant_violations
from vllm_specdec_exporter.scenarios import builtin_scenarios, load_scenario, parse_scenario
from vllm_specdec_exporter.settings import ConfigError
from vllm_specdec_exporter.simulate import Simulation


@pytest.mark.parametrize("name", builtin_scenarios())
def test_every_scenario_keeps_vllms_invariants(name):
    sim = Simulation(load_scenario(name), clock=lambda: 0.0)
    for t in range(0, 400, 7):
        sim.advance_to(float(t))
        body = sim.render()
        snap = extract(body)
        assert snap.warnings == ()
        for key, counters in snap.engines.items():
            assert invariant_violations(counters, str(key)) == []
    # prometheus_client reads it too; single-process payloads carry _created
    names = {f.name for f in text_string_to_metric_families(body.decode())}
    assert "vllm:spec_decode_num_drafts" in names
    assert ("vllm:spec_decode_num_drafts_created" in names) == (sim.scenario.form == "single-process")


def test_eight_engine_payload_has_the_real_shape():
    body = Simulation(load_scenario("healthy"), clock=lambda: 0.0).render()
    assert 250_000 < len(body) < 400_000  # a real TP=8/DP=8 endpoint: 0.30-0.36 MB
    assert body.count(b"\n") > 2500


@pytest.mark.parametrize(
    "data, expected",
    [
        ({"k": 2, "per_position": [0.5]}, "per_position: needs k=2 values"),
        ({"k": 2, "per_position": [0.5, 0.7]}, "non-increasing"),
        ({"k": 2, "per_position": [0.9, 0.8], "effective_draft_length": 1.5}, "effective_draft_length"),
        ({"k": 2, "phases": [{"at": "1m", "per_positon": [0.1, 0.0]}]}, "phases[0].per_positon: unknown key"),
        ({"k": 2, "engines": 2, "phases": [{"at": "1m", "engines": [4]}]}, "phases[0].engines"),
        ({"form": "threads"}, "form"),
    ],
)
def test_bad_scenarios_name_the_key(data, expected):
    with pytest.raises(ConfigError, match=None) as e:
        parse_scenario(data, "s")
    assert expected in str(e.value)


def test_simulate_lists_scenarios_and_refuses_unknown_ones():
    proc = run_cli("simulate", "--list")
    assert proc.returncode == 0
    for name in ("healthy", "collapse", "restart", "idle", "bad-engine"):
        assert name.encode() + b":" in proc.stdout
    proc = run_cli("simulate", "--scenario", "nope")
    assert proc.returncode == 2 and b"'nope' is neither a file nor one of" in proc.stderr


@pytest.mark.parametrize("content, expected", [
    # helper-29: each was a traceback.
    (b"\xff\xfe bad", "is not UTF-8 text"),
    (b"k: 2\nphases: 5\n", "a value of an unexpected type or form ('int' object is not iterable)"),
    (b"k: 2\nphases: [{at: soon}]\n", "a value of an unexpected type or form"),
    # read as the config file is: no aliases (a YAML bomb)
    (b"a: &x [1]\nper_position: *x\n", "aliases (*name) are refused"),
])
def test_a_bad_scenario_file_is_one_line_naming_it(tmp_path, content, expected):
    path = tmp_path / "s.yaml"
    path.write_bytes(content)
    proc = run_cli("simulate", "--scenario", str(path))
    err = proc.stderr.decode()
    assert proc.returncode == 2 and f"--scenario: {path}" in err and expected in err, err
    assert "Traceback" not in err and err.count("\n") == 1, err


@pytest.mark.long
def test_demo_runs_and_stops_cleanly():
    proc = run_cli("demo", "--duration", "3s", "--speed", "20", "--exporter-port", "0", "--simulator-port", "0",
                   timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.decode()
    assert "exporter:  http://127.0.0.1:" in out and "/metrics" in out
    assert "model deepseek-ai/DeepSeek-V4-Pro   k=2   figures and health over the last 20s" in out
    assert "position 1" in out
    assert out.rstrip().endswith("demo stopped: simulator and exporter shut down.")


@pytest.mark.long
def test_demo_health_line_names_the_broken_engine():
    """Engine 5 breaks at 40 s of scenario time (10 s of real time at speed 4): within
    14 s the health line names it, and no frame before the break does."""
    proc = run_cli("demo", "--duration", "24s", "--speed", "4", "--exporter-port", "0", "--simulator-port", "0",
                   timeout=90)
    assert proc.returncode == 0, proc.stderr
    frames = [f for f in proc.stdout.decode().split("vllm-specdec-exporter live demo") if "health:" in f]
    health = [(float(f.split("t=")[1].split()[0]), next(ln for ln in f.splitlines() if "health:" in ln))
              for f in frames]
    assert all("engine 5" not in line for t, line in health if t < 40), health
    named = [line for t, line in health if "engine 5" in line]
    assert named and "health: DEGRADED  (engine 5 " in named[-1], health
    assert all("engine 5" in line for t, line in health if t >= 88), health  # 12 s of real time after the break


def test_demo_stops_cleanly_on_ctrl_c():
    import signal
    import subprocess
    import time

    from conftest import cli_path

    proc = subprocess.Popen([cli_path(), "demo", "--exporter-port", "0", "--simulator-port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        seen = b""
        while b"Ctrl-C stops both." not in seen and time.monotonic() < deadline:
            seen += proc.stdout.readline()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert (seen + out).rstrip().endswith(b"demo stopped: simulator and exporter shut down.")
    assert b"Traceback" not in err


def test_report_marks_the_dead_rank(tmp_path):
    """`diff` over the bad-engine scenario's break: the broken engine is marked in the
    terminal's per-engine table, its healthy siblings are not."""
    t = {"now": 0.0}
    sim = Simulation(load_scenario("bad-engine"), clock=lambda: t["now"])
    for at, name in ((70.0, "before.prom"), (130.0, "after.prom")):
        t["now"] = at
        sim.tick()
        (tmp_path / name).write_bytes(sim.render())
    proc = run_cli("diff", str(tmp_path / "before.prom"), str(tmp_path / "after.prom"))
    assert proc.returncode == 0, proc.stderr
    rows = {ln.split()[0]: ln for ln in proc.stdout.decode().splitlines() if ln.strip()[:1].isdigit() and "%" in ln
            and len(ln.split()) >= 5 and "." in ln.split()[2]}
    assert rows["5"].rstrip().endswith("<- collapsed"), rows
    assert [e for e, ln in rows.items() if "<-" in ln] == ["5"], rows
