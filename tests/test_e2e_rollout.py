"""A broken rollout on a real Prometheus 2.42 (issue 30 item 8): the healthy reference that gates
VLLMSpecDecodeFirstPositionAcceptanceLow when no profile matches is kept per namespace and model,
so a pod killed and replaced under a new name keeps its predecessor's history.

One old pod (a simulated vLLM, and in the sidecar variant its exporter beside it) serves a healthy
head under a served name no baseline profile matches; it is killed and a new pod, partly broken
from its first second, replaces it under another pod name in the same namespace. Both rule
variants run, each on its own Prometheus (E2E_OPTIONS' windows of seconds), the targets' namespace
and pod labels coming from a file_sd file rewritten at the rollout. The new pod is also scraped as
the only pod of a control namespace: the same counters with no predecessor must stay quiet.
"""

from __future__ import annotations

import dataclasses
import time
from contextlib import ExitStack
from pathlib import Path

import pytest
from prom_harness import (
    E2E_EXPORTER_CONFIG,
    E2E_OPTIONS,
    Prom,
    prometheus,
    sidecar,
    sim_scenario,
    simulator,
    tool,
    wait_for,
    write_targets,
)
from vllm_specdec_exporter import durations
from vllm_specdec_exporter.generators import rules

ALERT = "VLLMSpecDecodeFirstPositionAcceptanceLow"
SERVED = "DSV4-W4A16-FP8-MTP"  # a served name no shipped profile matches: only the history gates the alert
NAMESPACE, CONTROL = "llm", "llm-control"
OLD_POD, NEW_POD = "dsv4-6f7c9d5b8-x2kqp", "dsv4-74b8f6c9d-q9zrt"
HEALTHY_P0, BROKEN_P0 = 0.924, 0.2
OPTIONS = dataclasses.replace(E2E_OPTIONS, fors={**E2E_OPTIONS.fors, ALERT: "4s"})  # 15m in production


def gate(namespace: str) -> str:
    """The history that gates the alert without a profile: the model's best full hour of position 0
    within the day (its best server's, at production traffic)."""
    return f'max without(position) (namespace_model_name:vllm_specdec_position_acceptance_ratio:max_over_time1d{{namespace="{namespace}"}})'


def assert_no_healthy_history(prom: Prom, namespace: str, variant: str) -> None:
    """No healthy hour: none recorded yet (a full hour of the new pod is 27 s here) or a broken one."""
    result = prom.query(gate(namespace))
    assert len(result) <= 1 and all(float(r["value"][1]) < 0.5 for r in result), (variant, namespace, result)


def position0(namespace: str, pod: str) -> str:
    """A pod's position 0 acceptance over the detection window (what the alert compares)."""
    sel = f'namespace="{namespace}",pod="{pod}"'
    return (f'max without(position) (namespace_pod_model_name:vllm_specdec_position_accepted_tokens:rate5m{{position="0",{sel}}})'
            f" / on(namespace, pod, model_name) namespace_pod_model_name:vllm_specdec_position_drafts:rate5m{{{sel}}}")


def history(prom: Prom, since: float) -> dict[str, list]:
    """The namespace's series behind the gate, second by second, for a failure's message."""
    sel = f'{{namespace="{NAMESPACE}"}}'
    names = ["namespace_model_name:vllm_specdec_drafts:rate5m", "namespace_model_name:vllm_specdec_position_accepted_tokens:rate5m",
             "namespace_model_name:vllm_specdec_drafts:rate1h", "namespace_model_name:vllm_specdec_position_accepted_tokens:rate1h",
             "namespace_pod_model_name:vllm_specdec_position_acceptance_ratio:ratio_rate1h",
             "namespace_model_name:vllm_specdec_position0_acceptance_ratio:ratio_rate1h"]
    return {f"{n} {r['metric'].get('pod', '')} {r['metric'].get('position', '')}": [(round(float(t) - since, 1), round(float(v), 3)) for t, v in r["values"]]
            for n in names for r in prom.query_range(n + sel, since, time.time(), 1)}


def scenario(description: str, per_position: list[float]) -> str:
    return sim_scenario(f"rollout -- {description}", SERVED, per_position)


def one(prom: Prom, q: str) -> float:
    result = prom.query(q)
    assert len(result) == 1, (q, [r["metric"] for r in result])
    return float(result[0]["value"][1])


@pytest.mark.long
@pytest.mark.timeout(300)  # about a minute; generous on a loaded machine
def test_e2e_a_rollout_keeps_the_models_history_and_flags_the_broken_new_pod(tmp_path: Path):
    tool("prometheus")
    with ExitStack() as es:
        sd = {v: tmp_path / f"{v}-targets.json" for v in ("sidecar", "direct")}
        old = es.enter_context(ExitStack())  # the old pod: closed (killed) at the rollout
        old_sim = simulator(old, tmp_path, "old-sim", scenario("the old pod, healthy", [HEALTHY_P0, 0.687]))
        old_exporter = sidecar(old, tmp_path, "old-exporter", old_sim, E2E_EXPORTER_CONFIG)
        labels = {"namespace": NAMESPACE, "pod": OLD_POD}
        write_targets(sd["sidecar"], [(old_exporter, labels)])
        write_targets(sd["direct"], [(old_sim, labels)])
        started = time.time()
        proms = {"sidecar": prometheus(es, tmp_path / "sidecar", rules.dump(rules.rule_file("sidecar", OPTIONS), ""),
                                       sd["sidecar"]),
                 "vllm-direct": prometheus(es, tmp_path / "direct", rules.dump(rules.rule_file("vllm-direct", OPTIONS), ""),
                                           sd["direct"])}

        # The old pod's healthy hours reach the model's day history (recorded in the long group).
        for variant, prom in proms.items():
            wait_for(lambda p=prom: (p.value(gate(NAMESPACE)) or 0) > 0.9, 90,
                     f"{variant}: the old pod's healthy position 0 in the model's day history")
        # ... and the old pod serves a whole "hour" (the hourly range, 30 s): its rates recorded every second.
        hour = durations.parse_duration(OPTIONS.range(OPTIONS.hourly_window))
        served = f'count_over_time(namespace_model_name:vllm_specdec_drafts:rate5m{{namespace="{NAMESPACE}"}}[{hour:g}s])'
        for variant, prom in proms.items():
            wait_for(lambda p=prom: (p.value(served) or 0) >= hour - 2, 2 * hour + 30, f"{variant}: a healthy hour")
            assert one(prom, position0(NAMESPACE, OLD_POD)) == pytest.approx(HEALTHY_P0, rel=0.02), variant
            assert not prom.query(f'ALERTS{{alertname="{ALERT}"}}'), variant

        # Rollout: the old pod is killed; the new one, broken from its first second, replaces it.
        old.close()
        killed = time.time()
        new_sim = simulator(es, tmp_path, "new-sim", scenario("the new pod, head partly broken", [BROKEN_P0, 0.06]))
        new_exporter = sidecar(es, tmp_path, "new-exporter", new_sim, E2E_EXPORTER_CONFIG)
        new, control = {"namespace": NAMESPACE, "pod": NEW_POD}, {"namespace": CONTROL, "pod": NEW_POD}
        write_targets(sd["sidecar"], [(new_exporter, new), (new_exporter, control)])
        write_targets(sd["direct"], [(new_sim, new), (new_sim, control)])

        firing = f'ALERTS{{alertname="{ALERT}",alertstate="firing"}}'
        for variant, prom in proms.items():
            wait_for(lambda p=prom: p.query(firing), 75, f"{variant}: {ALERT} to fire for the new pod")
            [alert] = [a for a in prom.alerts() if a["labels"]["alertname"] == ALERT and a["state"] == "firing"]
            got = {k: alert["labels"].get(k) for k in ("namespace", "pod", "model_name", "severity")}
            assert got == {"namespace": NAMESPACE, "pod": NEW_POD, "model_name": SERVED, "severity": "warning"}, alert
            assert f"{NAMESPACE}/{NEW_POD}" in alert["annotations"]["description"], alert
            # The same counters in both namespaces; only the history differs: the model's best hour in
            # NAMESPACE is still the old pod's, the control namespace has only ever seen the broken head.
            for namespace in (NAMESPACE, CONTROL):
                assert one(prom, position0(namespace, NEW_POD)) == pytest.approx(BROKEN_P0, rel=0.05), (variant, namespace)
            assert one(prom, gate(NAMESPACE)) == pytest.approx(HEALTHY_P0, rel=0.02), (variant, history(prom, started))
            assert_no_healthy_history(prom, CONTROL, variant)
            assert not prom.query("namespace_pod_model_name:vllm_specdec_baseline_mean_acceptance_length:max"), variant

        for variant, prom in proms.items():
            # Several more evaluations firing for the new pod: the control, fed the same counters, would
            # have been pending by now; nothing ever pended or fired but the new pod in NAMESPACE.
            wait_for(lambda p=prom: (p.value(f"count_over_time({firing}[1m])") or 0) >= 6, 30,
                     f"{variant}: {ALERT} firing for several evaluations")
            ever = prom.query_range(f'ALERTS{{alertname="{ALERT}"}}', started - 5, time.time() + 1, 1)
            assert {(a["metric"]["namespace"], a["metric"]["pod"], a["metric"]["alertstate"]) for a in ever} == {
                (NAMESPACE, NEW_POD, "pending"), (NAMESPACE, NEW_POD, "firing")}, (variant, [a["metric"] for a in ever])
            states = {a["metric"]["alertstate"]: min(float(t) for t, _ in a["values"]) for a in ever}
            assert killed < states["pending"] < states["firing"], (variant, killed, states)
            assert_no_healthy_history(prom, CONTROL, variant)
            # AcceptanceDropped reads the model's best hour at the server's k the same way: whatever it has
            # reached by now (its for is 3m), it was for the new pod in NAMESPACE alone.
            dropped = prom.query_range('ALERTS{alertname="VLLMSpecDecodeAcceptanceDropped"}', started - 5, time.time() + 1, 1)
            assert {(a["metric"]["namespace"], a["metric"]["pod"]) for a in dropped} <= {(NAMESPACE, NEW_POD)}, variant
