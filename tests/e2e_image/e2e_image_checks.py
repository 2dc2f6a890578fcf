"""The artifact operators deploy, run for real (issue 33): the image built from the repository's
Dockerfile (on a Debian-packages base, no registry), started beside a stand-in vLLM, then the
pod `helm template` renders from examples/helm-vllm-with-sidecar played with `podman kube play`.

Run by `make e2e-image` (part of `make test`), which installs podman, runc, catatonit and
debootstrap first. The stand-in vLLM is the package's own simulator, run from the same image,
on tests/e2e_image/standin.yaml: healthy, then still (so that the sidecar's counters can be
compared with the stand-in's exactly), then a collapsed draft head. Everything is read from
outside the containers: the host's loopback for the container on the host network, the pod's
own loopback (nsenter into its network namespace) for the pod, /proc for uid, capabilities,
no_new_privs and the root mount. Skips with one line where podman cannot run a container at
all; under CI=true that is a failure.
"""

from __future__ import annotations

import json
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import podman_env as pe
import pytest
import yaml
from conftest import IN_CI, REPO
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.timeout(1800)

HERE = Path(__file__).resolve().parent
SCENARIO = HERE / "standin.yaml"
SPEED = 3  # scenario seconds per wall second
_PHASES = yaml.safe_load(SCENARIO.read_text())["phases"]
STILL_AT = float(_PHASES[0]["at"].rstrip("s")) / SPEED  # wall seconds after the stand-in starts
COLLAPSE_AT = float(_PHASES[1]["at"].rstrip("s")) / SPEED
HELM = REPO / ".tools" / "helm" / "helm"
CHART = REPO / "helm" / "vllm-specdec-exporter"
EXAMPLE = REPO / "examples" / "helm-vllm-with-sidecar"

STANDIN = f"{pe.PREFIX}-standin"
STANDALONE = f"{pe.PREFIX}-standalone"
RELEASE = pe.PREFIX
POD = f"{RELEASE}-vllm-pod-0"  # podman kube play: <Deployment>-pod-0, containers <pod>-<name>
SIDECAR = f"{POD}-vllm-specdec-exporter"
EXPORTER_UID = 65532

# The stand-in's counters (vLLM's names) and the sidecar's copies of them.
COUNTERS = {
    "vllm:spec_decode_num_drafts_total": "vllm_specdec_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total": "vllm_specdec_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total": "vllm_specdec_accepted_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_per_pos_total": "vllm_specdec_position_accepted_tokens_total",
    "vllm:generation_tokens_total": "vllm_specdec_generation_tokens_total",
}


def _log(msg: str) -> None:
    print(f"[e2e-image] {msg}", file=sys.__stderr__, flush=True)


# --- reading from outside ---

Key = tuple[str, tuple[tuple[str, str], ...]]


def samples(text: str) -> dict[Key, float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(parsed: dict[Key, float], name: str, **labels: str) -> float | None:
    return parsed.get((name, tuple(sorted(labels.items()))))


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except OSError as e:
        return 0, str(e)


def in_netns(pid: int) -> Callable[[str], tuple[int, str]]:
    """GET over the loopback of the network namespace of process ``pid`` (a pod's infra)."""
    script = ("import sys, urllib.request, urllib.error\n"
              "try:\n r = urllib.request.urlopen(sys.argv[1], timeout=5); print(r.status); sys.stdout.write(r.read().decode())\n"
              "except urllib.error.HTTPError as e:\n print(e.code); sys.stdout.write(e.read().decode())\n"
              "except OSError as e:\n print(0); sys.stdout.write(str(e))\n")

    def get(url: str) -> tuple[int, str]:
        proc = subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", sys.executable, "-c", script, url],
                              capture_output=True, text=True, timeout=30)
        status, _, body = proc.stdout.partition("\n")
        return (int(status) if status.isdigit() else 0), body or proc.stderr
    return get


def wait_for(what: str, check: Callable[[], object], timeout: float, every: float = 0.5):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout:g} s (last: {str(last)[:500]})")


def free_port() -> int:
    """A port free on every interface: podman publishes a pod's containerPorts on 0.0.0.0."""
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


def standin_counters(text: str) -> dict[Key, float]:
    """The stand-in's counters as the sidecar names them (with its target label)."""
    out = {}
    for (name, labels), v in samples(text).items():
        if name in COUNTERS:
            out[(COUNTERS[name], tuple(sorted((*labels, ("target", "vllm")))))] = v
    return out


def wait_still(get_standin: Callable[[], tuple[int, str]], started: float) -> dict[Key, float]:
    """The stand-in's counters once they stand still (its scenario's quiet stretch)."""
    def still():
        status, first = get_standin()
        time.sleep(1.0)
        status2, second = get_standin()
        if status == status2 == 200:
            a, b = standin_counters(first), standin_counters(second)
            if a and a == b and all(v > 0 for k, v in a.items() if k[0] == "vllm_specdec_drafts_total"):
                return b
        assert time.monotonic() - started < COLLAPSE_AT, (
            f"the stand-in's still stretch ({STILL_AT:g}-{COLLAPSE_AT:g} s after its start) was missed: "
            "the machine was too slow to start the containers?")
        return None
    return wait_for("the stand-in's counters standing still", still, COLLAPSE_AT + 30, every=0.2)


def assert_exact_figures(get_sidecar: Callable[[], tuple[int, str]], expected: dict[Key, float]) -> dict[Key, float]:
    """The sidecar's copies of the stand-in's counters equal them exactly (once it has polled the
    still counters), and its windowed figures are the stand-in's scenario's."""
    def caught_up():
        status, text = get_sidecar()
        if status != 200:
            return None
        parsed = samples(text)
        mine = {k: v for k, v in parsed.items() if k[0] in COUNTERS.values()}
        return parsed if mine == expected else None
    parsed = wait_for("the sidecar's counters equal to the stand-in's", caught_up, 20)
    engines = {dict(k[1])["engine"] for k in expected}
    assert engines == {"0", "1"}, expected
    labels = {"model_name": "deepseek-ai/DeepSeek-V4-Pro", "target": "vllm"}
    assert value(parsed, "vllm_specdec_up", target="vllm") == 1.0
    assert value(parsed, "vllm_specdec_num_speculative_tokens", **labels) == 2.0
    assert value(parsed, "vllm_specdec_health", **labels, vllm_specdec_health="ok") == 1.0
    # The 5m window holds only the healthy stretch: the scenario's per-position survival
    # (counters are floored to whole tokens: within 1 / drafts of it).
    scenario = yaml.safe_load(SCENARIO.read_text())
    for pos, p in enumerate(scenario["per_position"]):
        got = value(parsed, "vllm_specdec_position_acceptance_ratio", **labels, position=str(pos), window="5m")
        assert got is not None and abs(got - p) < 0.01, (pos, got, p)
    al = value(parsed, "vllm_specdec_mean_acceptance_length", **labels, window="5m")
    assert al is not None and abs(al - (1 + sum(scenario["per_position"]))) < 0.01, al
    return parsed


def assert_hardened(container: str, memory: int | None = None) -> None:
    """From outside: uid/gid 65532, no capability in any set, no_new_privs, a seccomp filter, a read-only root."""
    pid = int(pe.podman("inspect", "--format", "{{.State.Pid}}", container).stdout)
    status = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":\t" in line)
    assert status["Uid"].split() == [str(EXPORTER_UID)] * 4, status["Uid"]
    assert status["Gid"].split() == [str(EXPORTER_UID)] * 4, status["Gid"]
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status[cap], 16) == 0, f"{cap} {status[cap]}"
    assert status["NoNewPrivs"].strip() == "1"
    assert status["Seccomp"].strip() == "2", status["Seccomp"]  # a filter: RuntimeDefault
    (root,) = [line.split() for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines() if line.split()[4] == "/"]
    assert "ro" in root[5].split(","), root
    assert pe.podman("inspect", "--format", "{{.HostConfig.ReadonlyRootfs}}", container).stdout.strip() == "true"
    if memory is not None:
        assert int(pe.podman("inspect", "--format", "{{.HostConfig.Memory}}", container).stdout) == memory


def standin_shell(port: int) -> str:
    """The stand-in's command line for /bin/sh -c: its scenario written to /tmp, then the simulator."""
    scenario = json.dumps(yaml.safe_load(SCENARIO.read_text()))
    return (f"printf '%s' {shlex.quote(scenario)} > /tmp/standin.yaml && exec vllm-specdec-exporter simulate "
            f"--scenario /tmp/standin.yaml --speed {SPEED} --web.listen-address 127.0.0.1:{port}")


# --- the image ---

@pytest.fixture(scope="module")
def image():
    why = pe.cannot_run()
    if why:
        if IN_CI:
            pytest.fail(f"{why} (CI=true: a missing capability is a failure)")
        pytest.skip(why)
    pe.remove_everything()  # what a killed run left
    t0 = time.monotonic()
    base = pe.base_image()
    t1 = time.monotonic()
    image = pe.build_image(base)
    _log(f"base image {t1 - t0:.0f} s, podman build {time.monotonic() - t1:.0f} s")
    yield image
    pe.remove_everything()


def test_the_image_serves_a_standin_vllm_non_root_read_only_without_capabilities(image):
    """The image on the host's network beside the stand-in (the same image's simulator): /healthz,
    /readyz, the stand-in's counters exactly on /metrics, uid 65532, read-only root, no
    capabilities; SIGTERM exits 0."""
    vllm_port, port = free_port(), free_port()
    try:
        pe.podman("run", "-d", "--name", STANDIN, "--network", "host", "--entrypoint", "/bin/sh", image,
                  "-c", standin_shell(vllm_port))
        started = time.monotonic()
        pe.podman("run", "-d", "--name", STANDALONE, "--network", "host", "--read-only", "--read-only-tmpfs=false",
                  "--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--memory", "256m", image,
                  "serve", f"--vllm.url=vllm=http://127.0.0.1:{vllm_port}/metrics",
                  f"--web.listen-address=127.0.0.1:{port}", "--poll.interval=1s")
        base = f"http://127.0.0.1:{port}"
        wait_for("/healthz 200", lambda: http_get(f"{base}/healthz")[0] == 200, 60)
        wait_for("/readyz 200", lambda: http_get(f"{base}/readyz")[0] == 200, 60)
        expected = wait_still(lambda: http_get(f"http://127.0.0.1:{vllm_port}/metrics"), started)
        assert_exact_figures(lambda: http_get(f"{base}/metrics"), expected)
        assert_hardened(STANDALONE, memory=256 * 2**20)
        pe.podman("kill", "--signal", "TERM", STANDALONE)
        code = pe.podman("wait", STANDALONE, timeout=60).stdout.strip()
        assert code == "0", f"SIGTERM: exit {code}\n{pe.podman('logs', STANDALONE, check=False).stderr[-2000:]}"
    except BaseException:
        for name in (STANDALONE, STANDIN):
            logs = pe.podman("logs", name, check=False)
            _log(f"--- {name} logs ---\n{(logs.stdout + logs.stderr)[-3000:]}")
        raise
    finally:
        pe.podman("rm", "--force", "--time", "2", STANDALONE, STANDIN, check=False)


# --- the chart's pod ---

def render_pod(tmp_path: Path, image: str, vllm_port: int, port: int) -> Path:
    """helm template of the example chart, its vLLM container pointed at the stand-in through values."""
    if not HELM.exists():
        pytest.fail(f"{HELM} is missing: make tools fetches it (make e2e-image depends on it)")
    work = tmp_path / "chart"
    shutil.copytree(EXAMPLE, work, ignore=shutil.ignore_patterns("charts", "Chart.lock"))
    (work / "Chart.yaml").write_text((work / "Chart.yaml").read_text().replace(
        "file://../../helm/vllm-specdec-exporter", f"file://{CHART}"))
    subprocess.run([str(HELM), "dependency", "build", "."], cwd=work, check=True, capture_output=True)
    repository, tag = image.rsplit(":", 1)
    values = {
        "image": image,
        "model": "deepseek-ai/DeepSeek-V4-Pro",
        "command": ["/bin/sh", "-c"],
        "args": [standin_shell(vllm_port)],
        "port": vllm_port,
        "resources": {"limits": {"memory": "256Mi"}},
        "vllm-specdec-exporter": {
            "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
            "port": port,
            "config": {"targets": [{"name": "vllm", "url": f"http://127.0.0.1:{vllm_port}/metrics"}],
                       "poll": {"interval": "1s"}},
        },
    }
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(values))
    out = subprocess.run([str(HELM), "template", RELEASE, ".", "-f", str(tmp_path / "values.yaml")], cwd=work,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    pod = tmp_path / "pod.yaml"
    pod.write_text(out.stdout)
    return pod


def test_the_chart_pod_plays_beside_a_standin_and_shows_its_collapse(image, tmp_path):
    """The example chart's pod under podman kube play, its vLLM container the stand-in (values
    only): the sidecar reads it over the pod's loopback, its counters exactly, the chart's
    securityContext and memory limit applied, the stand-in's collapse shown as collapsed, and
    SIGTERM exits 0."""
    vllm_port, port = free_port(), free_port()
    pod_yaml = render_pod(tmp_path, image, vllm_port, port)
    docs = [d for d in yaml.safe_load_all(pod_yaml.read_text()) if d]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    spec = deployment["spec"]["template"]["spec"]
    volumes = tuple(v.get("configMap", {}).get("name", v["name"]) for v in spec["volumes"])
    (sidecar_spec,) = [c for c in spec["containers"] if c["name"] == "vllm-specdec-exporter"]
    assert sidecar_spec["livenessProbe"]["httpGet"]["port"] == port  # a number: podman keeps it
    try:
        t0 = time.monotonic()
        pe.podman("kube", "play", str(pod_yaml), timeout=300)
        started = time.monotonic()
        _log(f"podman kube play {started - t0:.1f} s")
        infra = pe.podman("pod", "inspect", POD, "--format", "{{.InfraContainerID}}").stdout.strip()
        get = in_netns(int(pe.podman("inspect", "--format", "{{.State.Pid}}", infra).stdout))
        base = f"http://127.0.0.1:{port}"
        wait_for("the sidecar's /healthz 200", lambda: get(f"{base}/healthz")[0] == 200, 60)
        wait_for("the sidecar's /readyz 200", lambda: get(f"{base}/readyz")[0] == 200, 60)
        expected = wait_still(lambda: get(f"http://127.0.0.1:{vllm_port}/metrics"), started)
        parsed = assert_exact_figures(lambda: get(f"{base}/metrics"), expected)
        # The model and k the chart passed from the vLLM container's values: the V4-Pro MTP k=2 profile.
        (info,) = [dict(k[1]) for k, v in parsed.items() if k[0] == "vllm_specdec_model_info" and v == 1.0]
        assert info["profile"] == "deepseek-v4-pro-mtp-k2", info
        assert_hardened(SIDECAR, memory=512 * 2**20)  # the chart's securityContext and resources.limits

        labels = {"model_name": "deepseek-ai/DeepSeek-V4-Pro", "target": "vllm"}

        def collapsed():
            status, text = get(f"{base}/metrics")
            return status == 200 and value(samples(text), "vllm_specdec_health", **labels,
                                           vllm_specdec_health="collapsed") == 1.0
        wait_for('vllm_specdec_health{vllm_specdec_health="collapsed"} 1 after the stand-in\'s collapse', collapsed,
                 COLLAPSE_AT + 60 - (time.monotonic() - started))
        _log(f"collapse seen {time.monotonic() - started:.1f} s after the pod started (injected at {COLLAPSE_AT:g} s)")
        pe.podman("stop", "--time", "20", SIDECAR, timeout=60)
        code = pe.podman("inspect", "--format", "{{.State.ExitCode}}", SIDECAR).stdout.strip()
        assert code == "0", f"SIGTERM: exit {code}"
    except BaseException:
        for name in (f"{POD}-vllm", SIDECAR):
            logs = pe.podman("logs", name, check=False)
            _log(f"--- {name} logs ---\n{(logs.stdout + logs.stderr)[-3000:]}")
        raise
    finally:
        pe.podman("kube", "down", str(pod_yaml), check=False)
        pe.remove_everything(volumes)
