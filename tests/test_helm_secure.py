"""The chart copies no defaults and can scrape securely (issue 12, item 6): `config: {}`,
the appVersion tag, the helm.sh/chart label, every monitor knob (validated against the
Prometheus Operator's own CRD schemas, strictly), the web config from a Secret, the extra
args/volumes/mounts (kubernetes-validate --strict), and a real Prometheus scraping the real
exporter over TLS with basic auth using the ServiceMonitor and PodMonitor the chart renders,
translated to static scrape configs as the Operator would."""

from __future__ import annotations

import json
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

import jsonschema
import pytest
import yaml
from conftest import REPO, cli_path
from prom_harness import Prom, http_ok, serve, tool, wait_for
from security_harness import bcrypt_hash, get, openssl
from test_helm import CHART, CRDS, by_kind, container, helm, render

SECURE = CHART / "ci" / "secure-values.yaml"
SIDECAR = CHART / "ci" / "sidecar-values.yaml"
CRD_SCHEMAS = REPO / "tests" / "fixtures" / "crds"
CHART_META = yaml.safe_load((CHART / "Chart.yaml").read_text())
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())


def strict(schema):
    """The CRD schema as the API server's strict field validation reads it: unknown fields
    are errors (a CRD's structural schema would otherwise prune them silently)."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out and \
                not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def crd_errors(doc: dict) -> list[str]:
    schema = strict(json.loads((CRD_SCHEMAS / f"{doc['kind'].lower()}s.monitoring.coreos.com.v1.json").read_text()))
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in jsonschema.Draft7Validator(schema).iter_errors(doc)]


def kubernetes_validate(files: list[Path]) -> None:
    exe = Path(sys.executable).parent / "kubernetes-validate"
    proc = subprocess.run([str(exe), "--strict", "--quiet", "-k", "1.30.0", *map(str, files)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for line in (proc.stdout + proc.stderr).splitlines():
        assert "monitoring.coreos.com" in line, line  # it knows no CRDs: those are checked above


# --- config: {} and the image tag ---

def config_map(docs: list[dict]) -> dict:
    (cm,) = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-config")]
    return yaml.safe_load(cm["data"]["config.yaml"])


def test_config_renders_only_what_is_set():
    assert VALUES["config"] == {}
    # Sidecar defaults: the one target the exporter has no default for, nothing else.
    assert config_map(render()) == {"targets": [{"url": "http://127.0.0.1:8000/metrics"}]}
    targets = [{"name": "r0", "url": "http://vllm-r0.llm.svc:8000/metrics", "method": "mtp"}]
    docs = render("--set", "mode=standalone", "--set-json", f"config={json.dumps({'targets': targets})}")
    assert config_map(docs) == {"targets": targets}
    docs = render("--set-json", 'config={"poll": {"interval": "2s"}, "health": {"collapse_margin": 0.05}}')
    assert config_map(docs) == {"poll": {"interval": "2s"}, "health": {"collapse_margin": 0.05},
                                "targets": [{"url": "http://127.0.0.1:8000/metrics"}]}
    proc = helm("template", "rel", ".", "--set", "mode=standalone", check=False)
    assert proc.returncode != 0 and "config.targets: standalone mode needs the vLLM /metrics URLs" in proc.stderr


def test_image_tag_defaults_to_app_version_and_every_object_has_the_chart_label():
    docs = render("-f", str(SECURE))
    assert container(docs)["image"] == f"{VALUES['image']['repository']}:{CHART_META['appVersion']}"
    assert container(render("-f", str(SECURE), "--set", "image.tag=9.9.9"))["image"].endswith(":9.9.9")
    chart_label = f"{CHART_META['name']}-{CHART_META['version']}"
    for d in docs:
        labels = d["metadata"]["labels"]
        assert labels["helm.sh/chart"] == chart_label, d["kind"]
        assert labels["app.kubernetes.io/version"] == CHART_META["appVersion"]
    pod_labels = by_kind(docs, "Deployment")[0]["spec"]["template"]["metadata"]["labels"]
    assert pod_labels["helm.sh/chart"] == chart_label


# --- every monitor knob, against the Operator's own CRD schemas ---

KNOBS = ("tlsConfig", "basicAuth", "relabelings", "metricRelabelings")


@pytest.mark.parametrize("values, kind, endpoints", [(SECURE, "ServiceMonitor", "endpoints"),
                                                     (SIDECAR, "PodMonitor", "podMetricsEndpoints")],
                         ids=["ServiceMonitor", "PodMonitor"])
def test_every_monitor_knob_lands_where_the_operator_reads_it(values, kind, endpoints):
    section = "serviceMonitor" if kind == "ServiceMonitor" else "podMonitor"
    given = yaml.safe_load(values.read_text())[section]
    (monitor,) = by_kind(render("-f", str(values)), kind)
    assert crd_errors(monitor) == []
    spec = monitor["spec"]
    assert spec["jobLabel"] == given["jobLabel"] and spec["sampleLimit"] == given["sampleLimit"]
    exporter = spec[endpoints][0]
    assert exporter["port"] == "specdec-metrics" and exporter["scheme"] == "https"  # webConfig serves TLS
    for knob in KNOBS:
        assert exporter[knob] == given[knob], knob
    if kind == "PodMonitor":  # vLLM's own port: plain HTTP, none of the exporter's credentials
        assert spec[endpoints][1] == {"port": "http", "path": "/metrics", "interval": "15s", "scrapeTimeout": "10s",
                                      "relabelings": given["relabelings"]}
    # The schema check is strict: a misspelt knob is refused, a misplaced one too.
    assert crd_errors({**monitor, "spec": {**spec, endpoints: [{**exporter, "tlsConfig": {"serverNmae": "x"}}]}})
    assert crd_errors({**monitor, "spec": {**spec, endpoints: [{**exporter, "sampleLimit": 5}]}})
    # Without the knobs: none rendered, plain http (the Operator's defaults).
    enable = ["--set", f"{section}.enabled=true", "--set", f"{section}.force=true"]
    enable += (["--set", "mode=standalone", "--set", "config.targets[0].url=http://vllm:8000/metrics"]
               if kind == "ServiceMonitor" else ["--set", "podMonitor.selector.app=vllm"])
    (bare,) = by_kind(render(*enable), kind)
    assert crd_errors(bare) == []
    assert not {"scheme", *KNOBS} & set(bare["spec"][endpoints][0])
    assert not {"jobLabel", "sampleLimit"} & set(bare["spec"])
    (derived,) = by_kind(render(*enable, "--set", "webConfig.secretName=web"), kind)
    assert derived["spec"][endpoints][0]["scheme"] == "https"  # the exporter serves TLS
    (explicit,) = by_kind(render(*enable, "--set", "webConfig.secretName=web", "--set", f"{section}.scheme=http"), kind)
    assert explicit["spec"][endpoints][0]["scheme"] == "http"  # an explicit scheme wins over the default


# --- each new pod knob, rendered and validated by kubernetes-validate --strict ---

POD_KNOBS = {
    "webConfig": (["--set", "webConfig.secretName=specdec-web", "--set", "webConfig.key=web.yml"],
                  lambda c, pod: "--web.config.file=/etc/vllm-specdec-exporter/web/web.yml" in c["args"]
                  and {"name": "vllm-specdec-exporter-web", "mountPath": "/etc/vllm-specdec-exporter/web",
                       "readOnly": True} in c["volumeMounts"]
                  and {"name": "vllm-specdec-exporter-web", "secret": {"secretName": "specdec-web"}} in pod["volumes"]
                  and c["livenessProbe"]["httpGet"]["scheme"] == c["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"),
    "webConfig.tls=false": (["--set", "webConfig.secretName=specdec-web", "--set", "webConfig.tls=false"],
                            lambda c, pod: "scheme" not in c["livenessProbe"]["httpGet"]
                            and any(a.startswith("--web.config.file=") for a in c["args"])),
    "extraArgs": (["--set-json", 'extraArgs=["--log.level=debug","--poll.interval=2s"]'],
                  lambda c, pod: c["args"][-2:] == ["--log.level=debug", "--poll.interval=2s"]),
    "extraVolumes+Mounts": (["--set-json", 'extraVolumes=[{"name":"tls","secret":{"secretName":"specdec-tls"}}]',
                             "--set-json", 'extraVolumeMounts=[{"name":"tls","mountPath":"/tls","readOnly":true}]'],
                            lambda c, pod: {"name": "tls", "mountPath": "/tls", "readOnly": True} in c["volumeMounts"]
                            and {"name": "tls", "secret": {"secretName": "specdec-tls"}} in pod["volumes"]),
}


def test_each_pod_knob_renders_and_validates(tmp_path):
    base = ["--set", "mode=standalone", "--set-json", 'config={"targets":[{"url":"http://vllm.llm.svc:8000/metrics"}]}']
    files = []
    for name, (args, check) in POD_KNOBS.items():
        docs = render(*base, *args)
        assert check(container(docs), by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]), name
        files.append(tmp_path / f"{name}.yaml")
        files[-1].write_text(yaml.safe_dump_all(docs))
    kubernetes_validate(files)  # (ci/secure-values.yaml and ci/defaults-values.yaml: test_helm.py)


def test_sidecar_include_carries_the_web_config_and_extras(tmp_path):
    """The vLLM chart's pod, through the include, with the web config and extra mounts."""
    work = tmp_path / "umbrella"
    shutil.copytree(REPO / "examples" / "helm-vllm-with-sidecar", work, ignore=shutil.ignore_patterns("charts", "Chart.lock"))
    (work / "Chart.yaml").write_text((work / "Chart.yaml").read_text().replace(
        "file://../../helm/vllm-specdec-exporter", f"file://{CHART}"))
    helm("dependency", "build", ".", cwd=work)
    sub = "vllm-specdec-exporter"
    out = helm("template", "demo", ".", "--namespace", "llm", *CRDS, "--set", f"{sub}.webConfig.secretName=specdec-web",
               "--set-json", f'{sub}.extraVolumes=[{{"name":"specdec-tls","secret":{{"secretName":"specdec-tls"}}}}]',
               "--set-json", f'{sub}.extraVolumeMounts=[{{"name":"specdec-tls","mountPath":"/tls"}}]', cwd=work).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    c = container(docs)
    assert c["image"].endswith(f":{CHART_META['appVersion']}")  # the subchart's appVersion, not the parent's
    assert "--web.config.file=/etc/vllm-specdec-exporter/web/web-config.yml" in c["args"]
    volumes = {v["name"]: v for v in by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]["volumes"]}
    assert {m["name"] for m in c["volumeMounts"]} <= set(volumes)  # every mount has its volume in the vLLM pod
    assert volumes["vllm-specdec-exporter-web"]["secret"] == {"secretName": "specdec-web"}
    assert c["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    (pm,) = by_kind(docs, "PodMonitor")
    assert pm["spec"]["podMetricsEndpoints"][0]["scheme"] == "https"
    (tmp_path / "out.yaml").write_text(out)
    kubernetes_validate([tmp_path / "out.yaml"])
    # The older include form cannot see the appVersion: it says so, and works with a tag.
    template = work / "templates" / "deployment.yaml"
    old_form = f'(dict "Values" (index .Values "{sub}") "Release" .Release)'
    template.write_text(template.read_text().replace(f'(index .Subcharts "{sub}")', old_form))
    proc = helm("template", "demo", ".", cwd=work, check=False)
    assert proc.returncode != 0 and "image.tag: empty means this chart's appVersion" in proc.stderr
    c = container([d for d in yaml.safe_load_all(helm("template", "demo", ".", "--set", f"{sub}.image.tag=1.2.3",
                                                     cwd=work).stdout) if d])
    assert c["image"].endswith(":1.2.3")


# --- a real Prometheus scraping the real exporter with what the chart renders ---

SERVER_NAME = "specdec-vllm-specdec-exporter.llm.svc"  # ci/secure-values.yaml's tlsConfig.serverName
PASSWORD = "scrape-pw-4f1c9a"


def snake(key: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", key).lower()


def relabel(rules: list[dict]) -> list[dict]:
    """The Operator's RelabelConfig (camelCase) as Prometheus's relabel_config."""
    return [{snake(k): v for k, v in r.items()} for r in rules]


def secret_file(secrets: Path, ref: dict) -> Path:
    return secrets / ref["name"] / ref["key"]


def meta(kind: str, name: str) -> str:
    role = "service" if kind == "ServiceMonitor" else "pod"
    return f"__meta_kubernetes_{role}_label_{re.sub(r'[^a-zA-Z0-9_]', '_', name)}"


def scrape_config(monitor: dict, secrets: Path, target: str, object_labels: dict) -> dict:
    """A ServiceMonitor/PodMonitor's exporter endpoint translated as the Operator does
    (scheme, tls_config from the CA Secret and serverName, basic_auth from the Secrets, the
    relabelings, job from the jobLabel of the Service's/pod's labels, sample_limit), as one
    static job whose target carries those labels as the service discovery would."""
    kind, spec = monitor["kind"], monitor["spec"]
    ep = spec["endpoints" if kind == "ServiceMonitor" else "podMetricsEndpoints"][0]
    tls, auth = ep["tlsConfig"], ep["basicAuth"]
    job_relabel = [{"source_labels": [meta(kind, spec["jobLabel"])], "regex": "(.+)", "target_label": "job",
                    "replacement": "${1}"}]
    return {
        "job_name": f"{kind}/{monitor['metadata']['namespace']}/{monitor['metadata']['name']}/0",
        "scheme": ep["scheme"],
        "metrics_path": ep["path"],
        "scrape_interval": ep["interval"],
        "scrape_timeout": ep["scrapeTimeout"],
        "sample_limit": spec["sampleLimit"],
        "tls_config": {"ca_file": str(secret_file(secrets, tls["ca"]["secret"])), "server_name": tls["serverName"]},
        "basic_auth": {"username": secret_file(secrets, auth["username"]).read_text(),
                       "password_file": str(secret_file(secrets, auth["password"]))},
        "static_configs": [{"targets": [target], "labels": {meta(kind, k): v for k, v in object_labels.items()}}],
        "relabel_configs": job_relabel + relabel(ep.get("relabelings", [])),
        "metric_relabel_configs": relabel(ep.get("metricRelabelings", [])),
    }


def make_secrets(root: Path) -> Path:
    """The Secrets the values name, as the kubelet would mount them: a CA and the exporter's
    certificate for SERVER_NAME (openssl), the web config (TLS + a bcrypt user), the scrape
    credentials Prometheus reads."""
    tls = root / "specdec-tls"
    tls.mkdir(parents=True)
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", "ca.key",
            "-out", "ca.crt", "-days", "2", "-subj", "/CN=specdec-test-ca", cwd=tls)
    (tls / "san.ext").write_text(f"subjectAltName=DNS:{SERVER_NAME}\n")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", "tls.key",
            "-out", "tls.csr", "-subj", "/CN=specdec", cwd=tls)
    openssl("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-out", "tls.crt",
            "-days", "2", "-extfile", "san.ext", cwd=tls)
    scrape = root / "specdec-scrape"
    scrape.mkdir()
    (scrape / "username").write_text("prometheus")
    (scrape / "password").write_text(PASSWORD)
    return root


def mounted(docs: list[dict], secrets: Path, work: Path) -> tuple[list[str], dict[str, Path]]:
    """The rendered exporter's args, with every path under one of its volumeMounts mapped to
    where that volume's Secret or ConfigMap is on this machine (what the kubelet does)."""
    c = container(docs)
    volumes = {v["name"]: v for v in by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]["volumes"]}
    mounts: dict[str, Path] = {}
    for m in c["volumeMounts"]:
        volume = volumes[m["name"]]
        assert m.get("readOnly"), m  # every secret and config is mounted read-only
        if "secret" in volume:
            mounts[m["mountPath"]] = secrets / volume["secret"]["secretName"]
        else:
            (cm,) = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"] == volume["configMap"]["name"]]
            (work / "config").mkdir()
            for k, v in cm["data"].items():
                (work / "config" / k).write_text(v)
            mounts[m["mountPath"]] = work / "config"

    def local(arg: str) -> str:
        for prefix in sorted(mounts, key=len, reverse=True):
            if f"={prefix}/" in arg:
                return arg.replace(f"={prefix}/", f"={mounts[prefix]}/")
        return arg
    return [local(a) for a in c["args"]], mounts


@pytest.mark.long
def test_real_prometheus_scrapes_the_exporter_over_tls_with_basic_auth():
    tool("prometheus")
    fast = ["--set", "serviceMonitor.interval=1s", "--set", "serviceMonitor.scrapeTimeout=1s",
            "--set-json", 'config={"targets":[{"name":"vllm","url":"http://127.0.0.1:1/metrics"}]}']
    docs = render("-f", str(SECURE), *fast)
    (sm,) = by_kind(docs, "ServiceMonitor")
    (svc,) = by_kind(docs, "Service")
    assert sm["spec"]["endpoints"][0]["tlsConfig"]["serverName"] == SERVER_NAME
    # The same endpoint settings on the PodMonitor (sidecar mode), Secret CA instead of the ConfigMap one.
    pm_args = ["-f", str(SIDECAR), "--set", "podMonitor.interval=1s", "--set", "podMonitor.scrapeTimeout=1s",
               "--set-json", f'podMonitor.tlsConfig={{"ca":{{"secret":{{"name":"specdec-tls","key":"ca.crt"}}}},'
                             f'"serverName":"{SERVER_NAME}"}}']
    (pm,) = by_kind(render(*pm_args), "PodMonitor")
    with ExitStack() as es:
        work = Path(es.enter_context(tempfile.TemporaryDirectory()))
        secrets = make_secrets(work / "secrets")
        args, mounts = mounted(docs, secrets, work)
        web = [a for a in args if a.startswith("--web.config.file=")]
        assert len(web) == 1
        # The web config in its Secret: TLS from the extra-mounted certificate Secret, one bcrypt user.
        tls_dir = mounts["/etc/vllm-specdec-exporter/tls"]
        web_file = Path(web[0].split("=", 1)[1])
        web_file.parent.mkdir(parents=True)
        web_file.write_text(yaml.safe_dump({
            "tls_server_config": {"cert_file": str(tls_dir / "tls.crt"), "key_file": str(tls_dir / "tls.key")},
            "basic_auth_users": {"prometheus": bcrypt_hash(PASSWORD)}}))
        assert args[0] == "serve" and "--web.listen-address=:9746" in args and "--log.level=debug" in args
        args = [a if not a.startswith("--web.listen-address=") else "--web.listen-address=127.0.0.1:0" for a in args]
        exporter = serve(es, [cli_path(), *args], work / "exporter.log")

        ctx = ssl.create_default_context(cafile=str(tls_dir / "ca.crt"))
        ctx.check_hostname = False  # the kubelet's probe: HTTPS, no password
        probe = container(docs)["readinessProbe"]["httpGet"]
        assert probe["scheme"] == "HTTPS" and get(f"https://{exporter}{probe['path']}", ctx)[0] == 200
        status, body = get(f"https://{exporter}/metrics", ctx, ("prometheus", PASSWORD))
        assert status == 200 and "python_gc_objects_collected_total" in body  # what metricRelabelings drops

        good = scrape_config(sm, secrets, exporter, svc["metadata"]["labels"])
        pod_job = scrape_config(pm, secrets, exporter, pm["spec"]["selector"]["matchLabels"])  # the vLLM pod's
        no_auth = {**good, "job_name": "no-basic-auth"}
        del no_auth["basic_auth"]
        wrong_name = {**good, "job_name": "wrong-server-name",
                      "tls_config": {**good["tls_config"], "server_name": "other.llm.svc"}}
        prom_dir = work / "prometheus"
        prom_dir.mkdir()
        (prom_dir / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s"},
            "scrape_configs": [good, pod_job, no_auth, wrong_name]}))
        proc = subprocess.run([tool("promtool"), "check", "config", str(prom_dir / "prometheus.yml")],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        prom = Prom(serve(es, [tool("prometheus"), f"--config.file={prom_dir / 'prometheus.yml'}",
                               f"--storage.tsdb.path={prom_dir / 'tsdb'}", "--web.listen-address=127.0.0.1:0"],
                          prom_dir / "prometheus.log"))
        wait_for(lambda: http_ok(f"{prom.base}/-/ready"), 30, "Prometheus to be ready", step=0.2)

        def scraped() -> dict | None:
            targets = prom._get("/api/v1/targets")["activeTargets"]
            done = {t["scrapePool"]: t for t in targets if t["health"] != "unknown"}
            return done if len(done) == 4 else None
        targets = wait_for(scraped, 30, "all four scrape jobs to have scraped", step=0.2)
        assert targets[good["job_name"]]["health"] == "up", targets[good["job_name"]]["lastError"]
        assert targets[pod_job["job_name"]]["health"] == "up", targets[pod_job["job_name"]]["lastError"]
        assert targets["no-basic-auth"]["health"] == "down" and "401" in targets["no-basic-auth"]["lastError"]
        assert targets["wrong-server-name"]["health"] == "down"
        assert "certificate" in targets["wrong-server-name"]["lastError"]

        # The exporter's series arrive, with the relabelings applied and the jobLabel's job.
        series = wait_for(lambda: prom.query('vllm_specdec_up{target="vllm"}'), 30, "the exporter's series", step=0.2)
        jobs = {s["metric"]["job"]: s["metric"] for s in series}
        # job: the app.kubernetes.io/name of the Service (ServiceMonitor) and of the vLLM pod (PodMonitor)
        assert set(jobs) == {"vllm-specdec-exporter", "vllm-deepseek-v4"}
        assert all(m["cluster"] == "eu-west-1" for m in jobs.values())
        assert prom.value('vllm_specdec_up{job="vllm-specdec-exporter"}') == 0.0  # its vLLM is unreachable
        assert prom.query('vllm_specdec_exporter_build_info{job="vllm-specdec-exporter"}')
        assert prom.query('{__name__=~"python_gc_.*"}') == []  # dropped by metricRelabelings
        assert prom.query('process_resident_memory_bytes{job="vllm-specdec-exporter"}')
