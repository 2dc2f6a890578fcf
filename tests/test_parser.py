"""Parser: formats, traps and hostile input."""

from __future__ import annotations

import pytest
from vllm_specdec_exporter import config
from vllm_specdec_exporter.adapters import NoSpecDecodeFamilies, extract
from vllm_specdec_exporter.parser import NotPrometheusText, PayloadTooLarge, parse, parse_sample_line

D, T, A, P, G = (
    config.VLLM_V1_DRAFTS,
    config.VLLM_V1_DRAFT_TOKENS,
    config.VLLM_V1_ACCEPTED,
    config.VLLM_V1_ACCEPTED_PER_POS,
    config.VLLM_V1_GENERATION_TOKENS,
)


def engine_lines(model: str = "m", engine: str = "0", counts=(100, 200, 150, (90, 60)), gen=500) -> str:
    drafts, tokens, accepted, per_pos = counts
    lbl = f'engine="{engine}",model_name="{model}"'
    out = [f"{D}{{{lbl}}} {drafts}", f"{T}{{{lbl}}} {tokens}", f"{A}{{{lbl}}} {accepted}"]
    out += [f'{P}{{{lbl},position="{i}"}} {v}' for i, v in enumerate(per_pos)]
    out.append(f"{G}{{{lbl}}} {gen}")
    return "\n".join(out) + "\n"


def test_go_float_formats():
    assert parse_sample_line("x 1.561637e+06").value == 1561637.0
    assert parse_sample_line("x +Inf").value == float("inf")
    assert parse_sample_line("x -Inf").value == float("-inf")
    v = parse_sample_line("x NaN").value
    assert v != v
    assert parse_sample_line("x 27453.0 1700000000000").value == 27453.0


def test_escaped_label_values():
    s = parse_sample_line(r'x{a="q\"uote",b="back\\slash",c="new\nline",d="brace}"} 1')
    assert s.labels == {"a": 'q"uote', "b": "back\\slash", "c": "new\nline", "d": "brace}"}


@pytest.mark.parametrize(
    "line",
    ["x{a=\"1\" 5", "x{a=1} 5", "x 1_000", "x", "x{} ", "x abc", 'x{a="1",a="2"} 3', "x 1 2 3", "{a=\"1\"} 2"],
)
def test_malformed_lines_are_refused(line):
    exp = parse("y 1\n" + line + "\nz 2\n")
    assert exp.malformed_lines == 1
    assert "y" in exp.samples and "z" in exp.samples  # the rest of the payload still counts
    assert exp.issues[0].line == 2


def test_label_order_does_not_matter():
    a = extract(engine_lines())
    b = extract(
        f'{D}{{model_name="m",engine="0"}} 100\n{T}{{model_name="m", engine="0"}} 200\n'
        f'{A}{{model_name="m",engine="0"}} 150\n{P}{{position="0",model_name="m",engine="0"}} 90\n'
        f'{P}{{model_name="m",position="1",engine="0"}} 60\n{G}{{model_name="m",engine="0"}} 500\n'
    )
    assert a.engines == b.engines


def test_created_families_and_prefixes_are_never_matched():
    text = engine_lines() + (
        f'{D.removesuffix("_total")}_created{{engine="0",model_name="m"}} 1.7959717480806296e+09\n'
        f'{A.removesuffix("_total")}_created{{engine="0",model_name="m"}} 1.7e9\n'
        f'{D}_extra{{engine="0",model_name="m"}} 99\n'
    )
    snap = extract(text)
    c = snap.engines[("m", "0")]
    assert (c.drafts, c.accepted, c.per_position) == (100, 150, (90, 60))
    assert snap.warnings == ()


def test_openmetrics_counters_typed_by_base_name():
    text = (
        "# HELP vllm:spec_decode_num_drafts Number of drafts.\n"
        "# TYPE vllm:spec_decode_num_drafts counter\n"
        "# UNIT vllm:spec_decode_num_drafts drafts\n"
        + engine_lines().replace(" 100\n", ' 100 # {trace_id="a"} 1.0\n', 1)
        + 'vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e9\n'
        + "# EOF\n"
    )
    exp = parse(text)
    assert exp.openmetrics and exp.malformed_lines == 0
    assert extract(text).engines[("m", "0")].drafts == 100


def test_samples_after_eof_are_not_counted():
    text = engine_lines() + "# EOF\n" + engine_lines(engine="1")
    snap = extract(text)
    assert list(snap.engines) == [("m", "0")]
    assert snap.malformed_lines == 1


def test_fast_path_equals_full_parse(payloads):
    for name, data in payloads.items():
        full = parse(data)
        fast = parse(data, {D, T, A, P, G})
        for fam in (D, T, A, P, G):
            assert fast.samples[fam] == full.samples[fam], (name, fam)
        assert full.malformed_lines == 0 and full.duplicate_series == 0


def test_size_cap():
    with pytest.raises(PayloadTooLarge, match="over the 100-byte cap"):
        parse(engine_lines(), max_bytes=100)
    assert config.DEFAULT_MAX_PAYLOAD_BYTES == 32 * 1024 * 1024


@pytest.mark.parametrize(
    "data, message",
    [
        (b"", "empty payload"),
        (b"  \n\n", "empty payload"),
        (b"<!DOCTYPE html><html><body>502 Bad Gateway</body></html>", "HTML"),
        (bytes(range(256)) * 4, "binary"),
        (b"\xff\xfe\x00garbage", "binary"),
        (b"{\"error\": \"not found\"}", "not Prometheus text"),
    ],
)
def test_not_prometheus_text(data, message):
    with pytest.raises(NotPrometheusText, match=message):
        parse(data)


def test_truncated_payload_keeps_what_arrived(payloads):
    data = payloads["vllm-v1-dp8-k2-single-process.prom"]
    cut = data.index(b'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="5"') + 70
    snap = extract(data[:cut])
    # Engines whose position series were cut off are reported and left out, not guessed.
    text = "\n".join(snap.warnings)
    assert "truncated" in text
    for engine in "567":
        assert f'engine="{engine}",model_name="deepseek-ai/DeepSeek-V4-Pro": no {P}' in text
    assert sorted(e for _, e in snap.engines) == ["0", "1", "2", "3", "4"]
    assert all(c.k == 2 for c in snap.engines.values())


def test_a_line_cut_inside_its_value_is_never_read():
    text = engine_lines().rstrip("\n")  # ends with the generation line: "... 500" cut to "... 50"
    snap = extract(text[:-1])
    assert snap.engines[("m", "0")].generation_tokens is None  # not 50
    assert snap.malformed_lines == 1
    assert any("truncated" in w for w in snap.warnings)


def test_ten_megabyte_single_line():
    line = b"vllm:spec_decode_num_drafts_total{" + b"a" * (10 * 1024 * 1024) + b"\n" + engine_lines().encode()
    snap = extract(line)
    assert snap.engines[("m", "0")].drafts == 100
    assert snap.malformed_lines == 1


def test_duplicate_series_are_reported_and_first_kept():
    text = engine_lines() + f'{D}{{engine="0",model_name="m"}} 999\n'
    snap = extract(text)
    assert snap.duplicate_series == 1
    assert snap.engines[("m", "0")].drafts == 100
    assert any("duplicate series" in w and "999" not in w for w in snap.warnings)


def test_spec_decode_off_is_not_zero():
    with pytest.raises(NoSpecDecodeFamilies, match="vllm:spec_decode_num_drafts_total"):
        extract(f'{G}{{engine="0",model_name="m"}} 5\n')
    zeros = extract(engine_lines(counts=(0, 0, 0, (0, 0)), gen=0))
    assert zeros.engines[("m", "0")].drafts == 0


def test_incomplete_engine_is_left_out_with_a_warning():
    text = engine_lines(engine="0") + engine_lines(engine="1").split("\n", 1)[1]  # engine 1 lacks drafts
    snap = extract(text)
    assert list(snap.engines) == [("m", "0")]
    assert any('engine="1"' in w and D in w for w in snap.warnings)


def test_negative_or_nan_counters_are_refused():
    snap = extract(engine_lines(counts=("NaN", 200, 150, (90, 60))))
    assert snap.engines == {}
    assert any("not a counter value" in w for w in snap.warnings)


def test_crlf_line_endings():
    snap = extract(engine_lines().replace("\n", "\r\n"))
    assert snap.engines[("m", "0")].per_position == (90, 60)


# --- issue 10 item 8 ---

def test_eof_is_honoured_wherever_it_is():
    padding = "# HELP padding " + "x" * 200 + "\n"
    text = engine_lines() + "# EOF\n" + padding * 100 + engine_lines(engine="1")  # EOF 20 KB before the end
    snap = extract(text)
    assert list(snap.engines) == [("m", "0")]
    assert parse(text).openmetrics
    assert list(extract(engine_lines() + "# EOFX\n" + engine_lines(engine="1")).engines) == [("m", "0"), ("m", "1")]


@pytest.mark.parametrize("value", ["١٢٣", "１２", "1٢"])  # noqa: RUF001 -- non-ASCII digits are the point
def test_non_ascii_digits_make_the_line_malformed(value):
    exp = parse(f'{D}{{engine="0",model_name="m"}} {value}\n', {D})
    assert exp.malformed_lines == 1 and not exp.samples


def test_a_payload_that_is_not_utf8_is_not_prometheus_text():
    with pytest.raises(NotPrometheusText, match=r"not valid UTF-8 \(line 2"):

        parse(("# ok\n" + engine_lines()).encode().replace(b'm"', b'm\xe9"', 1))  # Latin-1 on line 2
