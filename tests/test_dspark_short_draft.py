"""Issue 31 item 4: cause order follows evidence, and DeepSeek-V4.1 DSpark has profiles.

DSpark drafts a 5-token block; at k=7 its positions 5 and 6 are accepted in exactly 0 drafts
(what DeepSeek-V4.1 deployments report: vLLM runs its in-checkpoint DSpark stages, k=5-7).
Random-token load or a partly broken head cannot produce two positions at exactly 0 over many
drafts: the draft is shorter than k, and that cause comes first and alone. The shapes vary the
first five positions around the published DSpark figures of docs/baselines.md.
"""

from __future__ import annotations

import pytest
from vllm_specdec_exporter import config
from vllm_specdec_exporter.diagnosis import Earlier
from vllm_specdec_exporter.health import judge, match_profile
from vllm_specdec_exporter.model import Counters
from vllm_specdec_exporter.settings import default_profiles

DRAFTS = 60_000  # 200 drafts/s over the 5m health window
V41, V4_FLASH, SERVED = "deepseek-ai/DeepSeek-V4.1-Flash", "deepseek-ai/DeepSeek-V4-Flash", "dsv41"

# Survival (per-position acceptance) of positions 0-4; positions 5 and 6 are exactly 0.
SHAPES = {
    "v4-flash-0731-k5": (0.579, 0.447, 0.316, 0.237, 0.158),  # vLLM PR #41834, AL 2.74 at k=5
    "ascend-0731-a": (0.739, 0.478, 0.261, 0.174, 0.130),  # vllm-ascend#13640, first five
    "ascend-0731-b": (0.691, 0.418, 0.382, 0.182, 0.127),  # the same report's second line
    "v4-pro-0813-curve": (0.84, 0.67, 0.50, 0.35, 0.25),  # the golden AL curve's steps k=1..5
    "v41-golden-3.51": (0.85, 0.66, 0.45, 0.32, 0.23),  # sums to 2.51: AL 3.51
    "v41-gsm8k-2.82": (0.70, 0.45, 0.30, 0.22, 0.15),  # sums to 1.82: AL 2.82
    "0731-k7-collapse": (0.181, 0.067, 0.039, 0.014, 0.009),  # PR #41834 at k=7: AL 1.31
    "p0-41-cond-41": (0.41, 0.168, 0.069, 0.028, 0.012),  # position 0 at the low end (0.41)
    "p0-44-cond-44": (0.44, 0.194, 0.085, 0.037, 0.016),
    "p0-48-cond-42": (0.48, 0.20, 0.085, 0.036, 0.015),
    "p0-43-cond-43": (0.43, 0.185, 0.080, 0.034, 0.015),
    "p0-68-cond-44": (0.68, 0.30, 0.13, 0.058, 0.025),  # position 0 at the high end (0.68)
}
SHORT = ("draft_shorter_than_k", "positions 5, 6 accepted in exactly 0 of 60,000 drafts at k=7: try k=5")


def k7(shape: tuple[float, ...], drafts: int = DRAFTS) -> Counters:
    counts = (*(round(s * drafts) for s in shape), 0, 0)
    return Counters(drafts, 7 * drafts, sum(counts), counts)


def profile(model: str, k: int = 7):
    return match_profile(default_profiles(), model, k, None)


def causes(engines: dict[str, Counters], model: str | None, earlier: Earlier | None = None, changes=()) -> list:
    p = profile(model) if model else None
    v = judge(engines, 300.0, p, config.DETECTION, config.DEFAULT_MIN_DRAFTS, changes, earlier)
    return [(h.cause, h.evidence) for h in v.causes]


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_a_draft_shorter_than_k_is_named_first_and_alone(name):
    """Whatever the verdict: against the V4.1 DSpark profile, against the V4-Flash MTP one (its
    position-0 floor makes the low shapes degraded), and for a served name with no profile
    whose position 0 was healthy within the day (the sidecar's fall)."""
    c = {"0": k7(SHAPES[name])}
    assert causes(c, V41) == [SHORT], name
    assert causes(c, V4_FLASH) == [SHORT], name
    assert causes(c, None, Earlier("1h", None, True)) == [SHORT], name
    assert causes(c, None) == [SHORT], name


def test_independent_evidence_stands_beside_the_short_draft():
    """A restart (seen by the sidecar) and one rank apart are evidence of their own: named after
    the short draft, never before it; the partly broken head read from the same positions is not."""
    low = k7(SHAPES["p0-43-cond-43"])
    assert causes({"0": low}, V41, changes=["a restart of engine 0"]) == [
        SHORT, ("configuration_change", "the fall coincides with a restart of engine 0")]
    healthy = k7(SHAPES["v41-golden-3.51"])
    got = causes({str(e): low if e == 3 else healthy for e in range(8)}, V41)
    # 480,000 drafts; engine 3 at 1 + 0.744 = 1.744; the other seven at 1 + 2.51 = 3.510
    assert got == [("draft_shorter_than_k", "positions 5, 6 accepted in exactly 0 of 480,000 drafts at k=7: try k=5"),
                   ("one_rank", "engine 3 at AL 1.744 while the other 7 are at AL 3.510")]


def test_deepseek_v41_dspark_profiles_from_published_figures():
    """docs/baselines.md: the lowest published V4.1-Flash DSpark k=5 figure, 2.82 (GSM8K on H20),
    is the floor for k=5..7: threshold 1 + 0.75 x 1.82 = 2.365. 3.51 (InferenceX's golden k=5)
    and 2.82 read ok; DSpark at k=7 at 1.31 reads degraded, with the short draft as its cause."""
    for k in (5, 6, 7):
        p = profile(V41, k)
        assert (p.name, p.mean_acceptance_length, p.method) == (f"deepseek-v4.1-flash-dspark-k{k}", 2.82, "dspark")
        assert profile("DeepSeek-V4.1-Flash-FP8", k) == p  # a quantisation's repository name
    assert profile(V41, 4) is None  # no published figure below k=5
    assert profile(V4_FLASH, 7).name == "deepseek-v4-flash-mtp-k7"  # V4 is not V4.1
    assert profile("deepseek-ai/DeepSeek-V4-Flash-0731", 5).name == "deepseek-v4-flash-mtp-k5"

    def k5(shape: tuple[float, ...]) -> Counters:
        counts = tuple(round(DRAFTS * s) for s in shape)
        return Counters(DRAFTS, 5 * DRAFTS, sum(counts), counts)

    for shape, state in ((SHAPES["v41-golden-3.51"], "ok"), (SHAPES["v41-gsm8k-2.82"], "ok"),
                         ((0.62, 0.38, 0.22, 0.12, 0.06), "ok"),  # AL 2.40
                         ((0.60, 0.36, 0.21, 0.11, 0.05), "degraded")):  # AL 2.33 < 2.365
        v = judge({"0": k5(shape)}, 300.0, profile(V41, 5), config.DETECTION, config.DEFAULT_MIN_DRAFTS)
        assert v.state == state, (shape, v.reason)
    # issue 34: what it costs, worked by hand: 2.82 / 2.33 = 1.21x the steps, 1 - 2.33 / 2.82 = 17 % wasted
    assert v.reason == ("mean acceptance length 2.330 < 2.365 (profile deepseek-v4.1-flash-dspark-k5: 2.82); "
                        "decode needs 1.2x the steps of a healthy head: 17% of decode work wasted")
    v = judge({"0": k7(SHAPES["0731-k7-collapse"])}, 300.0, profile(V41), config.DETECTION, config.DEFAULT_MIN_DRAFTS)
    assert v.state == "degraded" and [h.cause for h in v.causes] == ["draft_shorter_than_k"]
