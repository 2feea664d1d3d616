"""``runs``: planted knob effects recovered inside their intervals, a null knob with no detectable effect, the onset
of a late effect at its step, ``diff``'s numbers on two runs, the state cache, knobs from a dump's metadata."""

from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest

from rollout_diag.decisions.rowmetrics import RowMetric
from rollout_diag.decisions.runs import compare_runs, step_errors
from rollout_diag.drivers import runs as runs_driver
from rollout_diag.drivers.diff import diff_runs
from rollout_diag.drivers.dump import Dump
from rollout_diag.drivers.runs import RunSpec, compare_dumps, knob_columns, load_knobs, parse_run, read_run
from rollout_diag.errors import ConfigError
from rollout_diag.results import RowStats
from tests.helpers.runs import k3_of, write_run
from tests.helpers.schema import validator

K3, ABS = "rollout_corr/k3_kl", "mismatch/logprob_abs_diff"
LATE = 12  # the kv knob triples δ from this step on (20 steps)


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return {
        "base": write_run(root / "base.parquet", 1),
        "r3": write_run(root / "r3.parquet", 2, scale=0.25),  # δ × 1/4: k3 × ~1/16, mean |δ| × 1/4
        "tp4": write_run(root / "tp4.parquet", 3),  # no effect
        "fp8kv": write_run(root / "kv.parquet", 4, late_scale=3.0, late_from=LATE),  # δ × 3 from step 12
        "both": write_run(root / "both.parquet", 5, scale=0.25),  # r3 on and tp 4: makes the design a fit
    }


KNOBS = {
    "base": {"r3": "off", "tp": 8, "kv": "bf16"},
    "r3": {"r3": "on", "tp": 8, "kv": "bf16"},
    "tp4": {"r3": "off", "tp": 4, "kv": "bf16"},
    "fp8kv": {"r3": "off", "tp": 8, "kv": "fp8"},
    "both": {"r3": "on", "tp": 4, "kv": "bf16"},
}


def _specs(dumps, names):
    return [RunSpec(name, Dump(str(dumps[name])), KNOBS[name]) for name in names]


def _effect(result, knob, metric):
    (found,) = [e for e in result.effects if e.knob == knob and e.metric == metric]
    return found


def _inside(effect, expected):
    assert effect.low <= expected <= effect.high, (effect, expected)


# Expected ratios: mean |δ| ∝ scale; k3 = expm1(σ²·scale²/2) (tests/helpers/runs.py). The kv run's run-level value
# is the mean over 20 equal steps of 12 at scale 1 and 8 at scale 3.
R3_K3 = k3_of(0.25) / k3_of(1.0)  # ≈ 0.0623
KV_K3 = (LATE * k3_of(1.0) + (20 - LATE) * k3_of(3.0)) / (20 * k3_of(1.0))  # ≈ 4.22
KV_ABS = (LATE + (20 - LATE) * 3.0) / 20  # 1.8


def test_planted_effects_pairs(dumps):
    result = compare_dumps(_specs(dumps, ["base", "r3", "tp4", "fp8kv"]), workers=1, metadata_knobs=False)
    assert {e.method for e in result.effects} == {"pair"}
    _inside(_effect(result, "r3", K3), R3_K3)
    _inside(_effect(result, "r3", ABS), 0.25)
    _inside(_effect(result, "kv", K3), KV_K3)
    _inside(_effect(result, "kv", ABS), KV_ABS)
    for metric in (K3, ABS):
        assert _effect(result, "r3", metric).detectable and _effect(result, "kv", metric).detectable
        null = _effect(result, "tp", metric)
        assert not null.detectable and null.low <= 1.0 <= null.high
    onsets = {run.name: run.onset_step for run in result.runs}
    assert onsets["base"] is None and onsets["tp4"] is None and onsets["r3"] == 0
    assert abs(onsets["fp8kv"] - LATE) <= 1
    assert result.answer.startswith("r3=on cut k3_kl 1") and "tp had no detectable effect" in result.answer
    validator("runs.schema.json").validate(json.loads(json.dumps(result.to_json())))
    records = result.step_records()
    assert len(records["run"]) == 4 * 20 and set(records) >= {"run", "step", "knob:r3", K3}


def test_planted_effects_fit(dumps):
    result = compare_dumps(_specs(dumps, ["base", "r3", "tp4", "fp8kv", "both"]), workers=1, metadata_knobs=False)
    r3 = _effect(result, "r3", K3)
    assert r3.method == "fit" and r3.detectable
    _inside(r3, R3_K3)
    _inside(_effect(result, "r3", ABS), 0.25)
    assert not _effect(result, "tp", K3).detectable


def test_two_runs_equal_diff(dumps):
    """runs on A and B: each key metric's B/A and B − A interval are diff's (same bootstrap streams)."""
    a, b = str(dumps["base"]), str(dumps["fp8kv"])
    result = compare_dumps([RunSpec("a", Dump(a)), RunSpec("b", Dump(b))], workers=1, metadata_knobs=False)
    diffed = diff_runs(Dump(a), Dump(b))
    for metric in diffed.metrics:
        found = [e for e in result.effects if e.metric == metric.metric]
        if not found:
            continue  # a key metric diff has and runs does not report
        (effect,) = found
        assert effect.knob == "run" and (effect.from_, effect.to) == ("a", "b")
        assert effect.ratio == metric.ratio
        assert effect.difference == metric.difference
        assert (effect.difference_low, effect.difference_high) == (metric.low, metric.high)


def test_state_dir_reads_each_run_once(dumps, tmp_path, monkeypatch):
    specs = _specs(dumps, ["base", "tp4"])
    first = compare_dumps(specs, workers=1, state_dir=tmp_path)
    assert len(list(tmp_path.glob("run-*.pkl"))) == 2

    def refuse(*_):
        raise AssertionError("read again")

    monkeypatch.setattr(runs_driver, "read_run", refuse)
    again = compare_dumps(specs, workers=1, state_dir=tmp_path)
    assert json.dumps(again.to_json()) == json.dumps(first.to_json())
    stat = os.stat(dumps["tp4"])
    os.utime(dumps["tp4"], ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # a changed file is read again
    with pytest.raises(AssertionError, match="read again"):
        compare_dumps(specs, workers=1, state_dir=tmp_path)


def test_processes_equal_one_process(dumps):
    specs = _specs(dumps, ["base", "r3", "tp4"])
    one = compare_dumps(specs, workers=1)
    many = compare_dumps(specs, workers=2)
    assert json.dumps(one.to_json()) == json.dumps(many.to_json())


def test_state_pickles(dumps):
    state = read_run(Dump(str(dumps["base"])), ())
    back = pickle.loads(pickle.dumps(state))
    assert back.summary.run.metrics == state.summary.run.metrics
    np.testing.assert_array_equal(back.rows.sums["catastrophic"], state.rows.sums["catastrophic"])


def test_knobs_from_writer_metadata(tmp_path):
    from rollout_diag.io.writer import DumpWriter

    rng = np.random.default_rng(0)
    paths = []
    for name, tp in (("x", 8), ("y", 4)):
        path = tmp_path / f"{name}.parquet"
        with DumpWriter(path, config={"tp": tp}) as writer:
            for step in range(3):
                trainer = -1.0 - rng.exponential(1.0, (8, 16))
                rollout = trainer + 0.05 * rng.standard_normal((8, 16))
                writer.write_step(
                    step, old_log_probs=trainer, rollout_log_probs=rollout, response_mask=np.ones((8, 16))
                )
        paths.append(path)
    result = compare_dumps([RunSpec("x", Dump(str(paths[0]))), RunSpec("y", Dump(str(paths[1])))], workers=1)
    assert [run.knobs for run in result.runs] == [{"tp": "8"}, {"tp": "4"}]
    assert {e.knob for e in result.effects} == {"tp"}


def test_bad_designs(dumps):
    with pytest.raises(ConfigError, match="change together"):
        confounded = [
            RunSpec("base", Dump(str(dumps["base"])), {"a": 1, "b": 1}),
            RunSpec("r3", Dump(str(dumps["r3"])), {"a": 2, "b": 2}),
        ]
        compare_dumps(confounded, workers=1, metadata_knobs=False)
    with pytest.raises(ConfigError, match="no value for knob 'tp'"):
        compare_dumps(
            [RunSpec("base", Dump(str(dumps["base"])), {"tp": 8}), RunSpec("r3", Dump(str(dumps["r3"])))],
            workers=1,
            metadata_knobs=False,
        )
    with pytest.raises(ConfigError, match="two or more"):
        compare_runs([])


@pytest.mark.parametrize(("option", "said"), [({"workers": 4}, "workers=4"), ({"backend": "ray"}, "backend='ray'")])
def test_a_runs_dump_option_that_one_process_cannot_honour_is_refused(dumps, monkeypatch, option, said):
    """Each run reads in one process: a run's Dump asking for workers or another backend is refused before anything
    is read, naming the run (compare_dumps' own ``workers`` reads runs in parallel)."""
    monkeypatch.setattr(runs_driver, "read_run", lambda *_: pytest.fail("read before the options were checked"))
    specs = [RunSpec("base", Dump(str(dumps["base"]))), RunSpec("r3", Dump(str(dumps["r3"]), **option))]
    with pytest.raises(ConfigError) as caught:
        compare_dumps(specs, workers=1, metadata_knobs=False)
    assert str(caught.value).startswith(f"run 'r3': {said}: compare_dumps cannot honour it")
    assert "reads runs in parallel" in str(caught.value)
    ok = [RunSpec("base", Dump(str(dumps["base"]), workers=1)), RunSpec("r3", str(dumps["r3"]))]  # a path: its Dump
    monkeypatch.undo()
    assert len(compare_dumps(ok, workers=1, metadata_knobs=False).runs) == 2  # one process is what a run does


def test_step_errors_by_hand():
    """Ratio estimator per step: step 0 rows (num, den) = (1, 2), (3, 2): m = 4/4 = 1, residuals −1, 1, SE =
    √(2/1 · 2) / 4 = 0.5; step 1 has one row: SE NaN."""
    rows = RowStats(np.array([0, 0, 1]), np.array([2.0, 2.0, 1.0]), {"x": np.array([1.0, 3.0, 5.0])})
    metric = RowMetric("x", lambda r: r.sums["x"], lambda r: r.tokens)
    steps, values, errors = step_errors(rows, metric)
    assert steps.tolist() == [0, 1] and values.tolist() == [1.0, 5.0]
    assert errors[0] == pytest.approx(0.5, rel=1e-12) and np.isnan(errors[1])


def test_command_line_parsing(tmp_path):
    assert parse_run("base=run/") == ("base", "run/")
    assert parse_run("runs/step=3") == ("step=3", "runs/step=3")
    assert knob_columns(["tp=8,4"], ["a", "b"]) == {"a": {"tp": "8"}, "b": {"tp": "4"}}
    with pytest.raises(ConfigError, match="2 values for 3 runs"):
        knob_columns(["tp=8,4"], ["a", "b", "c"])
    file = tmp_path / "runs.toml"
    file.write_text('[a]\ntp = 8\n[b]\ntp = 4\nr3 = "on"\n')
    assert load_knobs(file, ["a", "b"]) == {"a": {"tp": 8}, "b": {"tp": 4, "r3": "on"}}
    with pytest.raises(ConfigError, match=r"\[c\] names no run"):
        file.write_text("[c]\ntp = 1\n")
        load_knobs(file, ["a", "b"])


def test_null_knob_alone_says_no_effect(dumps):
    """Two runs drawn alike (different seeds): every interval holds 1, the answer says so, no onset."""
    result = compare_dumps(_specs(dumps, ["base", "tp4"]), workers=1, metadata_knobs=False)
    assert result.answer.startswith("no knob had a detectable effect on k3_kl")
    assert not any(effect.detectable for effect in result.effects)
    assert [run.onset_step for run in result.runs] == [None, None]


@pytest.mark.parametrize("chunk_tokens", [1000, 4099])
def test_chunk_size_leaves_the_answer(dumps, chunk_tokens):
    """Chunks that cut the dump elsewhere (1000 and 4099 tokens against the default) give the same runs to 1e-12."""
    whole = compare_dumps(_specs(dumps, ["base", "r3"]), workers=1, metadata_knobs=False)
    specs = [RunSpec(name, Dump(str(dumps[name]), chunk_tokens=chunk_tokens), KNOBS[name]) for name in ("base", "r3")]
    chunked = compare_dumps(specs, workers=1, metadata_knobs=False)
    for a, b in zip(whole.effects, chunked.effects, strict=True):
        if a.ratio is None:
            assert b.ratio is None
            continue
        np.testing.assert_allclose([a.ratio, a.low, a.high], [b.ratio, b.low, b.high], rtol=1e-12)
    assert [run.onset_step for run in whole.runs] == [run.onset_step for run in chunked.runs]
