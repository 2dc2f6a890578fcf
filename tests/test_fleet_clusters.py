"""Two clusters and a global view, every hop real (issue 23, section 2).

Three Prometheus 2.42 servers on loopback: cluster ``a`` and cluster ``b`` (external label
``cluster``), each scraping its own simulated vLLM and the real exporter with the shipped
sidecar rules (E2E_OPTIONS' short windows), remote-writing to a global one
(--web.enable-remote-write-receiver: what Thanos Receive or Mimir does) that evaluates
the same rule file centrally, the way a Thanos or Mimir ruler runs it.

Both clusters run the same namespace, pod, target, model and engines, at different
rates; b's draft head breaks. A rule that summed two clusters into one, or joined
across them, would give a value neither cluster has (or an error): the checks compare
every centrally recorded series with its cluster's own.

The clusters forward their raw series and their ALERTS (marked evaluated_by="cluster"),
not their recorded series, which the global server records itself.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import pytest
import render_preview
import yaml
from conftest import cli_path
from prom_harness import COLLAPSE_MODEL, E2E_EXPORTER_CONFIG, E2E_OPTIONS, Prom, http_ok, serve, tool, wait_for
from vllm_specdec_exporter.generators import rules

REPO = Path(__file__).resolve().parent.parent
COLLAPSE_AT = 14  # scenario seconds at which b's draft head breaks
LABELS = {"namespace": "llm", "pod": "vllm-0"}  # the same in both clusters, on purpose
COLLAPSED = "VLLMSpecDecodeAcceptanceCollapsed"
RECORDED_RE = f"[a-zA-Z_]+:{rules.P}_[a-zA-Z0-9_]+:[a-zA-Z0-9_]+"  # our recorded names (vLLM's have a colon too)
RULES = rules.dump(rules.rule_file("sidecar", E2E_OPTIONS), "")


def scenario(drafts_per_second: int, collapse_at: int | None) -> str:
    phases = (f"phases:\n  - at: {collapse_at}s\n    per_position: [0.0357, 0.0008]\n" if collapse_at else "")
    return (f"description: fleet -- {drafts_per_second} drafts/s\nmodel_name: {COLLAPSE_MODEL}\nengines: 2\nk: 2\n"
            f"drafts_per_second: {drafts_per_second}\nper_position: [0.924, 0.687]\n{phases}")


def start_prometheus(es: ExitStack, tmp: Path, config: dict, receiver: bool = False) -> Prom:
    tmp.mkdir()
    (tmp / "rules.yaml").write_text(RULES)
    (tmp / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", **config.pop("global", {})},
        "rule_files": [str(tmp / "rules.yaml")], **config}))
    args = [tool("prometheus"), f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
            "--web.listen-address=127.0.0.1:0"]
    prom = Prom(serve(es, [*args, "--web.enable-remote-write-receiver"] if receiver else args, tmp / "prometheus.log"))
    wait_for(lambda: http_ok(f"{prom.base}/-/ready"), 30, "Prometheus to be ready", step=0.2)
    return prom


def cluster(es: ExitStack, tmp: Path, name: str, drafts_per_second: int, collapse_at: int | None,
            global_url: str) -> Prom:
    """A simulated vLLM, the exporter polling it, and a Prometheus with external label cluster=name."""
    (tmp / f"{name}.yaml").write_text(scenario(drafts_per_second, collapse_at))
    sim = serve(es, [cli_path(), "simulate", "--scenario", str(tmp / f"{name}.yaml"),
                     "--web.listen-address", "127.0.0.1:0"], tmp / f"{name}-sim.log")
    (tmp / f"{name}-exporter.yaml").write_text(yaml.safe_dump({
        "targets": [{"name": "vllm", "url": f"http://{sim}/metrics"}], "web": {"listen_address": "127.0.0.1:0"},
        "poll": {"interval": "1s"}, **E2E_EXPORTER_CONFIG}))
    exporter = serve(es, [cli_path(), "serve", "--config.file", str(tmp / f"{name}-exporter.yaml"),
                          "--log.format", "json"], tmp / f"{name}-exporter.log")
    return start_prometheus(es, tmp / name, {
        "global": {"external_labels": {"cluster": name}},
        "scrape_configs": [{"job_name": "vllm", "static_configs": [{"targets": [exporter, sim], "labels": LABELS}]}],
        "remote_write": [{"url": f"{global_url}/api/v1/write",
                          "queue_config": {"batch_send_deadline": "500ms", "min_backoff": "50ms", "max_backoff": "1s"},
                          "write_relabel_configs": [
                              {"source_labels": ["__name__"], "regex": RECORDED_RE + "|ALERTS_FOR_STATE",
                               "action": "drop"},
                              {"source_labels": ["__name__"], "regex": "ALERTS", "target_label": "evaluated_by",
                               "replacement": "cluster"}]}]})


def key(metric: dict, drop: tuple[str, ...] = ()) -> tuple:
    return tuple(sorted((k, v) for k, v in metric.items() if k not in drop))


def selector(metric: dict) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in metric.items() if k != "__name__") + "}"


def recorded_names() -> list[str]:
    return [r["record"] for g in yaml.safe_load(RULES)["groups"] for r in g["rules"] if "record" in r]


def counted_names() -> set[str]:
    """The recorded names whose presence hangs on how many times a Prometheus has evaluated
    (the full-hour gate: count_over_time), and every name built on them: a Prometheus starved
    beside CPU hogs skips evaluations, so one may hold such a series a moment before another."""
    exprs = {r["record"]: r["expr"] for g in yaml.safe_load(RULES)["groups"] for r in g["rules"] if "record" in r}
    counted = {n for n, e in exprs.items() if "count_over_time(" in e}

    def reads(e: str, name: str) -> bool:  # the whole name: X:max is not X:max_over_time1d
        return re.search(re.escape(name) + r"(?![\w:])", e) is not None

    while grown := {n for n, e in exprs.items() if n not in counted and any(reads(e, c) for c in counted)}:
        counted |= grown
    return counted


def firing(prom: Prom, alert: str, extra: str = "") -> list[dict]:
    return [r["metric"] for r in prom.query(f'ALERTS{{alertname="{alert}", alertstate="firing"{extra}}}')]


def rule_health(prom: Prom) -> list[str]:
    with urllib.request.urlopen(f"{prom.base}/api/v1/rules", timeout=10) as resp:
        groups = json.load(resp)["data"]["groups"]
    return [f"{r['name']}: {r.get('lastError')}" for g in groups for r in g["rules"] if r["health"] == "err"]


def dashboard_queries() -> list[tuple[str, str, str]]:
    out = []
    for uid in ("vllm-specdec-overview", "vllm-specdec-exporter"):
        board = json.loads((REPO / "dashboards" / f"{uid}.json").read_text())
        out += [(uid, p["title"], t["expr"]) for p in render_preview.panels(board) for t in p.get("targets", [])]
    return out


def test_two_clusters_and_a_global_view():
    tool("prometheus")
    with ExitStack() as es:
        tmp = Path(es.enter_context(tempfile.TemporaryDirectory()))
        glob = start_prometheus(es, tmp / "global", {}, receiver=True)
        started = time.time()
        a = cluster(es, tmp, "a", 80, None, glob.base)
        b = cluster(es, tmp, "b", 30, COLLAPSE_AT, glob.base)
        deadline = started + COLLAPSE_AT + 45

        # 1. b's collapse pages once, with cluster="b", on the clusters' own rules and on the central ones.
        def paged() -> bool:
            return bool(firing(glob, COLLAPSED, ', evaluated_by="cluster"')) and bool(firing(glob, COLLAPSED, ', evaluated_by=""'))
        wait_for(paged, deadline - time.time(), "the collapse alert from b's own rules and from the central ones")
        time.sleep(2)  # a few more evaluations everywhere, so a's (wrong) alert would have had its chance
        for evaluated_by in ("cluster", ""):
            alerts = firing(glob, COLLAPSED, f', evaluated_by="{evaluated_by}"')
            assert len(alerts) == 1, (evaluated_by, alerts)
            assert alerts[0]["cluster"] == "b" and alerts[0]["pod"] == "vllm-0", alerts
        bad = glob.query('ALERTS{alertstate="firing", cluster="a", severity=~"critical|warning"}')
        assert bad == [], [r["metric"] for r in bad]
        assert [r["metric"]["alertname"] for r in b.query(f'ALERTS{{alertname="{COLLAPSED}", alertstate="firing"}}')] \
            == [COLLAPSED]
        assert a.query('ALERTS{alertstate="firing", severity=~"critical|warning"}') == []

        # 2. Central evaluation = each cluster's own: every series recorded centrally has a cluster label
        # and the value its cluster recorded (where that value is steady, as rule timings differ by a second).
        assert rule_health(glob) == [] and rule_health(a) == [] and rule_health(b) == []
        compared, names, counted = 0, recorded_names(), counted_names()
        at = time.time() - 1
        for name in names:
            central = {key(r["metric"]): float(r["value"][1]) for r in glob.query(name, at)}
            local = {}
            for cl, prom in (("a", a), ("b", b)):
                for r in prom.query(name, at):
                    before, after = prom.value(f"{name}{selector(r['metric'])}", at - 2), prom.value(
                        f"{name}{selector(r['metric'])}", at + 0.5)
                    local[key({**r["metric"], "cluster": cl})] = (float(r["value"][1]), before, after)
            if name in counted:  # compared where both hold it
                central = {k: v for k, v in central.items() if k in local}
                local = {k: v for k, v in local.items() if k in central}
            assert set(central) == set(local), (name, sorted(central), sorted(local))
            for k, (value, before, after) in local.items():
                steady = before is not None and after is not None and abs(before - value) <= 0.01 * abs(value) + 1e-9 \
                    and abs(after - value) <= 0.01 * abs(value) + 1e-9
                if steady:  # 15 %: an 8 s rate of 1 s scrapes moves by a sample's worth between the two
                    # servers' evaluations; a's and b's rates differ by 2.7x and their AL by 1.6 (collapsed 1.04).
                    assert central[k] == pytest.approx(value, rel=0.15, abs=1e-6), (name, k, central[k], value)
                    compared += 1
        assert compared >= len(names), (compared, len(names))  # most series of most rules, both clusters
        al5 = rules.name("namespace_pod_model_name", "mean_acceptance_length", "ratio_rate5m")
        assert glob.value(f'{al5}{{cluster="a"}}') > 2.2 and glob.value(f'{al5}{{cluster="b"}}') < 1.2

        # 3. The dashboards' queries with $cluster = a, b and all (.*), from the global server.
        answers: dict[str, dict[tuple, list]] = {}
        for value in ("a", "b", ".*"):
            answers[value] = {}
            for uid, title, expr in dashboard_queries():
                q = render_preview.substitute(expr, {**render_preview.SUBSTITUTE, "$cluster": value})
                result = glob.query(q)
                answers[value][uid, title, expr] = [r["metric"] for r in result]
                clusters = {r["metric"].get("cluster") for r in result}
                if value != ".*":
                    assert clusters <= {value, None}, (title, value, clusters)
        optional = {"Requests at the acceptance extremes"}
        for value in ("a", "b"):
            empty = [t for (u, t, e), res in answers[value].items() if not res and t not in optional
                     and not (value == "a" and t == "Likely cause")]
            assert empty == [], (value, empty)
        for q, everyone in answers[".*"].items():
            per_cluster = [key(m) for v in ("a", "b") for m in answers[v][q]]
            if any("cluster" in m for m in everyone):  # the panel keeps the cluster: all = a + b
                got = sorted(key(m) for m in everyone)
                if "topk(" in q[2] or "bottomk(" in q[2]:  # the fleet's worst: one of the clusters' answers
                    assert set(got) <= set(per_cluster), q
                else:
                    assert got == sorted(per_cluster), q
