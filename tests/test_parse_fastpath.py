"""The wanted-names fast path (issue 22 item 4) reads exactly what the line-by-line path reads:
the same samples, the same malformed lines and duplicates, the same issues at the same lines,
whatever the shape of the lines; and its cache of series stays bounded and unshared."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st
from vllm_specdec_exporter import config, parser
from vllm_specdec_exporter.parser import ParseError, parse

NAMES = (config.VLLM_V1_DRAFTS, config.VLLM_V1_DRAFT_TOKENS, config.VLLM_V1_ACCEPTED,
         config.VLLM_V1_ACCEPTED_PER_POS, config.VLLM_V1_GENERATION_TOKENS)

LABELS = ["", "{}", '{engine="0",model_name="m"}', '{engine="1",model_name="m"}', '{ engine="0" }',
          '{engine="0",}', '{engine="0",engine="1"}', r'{a="x\"y"}', '{a="b}c"}', '{a="é"}', '{a="1"',
          '{a="1"}}', "{a=1}", '{engine="0",model_name="m",position="0"}']
VALUES = ["1", "1.5e+06", "NaN", "+Inf", "-1", "1_0", "0x10", "", "1 2", "1 2 3", '1 # {a="b"} 2', "1#x",
          "\u0661", "1\r", "1 \t", "infinity", "1e400", "2 x"]
SEPARATORS = [" ", "\t", "  "]
wanted_line = st.builds(lambda n, lbl, sep, v: f"{n}{lbl}{sep}{v}", st.sampled_from(NAMES), st.sampled_from(LABELS),
                        st.sampled_from(SEPARATORS), st.sampled_from(VALUES))
other_line = st.sampled_from([
    f"# HELP {NAMES[0]} Number of drafts.", f"# TYPE {NAMES[0]} counter", "# HELP x spec_decode_ in a comment",
    f"{NAMES[0].removesuffix('_total')}_created{{i=\"{{i}}\"}} 1", "other_metric{i=\"{i}\"} 1",
    "other_spec_decode_total{i=\"{i}\"} 1", "", "# EOFX", "# EOF", "# EOF \r", "#EOF",
])


def _key(exp: parser.Exposition) -> tuple:
    samples = {n: [(s.name, s.labels, repr(s.value)) for s in exp.samples.get(n, [])] for n in NAMES}
    return samples, exp.malformed_lines, exp.duplicate_series, [str(i) for i in exp.issues], exp.openmetrics


def _both(text: str):
    out = []
    for wanted in (NAMES, None):
        try:
            exp = parse(text, wanted)
        except ParseError as e:
            out.append(type(e))
            continue
        out.append(_key(exp))
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(wanted_line, other_line), max_size=30), st.booleans(), st.booleans())
def test_the_fast_path_reads_what_the_line_by_line_path_reads(lines, first_is_sample, ends_with_newline):
    # Every other line is valid and told apart by its label, so the line-by-line path finds
    # no problem the fast path is not asked to look for.
    lines = [line.replace("{i}", str(i)) for i, line in enumerate(lines)]
    if first_is_sample:
        lines.insert(0, f'{NAMES[0]}{{engine="9"}} 3')
    text = "\n".join(lines) + ("\n" if ends_with_newline else "")
    fast, reference = _both(text)
    assert fast == reference


def test_each_shape_alone_and_twice():
    for name in NAMES:
        for lbl in LABELS:
            for v in VALUES:
                line = f"{name}{lbl} {v}\n"
                fast, reference = _both("# TYPE x counter\n" + line + line)
                assert fast == reference, line


def test_a_second_poll_reads_the_new_values_of_the_same_series():
    for poll in range(3):
        text = "".join(f'{NAMES[0]}{{engine="{e}",model_name="m"}} {100 * poll + e}\n' for e in range(4))
        exp = parse(text, NAMES)
        assert [s.value for s in exp.samples[NAMES[0]]] == [100.0 * poll + e for e in range(4)]


def test_changing_a_sample_labels_does_not_change_the_next_parse():
    text = f'{NAMES[0]}{{engine="0",model_name="m"}} 1\n'
    parse(text, NAMES).samples[NAMES[0]][0].labels["engine"] = "changed"
    assert parse(text, NAMES).samples[NAMES[0]][0].labels == {"engine": "0", "model_name": "m"}


def test_the_series_cache_stays_bounded():
    big = "x" * (parser._SERIES_CACHED_BYTES + 1)
    parse(f'{NAMES[0]}{{engine="0",model_name="{big}"}} 1\n', NAMES)
    assert not any(big.encode() in raw for raw in parser._SERIES) and big not in parser._SERIES_STRINGS
    for start in range(0, parser._SERIES_CACHED + 500, 1000):
        text = "".join(f'{NAMES[0]}{{engine="{e}"}} 1\n' for e in range(start, start + 1000))
        exp = parse(text, NAMES)
        assert len(exp.samples[NAMES[0]]) == 1000
        assert len(parser._SERIES) <= parser._SERIES_CACHED


def test_a_stray_hit_far_from_the_families_is_read():
    """Anchors far apart (a mention at the top, the families at the bottom) are read as two
    stretches: every line is found, none twice."""
    filler = "".join(f'other{{i="{i}"}} 1\n' for i in range(5000))
    text = (f'{NAMES[4]}{{engine="0"}} 7\n' + filler + "# HELP a spec_decode_ mention\n" + filler
            + f'{NAMES[0]}{{engine="0"}} 1\n{NAMES[0]}{{engine="0"}} 2\n')
    exp = parse(text, NAMES)
    assert [s.value for s in exp.samples[NAMES[4]]] == [7.0]
    assert [s.value for s in exp.samples[NAMES[0]]] == [1.0]
    assert exp.duplicate_series == 1 and exp.issues[0].line == 10004
    assert math.isclose(parse(text).samples[NAMES[0]][0].value, 1.0)


def reference_eof(data: bytes) -> int:
    """The first line that is '# EOF' (blanks and CR after it allowed), walked line by line."""
    start = 0
    for line in data.split(b"\n"):
        if line.startswith(b"# EOF") and line.strip() == b"# EOF":
            return start
        start += len(line) + 1
    return -1


eof_piece = st.sampled_from(["# EOF", "# EOF \r", "#", "# EOFX", "x # EOF", " # EOF", "#\n# EOF", "a", "",
                             '1 # {a="b"} 2', "# HELP #", "\n", "O", "OOOO", "# EOFO", "O# EOF", "# EO", "EOF",
                             "# EOF\nO", "# EOF\n\nO", "# E\nOF"])


@settings(max_examples=300, deadline=None)
@given(st.lists(eof_piece, max_size=300), st.sampled_from(["\n", "", "\n\n"]))
def test_eof_is_the_first_eof_line_however_many_hashes(pieces, sep):
    """Past its budget of O's the search goes on by '\\n# EOF': the same first line either way."""
    data = sep.join(pieces).encode()
    assert parser._find_eof(data) == reference_eof(data)
    hashes = ("O\n" * 2000).encode()  # well past the budget
    assert parser._find_eof(hashes + data) == (-1 if reference_eof(data) == -1 else len(hashes) + reference_eof(data))
    assert parser._find_eof(data + b"\n" + hashes) == reference_eof(data + b"\n" + hashes)
