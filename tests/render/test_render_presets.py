"""The compare-presets table (rollout_diag/render/presets.py)."""

from __future__ import annotations

import ast
import io
import re
from pathlib import Path

from rich.console import Console

from rollout_diag.decisions.intrusive import intrusive_reasons
from rollout_diag.presets import PRESETS
from rollout_diag.render import presets as render_presets
from rollout_diag.render.presets import INTRUSIVE_STYLE, presets_table
from rollout_diag.results import ComparisonResult, PresetResult, StepResult


def preset_result(name: str, metrics: dict[str, float]) -> PresetResult:
    preset = PRESETS[name]
    run = StepResult(None, 10, 1000, metrics)
    return PresetResult(preset.name, preset.config(), preset.mode, [], run, intrusive_reasons(metrics))


def render(result: ComparisonResult) -> str:
    out = io.StringIO()
    Console(file=out, width=220, color_system=None).print(presets_table(result))
    return out.getvalue()


def test_one_row_per_preset_with_settings_and_run_values():
    calm = preset_result(
        "decoupled_k3_rs_token_tis",
        {
            "rollout_corr/rollout_is_mean": 1.00021,
            "rollout_corr/rollout_is_max": 2.0,
            "rollout_corr/rollout_is_eff_sample_size": 0.9991,
            "rollout_corr/chi2_token": 0.0015,
            "summary/rejected_token_fraction": 0.0118,
            "summary/rejected_row_fraction": 0.0078,
            "summary/tokens_kept": 988.0,
        },
    )
    harsh = preset_result(
        "legacy_geometric_mask",
        {
            "mismatch/rollout_is_eff_sample_size": 0.4,
            "summary/rejected_token_fraction": 0.6,
            "summary/tokens_kept": 400.0,
        },
    )
    table = presets_table(ComparisonResult(["dump.parquet"], {}, [calm, harsh]))
    assert len(table.rows) == 2
    assert [style for _, style in table.rows] == [None, INTRUSIVE_STYLE]
    text = render(ComparisonResult(["dump.parquet"], {}, [calm, harsh]))
    assert "decoupled_k3_rs_token_tis" in text and "token 2.0" in text and "seq_mean_k3 0.01" in text
    assert "1.18 %" in text and "1.0002" in text and "988" in text
    assert "geometric mask [0.999, 1.001] veto [0.0001, ∞]" in text and "60.00 %" in text
    assert "! and bold red: intrusive (drops > 10% of tokens or ESS < 0.5)" in text
    assert re.search(r"^│ ! legacy_geometric_mask ", text, re.MULTILINE)  # marked without colour
    assert re.search(r"^│   decoupled_k3_rs_token_tis ", text, re.MULTILINE)


def test_render_module_imports_no_torch_at_run_time():
    """STYLE.md: render/ must not import torch or io (the result type is imported for type checking only)."""
    tree = ast.parse(Path(render_presets.__file__).read_text())
    imported = set()
    for node in tree.body:  # module level; the TYPE_CHECKING block is an ast.If and is skipped
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
    assert not {name for name in imported if name.split(".")[0] == "torch" or ".io" in name or name.endswith("compare")}
