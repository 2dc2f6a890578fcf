"""`diff` reproduces the acceptance that was measured on real DeepSeek-V4 deployments."""

from __future__ import annotations

import json

import pytest
from conftest import SEED_RECORDS
from seed_records import MODEL, load_records, render_dump
from vllm_specdec_exporter.cli import main


@pytest.fixture(scope="module")
def records():
    found, left_out = load_records(SEED_RECORDS)
    # The seed set holds 63 measured runs with counters; only one has no post-run counters.
    assert len(found) == 63, len(found)
    assert left_out == ["canada-quant__dsv4-flash-nvfp4-fp8-mtp/benchmarks/rtxpro6000/cardb_aime30_c8_thinking.json: no post-run counters"]
    return found


def test_every_recorded_run_is_reproduced(records, tmp_path, capsys):
    checked = 0
    for i, rec in enumerate(records):
        before, after = tmp_path / f"{i}-before.prom", tmp_path / f"{i}-after.prom"
        before.write_bytes(render_dump(rec.before))
        after.write_bytes(render_dump(rec.after))
        # In-process: the same code path as the console script, without 60 interpreter starts.
        assert main(["diff", str(before), str(after), "--format", "json"]) == 0, rec.name
        out = json.loads(capsys.readouterr().out)
        s = out["models"][MODEL]["all"]
        assert s["warnings"] == [], rec.name
        assert s["acceptance_rate"] == pytest.approx(rec.acceptance_rate, abs=rec.rate_tolerance), rec.name
        if rec.mean_acceptance_length is not None:
            assert s["mean_acceptance_length"] == pytest.approx(rec.mean_acceptance_length, abs=1e-9), rec.name
        if rec.per_position is not None:
            # per-position counts were recovered from rounded rates: half a draft of slack
            slack = 0.5 / s["num_drafts"] + 5e-5
            assert s["per_position_acceptance"] == pytest.approx(rec.per_position, abs=slack), rec.name
        checked += 1
    assert checked == len(records)
