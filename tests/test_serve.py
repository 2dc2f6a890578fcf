"""`serve` as a process: config errors, env fallback, SIGTERM, and promtool on its output."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time

import pytest
from conftest import cli_path, require, run_cli
from sidecar_harness import harness, run


def serve(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return run_cli("serve", *args, timeout=30) if env is None else subprocess.run(
        [cli_path(), "serve", *args], capture_output=True, timeout=30, env={**os.environ, **env})


@pytest.mark.parametrize(
    "args, config, expected",
    [
        ([], None, "config: targets: at least one vLLM /metrics URL is needed"),
        (["--vllm.url", "ftp://x/metrics"], None, "config: --vllm.url[0].url: 'ftp://x/metrics' is not an http(s) URL"),
        (["--vllm.url", "http://127.0.0.1:1/m", "--poll.interval", "soon"], None, "config: --poll.interval: 'soon' is not a duration"),
        (["--vllm.url", "http://127.0.0.1:1/m", "--log.format", "xml"], None, "config: --log.format: 'xml' is not one of auto, json, console"),
        (["--vllm.url", "http://127.0.0.1:1/m", "--web.listen-address", "9746"], None, "config: --web.listen-address: '9746' is not HOST:PORT"),
        # A host that is no host: polled first, then exit 1 at bind naming no key; [[...]] taken (helper-40).
        (["--vllm.url", "http://127.0.0.1:1/m", "--web.listen-address", "http://127.0.0.1:19746"], None,
         "config: --web.listen-address: 'http://127.0.0.1:19746': the host is not an IP address ([...] for IPv6) or a host name"),
        (["--vllm.url", "http://127.0.0.1:1/m", "--web.listen-address", "not a host!:19746"], None, "the host is not an IP address"),
        (["--vllm.url", "http://127.0.0.1:1/m", "--web.listen-address", "[[127.0.0.1]]:19746"], None, "the host is not an IP address"),
        (["--vllm.url", "http://127.0.0.1:1/m", "--vllm.profile", "nope"], None, "config: --vllm.profile: 'nope' is not a baseline profile (known: "),
        ([], "targets: [{url: 'http://127.0.0.1:1/m', profile: deepseek-v4-pro-mtp-k2, k: 3}]\n",
         "config: targets[0].profile: deepseek-v4-pro-mtp-k2 is for k=2, the target's k is 3"),
        ([], "targets: [{url: 'http://127.0.0.1:1/m'}]\npoll: {intervall: 5s}\n", "config: poll.intervall: unknown key (valid: interval, timeout, max_backoff)"),
        ([], "targets: [{url: 'http://127.0.0.1:1/m'}]\nwindows: [1m, 60s]\n", "config: windows: durations must be distinct"),
        ([], "targets: [{url: 'http://127.0.0.1:1/m'}]\nhealth: {window: 2m}\n", "config: health.window: '2m' is not one of the windows"),
        ([], "targets: [{url: 'http://127.0.0.1:1/m'}]\nmin_drafts: -3\n", "config: min_drafts: -3 is out of range"),
        ([], "targets: [{url: 'http://127.0.0.1:1/m'}]\nbaselines: {profiles: [{name: x, model: '(', k: 2, mean_acceptance_length: 2}]}\n",
         "config: baselines.profiles[0].model: '(' is not a regular expression"),
        ([], "targets: [{url: 'http://127.0.0.1:1/m'}]\nbaselines: {profiles: [{name: x, model: a, k: 1, mean_acceptance_length: 2.5}]}\n",
         "config: baselines.profiles[0].mean_acceptance_length: 2.5 exceeds k+1=2"),
        ([], "targets: [{url: 'http://127.0.0.1:1/m', name: a}, {url: 'http://127.0.0.1:2/m', name: a}]\n", "target names must be unique"),
        ([], "targets: [\n", "is not valid YAML"),
        # issue 29 item 7: aliases are refused as in the web config (a few hundred bytes of them were a 12 MB line)
        ([], "targets: [{url: 'http://127.0.0.1:1/m'}]\nmin_drafts: [&a [lol, lol], &b [*a, *a], &c [*b, *b]]\n",
         "config.yaml: aliases (*name) are refused (line 2): write the value out"),
    ],
)
def test_config_errors_exit_2_naming_the_key(tmp_path, args, config, expected):
    if config is not None:
        path = tmp_path / "config.yaml"
        path.write_text(config)
        args = [*args, "--config.file", str(path)]
    proc = serve(*args, "--web.listen-address", "127.0.0.1:1") if "--web.listen-address" not in args else serve(*args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], lines


def test_missing_config_file_names_the_flag():
    proc = serve("--config.file", "/no/such.yaml")
    assert proc.returncode == 2 and b"config: --config.file: no such file: /no/such.yaml" in proc.stderr


def test_env_fallback_reaches_the_process():
    proc = serve(env={"VLLM_SPECDEC_EXPORTER_VLLM_URL": "gopher://x", "VLLM_SPECDEC_EXPORTER_CONFIG_FILE": ""})
    assert proc.returncode == 2 and b"'gopher://x' is not an http(s) URL" in proc.stderr


def test_sigterm_exits_cleanly_with_no_leaked_tasks():
    proc = subprocess.Popen(
        [cli_path(), "serve", "--vllm.url", "http://127.0.0.1:1/metrics", "--web.listen-address", "127.0.0.1:0",
         "--poll.interval", "1s", "--log.format", "json"],
        stderr=subprocess.PIPE, stdout=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 20
        lines = []
        # SIGTERM once it listens and a poll has failed (the poller is backing off)
        for event in ("listening", "target_poll_failed"):
            while time.monotonic() < deadline and not any(r["event"] == event for r in lines):
                line = proc.stderr.readline()
                if not line:
                    break
                lines.append(json.loads(line))
            assert any(r["event"] == event for r in lines), lines
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    finally:
        proc.kill()
    records = [json.loads(line) for line in err.decode().splitlines() if line.startswith("{")]
    assert proc.returncode == 0
    stopped = [r for r in records if r["event"] == "stopped"]
    assert stopped and stopped[0]["leftover_tasks"] == 0
    assert not any(r["level"] == "error" for r in lines + records)


def test_a_url_flag_over_a_files_targets_and_a_method_no_profile_is_for_are_logged(tmp_path):
    """--vllm.url replaces the config file's targets: serve says so, naming how many, before it listens;
    and a declared method no baseline profile is for (here a typo of mtp) is named, with those there are."""
    path = tmp_path / "c.yaml"
    path.write_text("targets: [{url: 'http://127.0.0.1:1/a', name: a}, {url: 'http://127.0.0.1:1/b', name: b}]\n")
    proc = subprocess.Popen(
        [cli_path(), "serve", "--config.file", str(path), "--vllm.url", "http://127.0.0.1:1/metrics",
         "--vllm.method", "mpt", "--web.listen-address", "127.0.0.1:0", "--log.format", "json"],
        stderr=subprocess.PIPE, stdout=subprocess.PIPE,
    )
    try:
        records: list[dict] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(r["event"] == "listening" for r in records):
            line = proc.stderr.readline()
            if not line:
                break
            records.append(json.loads(line))
    finally:
        proc.kill()
        proc.communicate(timeout=15)
    events = [r["event"] for r in records]
    assert "listening" in events, records
    (replaced,) = [r for r in records if r["event"] == "config_targets_replaced"]
    assert replaced["level"] == "warning" and replaced["file_targets"] == 2 and replaced["by"] == "--vllm.url", replaced
    (listening,) = [r for r in records if r["event"] == "listening"]
    assert listening["targets"] == ["vllm"]
    (method,) = [r for r in records if r["event"] == "method_without_profile"]
    assert (method["level"], method["target"], method["method"], method["profiles_are_for"]) == (
        "warning", "vllm", "mpt", ["dspark", "mtp"]), method


def test_promtool_check_metrics_passes_on_the_output():
    promtool = shutil.which("promtool")
    require(promtool is not None, "promtool (Debian package prometheus)")

    async def go():
        async with harness(["healthy", "bad-engine"]) as h:
            await h.run_for(120)
            await h.stop_simulator(1)
            await h.run_for(5)
            _, text = await h.get("/metrics")

            return text
    text = run(go())
    assert "vllm_specdec_engine_mean_acceptance_length" in text and 'vllm_specdec_up{target="t1"} 0.0' in text
    proc = subprocess.run([promtool, "check", "metrics"], input=text.encode(), capture_output=True, timeout=30)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == b"" and proc.stderr.strip() == b"", proc.stdout + proc.stderr
