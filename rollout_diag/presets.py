"""Rollout-correction presets: named configurations of IS weights (METRICS.md §2), rejection sampling (§3)
and the legacy mismatch helper (§8), with threshold parsing. Pure data: no torch, no I/O beyond reading a
presets file.

A :class:`Preset` keeps its settings as the user wrote them (``rollout_is_threshold="0.5_5.0"``) and the
parsed forms the accumulators read (:class:`ImportanceSampling`, :class:`RejectionOption`,
:class:`LegacyCorrection`). Every bad spec raises :class:`~rollout_diag.errors.ConfigError` with a
one-line message naming the setting, the value and the fix.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollout_diag.errors import ConfigError, option_name

IS_LEVELS = ("token", "sequence")
RS_SCOPES = ("token", "seq_sum", "seq_mean", "seq_max")
RS_STATISTICS = ("k1", "k2", "k3")
# The gates of 2026's trainers (docs/gates.md, "Probability gates"), on the sampled token's probabilities p = exp(a)
# (trainer) and q = exp(r) (rollout), upper bound only, like k2/k3:
#   kpop: AReaL's KPop, max(KL(B(p)‖B(q)), KL(B(q)‖B(p))) with p, q clamped to [1e-8, 1 − 1e-8];
#   bkl:  OpenRLHF's binary_kl gating, KL(B(q)‖B(p)) with p, q clamped to [1e-6, 1 − 1e-6];
#   tv:   prime-rl's ipo trust region and OpenRLHF's tv gating, |p − q|.
# B(x) is the Bernoulli "this token / any other token"; each is computed in float64 and clamped at 0 (OpenRLHF #1354).
GATE_STATISTICS = ("kpop", "bkl", "tv")
# seq_max_k1 does not exist (§3): the max of k1 = −log ρ over a row is not a divergence bound.
RS_OPTIONS = tuple(
    f"{scope}_{statistic}"
    for statistic_group in (RS_STATISTICS, GATE_STATISTICS)
    for scope in RS_SCOPES
    for statistic in statistic_group
    if (scope, statistic) != ("seq_max", "k1")
)
# verl #6800 (open) spells AReaL's token gate as the option "binary_kl": read as token_kpop.
RS_ALIASES = {"binary_kl": "token_kpop"}
LEGACY_LEVELS = ("token", "sequence", "geometric")
LEGACY_MODES = ("truncate", "mask", "both")
DEFAULT_IS_THRESHOLD = "2.0"  # verl RolloutCorrectionConfig.rollout_is_threshold default
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
_LEGACY_THRESHOLDS = ("legacy_is_threshold", "legacy_is_mask_threshold", "legacy_is_veto_threshold")


# ------------------------------------------------------------------------------------- parsed forms
@dataclass(frozen=True)
class ImportanceSampling:
    """§2 parsed: w = min(w_raw, U) (TIS) or w_raw inside [L, U] else 0 (IcePop); ``lower`` is L'."""

    level: str  # "token" | "sequence"
    upper: float  # U
    lower: float  # L' = L for IcePop, else 1/U
    icepop: bool
    batch_normalize: bool


@dataclass(frozen=True)
class RejectionOption:
    """One §3 option with its bounds in metric space: k1 keeps log L ≤ stat ≤ log U; k2/k3 keep stat ≤ U.

    ``lower`` is log L for k1 and 0.0 for k2/k3 (the clamp floor of ``_std``; no lower test there).
    Equality ignores ``spec``, so "2" and "2.0" share one accumulator.
    """

    option: str  # e.g. "seq_mean_k3"
    scope: str  # "token" | "seq_sum" | "seq_mean" | "seq_max"
    statistic: str  # "k1" | "k2" | "k3"
    lower: float
    upper: float
    spec: str = field(compare=False)

    @property
    def has_lower(self) -> bool:
        """Only k1 options test (and report fractions below) a lower bound."""
        return self.statistic == "k1"

    @property
    def is_sequence(self) -> bool:
        return self.scope != "token"

    @property
    def k1_asymmetric(self) -> bool:
        """A k1 option whose ratio bounds L, U are not reciprocal (L·U ≠ 1): verl keeps log L ≤ k1 ≤ log U with
        k1 = −log ρ, so it applies ρ ∈ [1/U, 1/L], not the [L, U] one reads in the config (verl #6377, closed
        unmerged)."""
        return self.statistic == "k1" and k1_bounds_asymmetric(self.lower, self.upper)


@dataclass(frozen=True)
class LegacyCorrection:
    """§8 parsed: the xtuner / early-verl mismatch helper. Bounds are ratios; ``veto_*`` None = no bound."""

    level: str  # "token" | "sequence" | "geometric"
    mode: str  # "truncate" | "mask" | "both"
    upper: float
    lower: float
    mask_upper: float
    mask_lower: float
    veto_lower: float | None
    veto_upper: float | None

    @property
    def masks(self) -> bool:
        return self.mode in ("mask", "both")

    @property
    def vetoes(self) -> bool:
        return self.veto_lower is not None or self.veto_upper is not None


# ------------------------------------------------------------------------------------------ presets
@dataclass(frozen=True)
class Preset:
    """A named correction config, as verl's ``RolloutCorrectionConfig`` spells it (or the legacy helper's).

    Construction parses and validates every setting (raises ConfigError); the parsed forms are in
    ``importance``, ``rejection`` and ``legacy``.
    """

    name: str
    mode: str = "custom"
    rollout_is: str | None = None
    rollout_is_threshold: str | None = None
    rollout_is_batch_normalize: bool = False
    rollout_rs: tuple[str, ...] = ()
    rollout_rs_threshold: str | None = None
    legacy_is: str | None = None
    legacy_is_mode: str | None = None
    legacy_is_threshold: str | None = None
    legacy_is_mask_threshold: str | None = None
    legacy_is_veto_threshold: str | None = None
    description: str = ""
    importance: ImportanceSampling | None = field(init=False, compare=False, repr=False)
    rejection: tuple[RejectionOption, ...] = field(init=False, compare=False, repr=False)
    legacy: LegacyCorrection | None = field(init=False, compare=False, repr=False)

    @property
    def asymmetric_k1(self) -> RejectionOption | None:
        """The first k1 rejection option with asymmetric bounds (``RejectionOption.k1_asymmetric``), the one
        compare-presets and check say what [L, U] as written would reject of; None when there is none."""
        return next((option for option in self.rejection if option.k1_asymmetric), None)

    @property
    def gated(self) -> bool:
        """Whether a rejection option is a probability gate (GATE_STATISTICS: KPop, binary KL, TV)."""
        return any(option.statistic in GATE_STATISTICS for option in self.rejection)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ConfigError(
                f"preset name '{_shown(self.name)}': use letters, digits, '_', '.' or '-', "
                "starting with a letter or digit."
            )
        # Accept natural Python values (2.0, "a,b", ["a", "b"]) and keep one spelling: strings and tuples.
        normalized = {
            "rollout_is_threshold": _threshold_text(self.rollout_is_threshold, "rollout_is_threshold"),
            "rollout_rs": tuple(split_list(self.rollout_rs)),
            "rollout_rs_threshold": _threshold_text(self.rollout_rs_threshold, "rollout_rs_threshold"),
            **{name: _threshold_text(getattr(self, name), name) for name in _LEGACY_THRESHOLDS},
        }
        for name, value in normalized.items():
            object.__setattr__(self, name, value)
        if self.rollout_is is None and (self.rollout_is_threshold is not None or self.rollout_is_batch_normalize):
            raise ConfigError(
                f"preset '{self.name}': rollout_is_threshold / rollout_is_batch_normalize given without rollout_is.",
                hint="add rollout_is: token or sequence.",
            )
        if not self.rollout_rs and self.rollout_rs_threshold is not None:
            raise ConfigError(
                f"preset '{self.name}': rollout_rs_threshold '{_shown(self.rollout_rs_threshold)}' "
                "given without rollout_rs.",
                hint="add rollout_rs, e.g. seq_mean_k3.",
            )
        legacy_given = (
            self.legacy_is is not None
            or self.legacy_is_mode is not None
            or any(getattr(self, name) is not None for name in _LEGACY_THRESHOLDS)
        )
        if legacy_given and (self.rollout_is is not None or self.rollout_rs):
            raise ConfigError(
                f"preset '{self.name}': legacy_* settings (METRICS.md §8) cannot be combined with rollout_is / "
                "rollout_rs; make two presets."
            )
        importance = None
        if self.rollout_is is not None:
            threshold = DEFAULT_IS_THRESHOLD if self.rollout_is_threshold is None else self.rollout_is_threshold
            importance = parse_importance(self.rollout_is, threshold, self.rollout_is_batch_normalize)
        rejection = parse_rejection(self.rollout_rs, self.rollout_rs_threshold) if self.rollout_rs else ()
        legacy = None
        if legacy_given:
            legacy = parse_legacy(
                self.legacy_is,
                self.legacy_is_mode,
                self.legacy_is_threshold,
                self.legacy_is_mask_threshold,
                self.legacy_is_veto_threshold,
            )
        object.__setattr__(self, "importance", importance)
        object.__setattr__(self, "rejection", rejection)
        object.__setattr__(self, "legacy", legacy)

    def config(self) -> dict[str, Any]:
        """The settings as JSON-able data, in verl's names (legacy keys only for legacy presets)."""
        out: dict[str, Any] = {
            "mode": self.mode,
            "rollout_is": self.rollout_is,
            "rollout_is_threshold": (
                None if self.importance is None else self.rollout_is_threshold or DEFAULT_IS_THRESHOLD
            ),
            "rollout_is_batch_normalize": self.rollout_is_batch_normalize,
            "rollout_rs": ",".join(self.rollout_rs) if self.rollout_rs else None,
            "rollout_rs_threshold": self.rollout_rs_threshold,
        }
        if self.legacy is not None:
            out.update(
                {
                    "legacy_is": self.legacy.level,
                    "legacy_is_mode": self.legacy.mode,
                    "legacy_is_threshold": [self.legacy.lower, self.legacy.upper],
                    "legacy_is_mask_threshold": [self.legacy.mask_lower, self.legacy.mask_upper],
                    "legacy_is_veto_threshold": [self.legacy.veto_lower, self.legacy.veto_upper],
                }
            )
        if self.description:
            out["description"] = self.description
        return out


# ------------------------------------------------------------------------------------------ parsing
def _shown(value: object) -> str:
    """User text as shown in a one-line message: control characters escaped."""
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in str(value))


def _number(value: float) -> str:
    return f"{value:g}"


def _parse_float(text: str, setting: str, spec: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{setting} '{_shown(spec)}': '{_shown(text)}' is not a number.") from None
    if not math.isfinite(value):
        raise ConfigError(f"{setting} '{_shown(spec)}': '{_shown(text)}' is not a finite number.")
    return value


def _spec_text(spec: object, setting: str) -> str:
    """``spec`` (a number or a string, as a config file may give it) as stripped text; raises ConfigError for another
    type or an empty string."""
    if isinstance(spec, bool) or not isinstance(spec, (str, int, float)):
        raise ConfigError(f"{setting} {spec!r}: expected a number or a string such as '0.5_2.0'.")
    text = str(spec).strip()
    if not text:
        raise ConfigError(f"{setting} '': empty threshold.", hint="give a number U or 'L_U', e.g. 2.0 or 0.5_5.0.")
    return text


def _threshold_text(value: str | float | int | Sequence[str | float] | None, setting: str) -> str | None:
    """One spelling for a threshold setting: None, or a stripped string ("0.01,0.5_2.0" for a list)."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return ",".join(split_list(value))
    return _spec_text(value, setting)


def parse_bounds(
    spec: str | float | int, setting: str, *, allow_zero_lower: bool = False
) -> tuple[float | None, float]:
    """Parse "U" or "L_U" into (L or None, U); U > 0, L > 0 (or ≥ 0 when allowed), L ≤ U. Raises ConfigError."""
    text = _spec_text(spec, setting)
    parts = text.split("_")
    if len(parts) > 2:
        raise ConfigError(f"{setting} '{_shown(text)}': expected a number U or 'L_U' (one '_').")
    values = [_parse_float(part.strip(), setting, text) for part in parts]
    upper = values[-1]
    lower = values[0] if len(values) == 2 else None
    if upper <= 0:
        raise ConfigError(f"{setting} '{_shown(text)}': the upper bound must be > 0, got {_number(upper)}.")
    if lower is not None:
        if lower < 0 or (lower == 0 and not allow_zero_lower):
            floor = "≥ 0" if allow_zero_lower else "> 0"
            raise ConfigError(f"{setting} '{_shown(text)}': the lower bound must be {floor}, got {_number(lower)}.")
        if lower > upper:
            raise ConfigError(
                f"{setting} '{_shown(text)}': the lower bound {_number(lower)} exceeds "
                f"the upper bound {_number(upper)}."
            )
    return lower, upper


def parse_importance(level: str, threshold: str | float | int, batch_normalize: bool = False) -> ImportanceSampling:
    """§2: rollout_is level and threshold spec (U → TIS, "L_U" → IcePop). Raises ConfigError."""
    if level not in IS_LEVELS:
        hint = "geometric is the legacy helper's level: use a legacy_* preset." if level == "geometric" else None
        raise ConfigError(f"rollout_is '{_shown(level)}': unknown level; choose token or sequence.", hint=hint)
    lower, upper = parse_bounds(threshold, "rollout_is_threshold")
    if lower is None:  # §2: L' = 1/U for TIS
        return ImportanceSampling(level, upper, 1.0 / upper, icepop=False, batch_normalize=bool(batch_normalize))
    return ImportanceSampling(level, upper, lower, icepop=True, batch_normalize=bool(batch_normalize))


def split_list(value: str | Sequence[str] | None) -> list[str]:
    """A comma-separated string or a list of strings, stripped (empty entries kept, for the error)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [part.strip() for part in value.split(",")]
    return [str(part).strip() for part in value]


def parse_rs_option(option: str) -> tuple[str, str]:
    """Option name -> (scope, statistic). Raises ConfigError for unknown names, seq_max_k1 included."""
    if option == "seq_max_k1":
        raise ConfigError(
            "rollout_rs option 'seq_max_k1' does not exist (the max of k1 = −log ρ is no divergence bound).",
            hint="use seq_max_k2 or seq_max_k3, or seq_mean_k1 for a ratio bound.",
        )
    option = RS_ALIASES.get(option, option)
    if option not in RS_OPTIONS:
        raise ConfigError(
            f"rollout_rs option '{_shown(option)}': unknown; choose from {', '.join([*RS_OPTIONS, *RS_ALIASES])}.",
        )
    scope, _, statistic = option.rpartition("_")
    return scope, statistic


def parse_rejection(
    options: str | Sequence[str], thresholds: str | float | int | Sequence[str | float] | None
) -> tuple[RejectionOption, ...]:
    """§3: options (all must pass) and one shared threshold entry or one per option. Raises ConfigError.

    Repeated options are dropped, keeping the first, as verl does.
    """
    names = split_list(options)
    if not names or any(not name for name in names):
        raise ConfigError(f"rollout_rs '{_shown(','.join(names))}': empty option.", hint="e.g. seq_mean_k3,token_k1.")
    unique: list[str] = []
    for name in names:
        parse_rs_option(name)
        name = RS_ALIASES.get(name, name)
        if name not in unique:
            unique.append(name)
    if thresholds is None:
        raise ConfigError(
            f"rollout_rs '{_shown(','.join(unique))}' needs rollout_rs_threshold.",
            hint="e.g. 0.01 for seq_mean_k3, 0.999_1.001 for seq_mean_k1.",
        )
    entries = split_list(thresholds) if isinstance(thresholds, (str, list, tuple)) else [str(thresholds)]
    spec = ",".join(entries)
    if not spec.strip(","):
        raise ConfigError("rollout_rs_threshold '': empty threshold.", hint="e.g. 0.01 or 0.01,0.5_2.0.")
    if any(not entry for entry in entries):  # verl silently drops empty entries; METRICS.md: a clear error
        raise ConfigError(f"rollout_rs_threshold '{_shown(spec)}': empty entry between commas.")
    if len(entries) == 1:
        entries = entries * len(unique)
    if len(entries) != len(unique):
        raise ConfigError(
            f"rollout_rs_threshold '{_shown(spec)}': {len(entries)} entries for {len(unique)} options "
            f"({', '.join(unique)}); give one shared entry or one per option."
        )
    return tuple(_rejection_option(name, entry) for name, entry in zip(unique, entries, strict=True))


def _rejection_option(option: str, entry: str) -> RejectionOption:
    scope, statistic = parse_rs_option(option)
    setting = f"rollout_rs_threshold for {option}"
    if statistic == "k1":  # verl does not check L ≤ U here (every row would be rejected); we refuse it
        lower, upper = parse_bounds(entry, setting)
        if lower is None:  # §3: a single U means L = 1/U
            lower = 1.0 / upper
        return RejectionOption(option, scope, statistic, math.log(lower), math.log(upper), entry)
    if "_" in entry:
        kinds = "k2/k3" if statistic in RS_STATISTICS else "kpop/bkl/tv"
        raise ConfigError(
            f"{setting} '{_shown(entry)}': {kinds} options take one upper bound, not 'L_U'.",
            hint="write e.g. 0.01.",
        )
    _, upper = parse_bounds(entry, setting)
    return RejectionOption(option, scope, statistic, 0.0, upper, entry)


def k1_bounds_asymmetric(log_lower: float, log_upper: float) -> bool:
    """Whether k1 ratio bounds L, U (as log L, log U) are not reciprocal: verl then applies ρ ∈ [1/U, 1/L], not [L, U]
    (verl #6377). A relative 1e-9 tolerance: 0.8_1.25 is reciprocal (its logs differ in the last bit), 0.999_1.001 not
    (by 1e-6 in ρ)."""
    return abs(log_lower + log_upper) > 1e-9 * max(abs(log_lower), abs(log_upper))


def parse_legacy(
    level: str | None,
    mode: str | None,
    threshold: str | float | int | None,
    mask_threshold: str | float | int | None = None,
    veto_threshold: str | float | int | None = None,
) -> LegacyCorrection:
    """§8 settings. Thresholds are "U" (L = 1/U, verl) or "L_U" (L ≥ 0 allowed, as xtuner's (5, 0));
    the mask threshold defaults to the IS threshold (xtuner); the veto is "L" (ratio < L vetoes the row,
    verl's ``rollout_is_veto_threshold``) or "L_U" (outside [L, U], xtuner). Raises ConfigError."""
    level = level or "token"
    mode = mode or "truncate"
    if level not in LEGACY_LEVELS:
        raise ConfigError(f"legacy_is '{_shown(level)}': unknown level; choose {', '.join(LEGACY_LEVELS)}.")
    if mode not in LEGACY_MODES:
        raise ConfigError(f"legacy_is_mode '{_shown(mode)}': unknown mode; choose {', '.join(LEGACY_MODES)}.")
    if threshold is None:
        raise ConfigError("legacy_is_threshold is required for a legacy preset.", hint="e.g. 2.0 or 0.999_1.001.")
    lower, upper = parse_bounds(threshold, "legacy_is_threshold", allow_zero_lower=True)
    lower = 1.0 / upper if lower is None else lower
    mask_lower, mask_upper = lower, upper
    if mask_threshold is not None:
        parsed_lower, mask_upper = parse_bounds(mask_threshold, "legacy_is_mask_threshold", allow_zero_lower=True)
        mask_lower = 1.0 / mask_upper if parsed_lower is None else parsed_lower
    veto_lower = veto_upper = None
    if veto_threshold is not None:
        text = _spec_text(veto_threshold, "legacy_is_veto_threshold")
        if "_" in text:
            veto_lower, veto_upper = parse_bounds(text, "legacy_is_veto_threshold", allow_zero_lower=True)
        else:  # verl's one-sided veto: a single number is the lower ratio bound
            veto_lower = _parse_float(text, "legacy_is_veto_threshold", text)
            if veto_lower <= 0:
                raise ConfigError(f"legacy_is_veto_threshold '{_shown(text)}': must be > 0, got {_number(veto_lower)}.")
    return LegacyCorrection(level, mode, upper, lower, mask_upper, mask_lower, veto_lower, veto_upper)


# -------------------------------------------------------------------------------------- the table
_DECOUPLED = "decoupled"
_BYPASS_CLIP = "bypass, ppo_clip"
_BYPASS_PG = "bypass, reinforce"
_GEO = "0.999_1.001"  # verl's geometric RS default: |mean log ρ| ≤ 0.001
_ICEPOP = "0.5_5.0"


def _verl(name: str, mode: str, rollout_is: str | None = None, is_threshold: str | None = None,
          rollout_rs: str | None = None, rs_threshold: str | None = None) -> Preset:  # fmt: skip
    return Preset(
        name=name,
        mode=mode,
        rollout_is=rollout_is,
        rollout_is_threshold=is_threshold,
        rollout_rs=(rollout_rs,) if rollout_rs else (),
        rollout_rs_threshold=rs_threshold,
        description=f"verl RolloutCorrectionConfig.{name}() with default arguments",
    )


# METRICS.md §4: the 19 verl presets (RolloutCorrectionConfig classmethods, default arguments), in order.
VERL_PRESETS: tuple[Preset, ...] = (
    _verl("decoupled_token_is", _DECOUPLED, "token", "2.0"),
    _verl("decoupled_seq_is", _DECOUPLED, "sequence", "2.0"),
    _verl("decoupled_token_icepop", _DECOUPLED, "token", _ICEPOP),
    _verl("decoupled_seq_is_rs", _DECOUPLED, "sequence", "2.0", "seq_sum_k1", "0.5_2.0"),
    _verl("decoupled_geo_rs", _DECOUPLED, None, None, "seq_mean_k1", _GEO),
    _verl("decoupled_geo_rs_seq_tis", _DECOUPLED, "sequence", "2.0", "seq_mean_k1", _GEO),
    _verl("decoupled_geo_rs_token_tis", _DECOUPLED, "token", "2.0", "seq_mean_k1", _GEO),
    _verl("decoupled_k3_rs", _DECOUPLED, None, None, "seq_mean_k3", "0.01"),
    _verl("decoupled_k3_rs_seq_tis", _DECOUPLED, "sequence", "2.0", "seq_mean_k3", "0.01"),
    _verl("decoupled_k3_rs_token_tis", _DECOUPLED, "token", "2.0", "seq_mean_k3", "0.01"),
    _verl("bypass_ppo_clip", _BYPASS_CLIP),
    _verl("bypass_ppo_clip_geo_rs", _BYPASS_CLIP, None, None, "seq_mean_k1", _GEO),
    _verl("bypass_ppo_clip_k3_rs", _BYPASS_CLIP, None, None, "seq_mean_k3", "0.01"),
    _verl("bypass_pg_is", _BYPASS_PG, "sequence", "2.0"),
    _verl("bypass_pg_token_icepop", _BYPASS_PG, "token", _ICEPOP),
    _verl("bypass_pg_geo_rs", _BYPASS_PG, None, None, "seq_mean_k1", _GEO),
    _verl("bypass_pg_geo_rs_seq_tis", _BYPASS_PG, "sequence", "2.0", "seq_mean_k1", _GEO),
    _verl("bypass_pg_geo_rs_token_tis", _BYPASS_PG, "token", "2.0", "seq_mean_k1", _GEO),
    _verl("disabled", "metrics only"),
)


def _legacy(name: str, level: str, mode: str, threshold: str, veto: str | None, description: str,
            mask_threshold: str | None = None) -> Preset:  # fmt: skip
    return Preset(
        name=name,
        mode="legacy",
        legacy_is=level,
        legacy_is_mode=mode,
        legacy_is_threshold=threshold,
        legacy_is_mask_threshold=mask_threshold,
        legacy_is_veto_threshold=veto,
        description=description,
    )


# METRICS.md §8: the legacy helper's common settings. Defaults: threshold 2.0 with lower 1/U and the
# per-token veto at ratio < 1e-4 (verl's mismatch_helper config defaults and docs); geometric masking at
# [0.999, 1.001] (verl's recommended geometric setup); legacy_token_both is xtuner's published RL config.
LEGACY_PRESETS: tuple[Preset, ...] = (
    _legacy("legacy_token_truncate", "token", "truncate", "2.0", "1e-4", "token TIS at 2.0, veto ratio < 1e-4"),
    _legacy("legacy_token_mask", "token", "mask", "2.0", "1e-4", "token MIS on [0.5, 2.0], veto ratio < 1e-4"),
    _legacy("legacy_sequence_truncate", "sequence", "truncate", "2.0", "1e-4", "sequence TIS at 2.0, veto < 1e-4"),
    _legacy("legacy_sequence_mask", "sequence", "mask", "2.0", "1e-4", "sequence MIS on [0.5, 2.0], veto < 1e-4"),
    _legacy("legacy_geometric_mask", "geometric", "mask", "0.999_1.001", "1e-4", "geometric MIS on [0.999, 1.001]"),
    _legacy(
        "legacy_token_both",
        "token",
        "both",
        "0_5",
        "0_20",
        "xtuner: token, truncate to [0, 5] and mask outside [0.5, 5], veto outside [0, 20]",
        mask_threshold="0.5_5",
    ),
)


def _gate(name: str, mode: str, option: str, threshold: str, description: str) -> Preset:
    return Preset(name=name, mode=mode, rollout_rs=(option,), rollout_rs_threshold=threshold, description=description)


# The probability gates of 2026's trainers (docs/gates.md), each with its peer's defaults, read in their code:
# - AReaL #1405 at areal-project/AReaL@cbff54d: areal/utils/functional/functional.py apply_rejection_sampling with
#   metric "binary_kl" (compute_binary_kl_divergence: p, q clamped to [1e-8, 1 − 1e-8]; the metric is the larger of
#   the two directions; a token is kept while it is ≤ upper) and examples/math/gsm8k_kpop.yaml (level token, action
#   mask, upper 2.0, also the default docs/en/algorithms/grpo_series.md gives).
# - OpenRLHF #1339 (merged 2026-09; PolicyLoss in openrlhf/models/loss.py as the PR merged it, after the mirrored
#   snapshot 3c3be623): gating "binary_kl" is KL(B(p_rollout)‖B(p_train)) with both clamped to [1e-6, 1 − 1e-6]; level
#   "seq" takes the masked mean; "--is_correction_threshold 5e-3" is FlashREINFORCE's single delta (its quick start);
#   a unit is kept while 0 ≤ stat ≤ delta, so #1354's clamp at 0 (roundoff below 0 rejected valid rows) is ours too.
# - prime-rl ipo at PrimeIntellect-ai/prime-rl@559b447: src/prime_rl/trainer/rl/loss.py ipo_loss_fn masks a token
#   when |exp(trainer) − exp(inference)| > ipo_threshold, default 0.1 (IPOLossConfig in
#   packages/prime-rl-configs/src/prime_rl/configs/trainer.py); no clamp of the probabilities.
GATE_PRESETS: tuple[Preset, ...] = (
    _gate(
        "areal_kpop",
        "decoupled, mask",
        "token_kpop",
        "2.0",
        "AReaL KPop (#1405, areal-project/AReaL@cbff54d): mask a token when the larger binary KL of "
        "B(p_train), B(p_rollout) (both ways, p clamped to [1e-8, 1 − 1e-8]) exceeds 2.0",
    ),
    _gate(
        "openrlhf_seq_binary_kl",
        "seq, mask",
        "seq_mean_bkl",
        "5e-3",
        "OpenRLHF #1339 FlashREINFORCE: mask a sequence whose mean binary KL(B(p_rollout)‖B(p_train)) "
        "(p clamped to [1e-6, 1 − 1e-6], float64, ≥ 0 as #1354) exceeds 5e-3",
    ),
    _gate(
        "prime_rl_ipo",
        "ipo loss",
        "token_tv",
        "0.1",
        "prime-rl ipo loss (PrimeIntellect-ai/prime-rl@559b447): mask a token when |p_train − p_rollout| > 0.1",
    ),
)

PRESETS: dict[str, Preset] = {preset.name: preset for preset in (*VERL_PRESETS, *LEGACY_PRESETS, *GATE_PRESETS)}
PRESET_GROUPS: dict[str, tuple[str, ...]] = {
    "all": tuple(PRESETS),
    "verl": tuple(preset.name for preset in VERL_PRESETS),
    "legacy": tuple(preset.name for preset in LEGACY_PRESETS),
    "gates": tuple(preset.name for preset in GATE_PRESETS),
}


def get_presets(names: Iterable[str] | None = None, extra: Mapping[str, Preset] | None = None) -> list[Preset]:
    """Presets by name, in the order given (duplicates dropped); None -> the default set: every built-in preset but
    the probability gates (``gates``; they cost compare-presets about 25 % more CPU: docs/gates.md), and ``extra``.

    Names may be a group (``all``, ``verl``: the 19 of §4, ``legacy``: §8, ``gates``) or a preset of ``extra``
    (e.g. from :func:`load_presets_file`). Raises ConfigError for an unknown name, listing the known ones.
    """
    known = {**PRESETS, **(extra or {})}
    if names is None:
        return [preset for name, preset in known.items() if name not in PRESET_GROUPS["gates"]]
    chosen: dict[str, Preset] = {}
    for name in names:
        if name in PRESET_GROUPS:
            for member in PRESET_GROUPS[name]:
                chosen.setdefault(member, PRESETS[member])
        elif name in known:
            chosen.setdefault(name, known[name])
        else:
            raise ConfigError(
                f"{option_name('presets')}={name}: unknown preset. Known: {', '.join([*PRESET_GROUPS, *known])}.",
            )
    return list(chosen.values())


def preset_from_options(
    name: str = "custom",
    *,
    rollout_is: str | None = None,
    rollout_is_threshold: str | float | None = None,
    rollout_rs: str | Sequence[str] | None = None,
    rollout_rs_threshold: str | float | Sequence[str] | None = None,
    batch_normalize: bool = False,
    mode: str = "custom",
) -> Preset:
    """A custom preset from CLI-style strings (``--rollout-rs seq_mean_k3,token_k1``). Raises ConfigError."""
    return Preset(
        name=name,
        mode=mode,
        rollout_is=rollout_is,
        rollout_is_threshold=_threshold_text(rollout_is_threshold, "rollout_is_threshold"),
        rollout_is_batch_normalize=batch_normalize,
        rollout_rs=tuple(split_list(rollout_rs)),
        rollout_rs_threshold=_threshold_text(rollout_rs_threshold, "rollout_rs_threshold"),
    )


_FILE_KEYS = {
    "mode",
    "description",
    "rollout_is",
    "rollout_is_threshold",
    "rollout_is_batch_normalize",
    "rollout_rs",
    "rollout_rs_threshold",
    "legacy_is",
    "legacy_is_mode",
    "legacy_is_threshold",
    "legacy_is_mask_threshold",
    "legacy_is_veto_threshold",
}
# OpenRLHF's grammar since #1339 (--algo.advantage.is_correction_*): level × mode × gating and [LOW] HIGH.
OPENRLHF_KEYS = ("is_correction_level", "is_correction_mode", "is_correction_gating", "is_correction_threshold")
_OPENRLHF_DEFAULTS = {
    "is_correction_mode": "mask",
    "is_correction_gating": "ratio",
    "is_correction_threshold": (0.5, 5.0),
}


def openrlhf_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """verl-style settings of a preset written in OpenRLHF's grammar (``is_correction_level`` off / token / seq,
    ``_mode`` mask / clip, ``_gating`` ratio / binary_kl / tv, ``_threshold`` [LOW] HIGH; OpenRLHF's defaults mask,
    ratio, [0.5, 5.0]). Raises ConfigError for a value OpenRLHF refuses or one verl's settings cannot say.

    ratio, token, mask → IcePop on [LOW, HIGH]; ratio, token, clip with LOW 0 → TIS at HIGH; ratio, seq, mask → the
    geometric mean of ρ inside [LOW, HIGH], which is verl's seq_mean_k1 with bounds 1/HIGH_1/LOW (verl's k1 is −log ρ);
    binary_kl / tv → the rejection options ``{token|seq_mean}_bkl`` / ``_tv`` at HIGH (LOW must be 0)."""
    values = {**_OPENRLHF_DEFAULTS, **{key: settings[key] for key in OPENRLHF_KEYS if key in settings}}
    level, mode, gating = _openrlhf_choices(*(str(values[key]) for key in OPENRLHF_KEYS[:3]))
    low, high = _openrlhf_threshold(values["is_correction_threshold"], gating)
    if level == "off":
        return {}
    if mode == "clip" and (level == "seq" or gating != "ratio"):
        raise ConfigError(
            "is_correction_mode clip needs is_correction_level token and is_correction_gating ratio, as in OpenRLHF."
        )
    if gating != "ratio":
        return _openrlhf_gate(level, gating, low, high)
    if mode == "clip":
        if low != 0.0:
            raise ConfigError(
                f"is_correction_threshold LOW {_number(low)}: a clip to [LOW, HIGH] with LOW > 0 has no verl "
                "equivalent (verl's TIS truncates above only).",
                hint="give one number HIGH (LOW 0): TIS at HIGH.",
            )
        return {"rollout_is": "token", "rollout_is_threshold": repr(high)}
    if low <= 0.0:
        raise ConfigError(
            f"is_correction_threshold LOW {_number(low)}: is_correction_gating ratio with mode mask needs LOW > 0.",
            hint="e.g. [0.5, 5.0], OpenRLHF's default.",
        )
    if level == "token":
        return {"rollout_is": "token", "rollout_is_threshold": f"{low!r}_{high!r}"}
    return {"rollout_rs": "seq_mean_k1", "rollout_rs_threshold": f"{1.0 / high!r}_{1.0 / low!r}"}


def _openrlhf_choices(level: str, mode: str, gating: str) -> tuple[str, str, str]:
    """OpenRLHF's level, mode and gating, each checked against the values OpenRLHF takes; raises ConfigError."""
    if level not in ("off", "token", "seq"):
        raise ConfigError(f"is_correction_level '{_shown(level)}': choose off, token or seq (OpenRLHF's levels).")
    if mode not in ("mask", "clip"):
        raise ConfigError(f"is_correction_mode '{_shown(mode)}': choose mask or clip (OpenRLHF's modes).")
    if gating not in ("ratio", "binary_kl", "tv"):
        raise ConfigError(
            f"is_correction_gating '{_shown(gating)}': choose ratio, binary_kl or tv (OpenRLHF's gatings)."
        )
    return level, mode, gating


def _openrlhf_gate(level: str, gating: str, low: float, high: float) -> dict[str, str]:
    """binary_kl / tv gating: the rejection option ``{token|seq_mean}_bkl`` / ``_tv`` at HIGH (LOW must be 0)."""
    if low != 0.0:
        raise ConfigError(
            f"is_correction_threshold: is_correction_gating {gating} takes an upper bound only (LOW 0), "
            f"got LOW {_number(low)}, as OpenRLHF refuses it."
        )
    statistic = "bkl" if gating == "binary_kl" else "tv"
    scope = "token" if level == "token" else "seq_mean"
    return {"rollout_rs": f"{scope}_{statistic}", "rollout_rs_threshold": repr(high)}


def _openrlhf_threshold(value: Any, gating: str) -> tuple[float, float]:
    """OpenRLHF's ``[LOW] HIGH``: a number (HIGH, LOW 0), a list of one or two numbers, or "LOW HIGH"."""
    items = value.split() if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else [value]
    if not 1 <= len(items) <= 2:
        raise ConfigError(f"is_correction_threshold {value!r}: expected [LOW] HIGH (one or two numbers).")
    numbers = [_parse_float(str(item), "is_correction_threshold", str(value)) for item in items]
    low, high = (0.0, numbers[0]) if len(numbers) == 1 else (numbers[0], numbers[1])
    if high <= 0 or low < 0 or low > high:
        raise ConfigError(
            f"is_correction_threshold {value!r}: need 0 ≤ LOW ≤ HIGH and HIGH > 0, got LOW {_number(low)}, "
            f"HIGH {_number(high)}."
        )
    return low, high


def load_presets_file(path: str | Path) -> dict[str, Preset]:
    """Named presets from a YAML or JSON file: ``{name: {rollout_is: ..., ...}}``, optionally under a
    top-level ``presets:`` key. Keys are verl's config names (plus ``mode``, ``description``, ``legacy_*``).

    Raises ConfigError for an unreadable file, a bad key or value, or a name that a built-in preset has.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{option_name('presets_file')}={path}: cannot read ({exc.strerror or exc}).") from None
    data = _parse_presets_text(path, text)
    if isinstance(data, Mapping) and set(data) == {"presets"}:
        data = data["presets"]
    if not isinstance(data, Mapping) or not data:
        raise ConfigError(f"{option_name('presets_file')}={path}: expected a mapping of preset names to settings.")
    presets: dict[str, Preset] = {}
    for name, settings in data.items():
        presets[str(name)] = _preset_from_mapping(path, str(name), settings)
    return presets


def _parse_presets_text(path: Path, text: str) -> Any:
    """The document of a presets file: JSON by its suffix, else YAML (through pyyaml). Raises ConfigError."""
    where = f"{option_name('presets_file')}={path}"
    if path.suffix.lower() == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}: not valid JSON (line {exc.lineno}: {exc.msg}).") from None
    try:
        import yaml
    except ImportError:
        raise ConfigError(
            f"{where}: reading YAML needs pyyaml.",
            hint="pip install pyyaml (or rollout-diag[yaml]), or write the file as JSON.",
        ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML ({' '.join(str(exc).split())}).") from None


def _preset_from_mapping(path: Path, name: str, settings: object) -> Preset:
    where = f"{option_name('presets_file')}={path}: preset '{_shown(name)}'"
    if name in PRESETS or name in PRESET_GROUPS:
        raise ConfigError(f"{where}: the name is a built-in preset; pick another name.")
    if not isinstance(settings, Mapping):
        raise ConfigError(f"{where}: expected a mapping of settings, got {type(settings).__name__}.")
    known = _FILE_KEYS | set(OPENRLHF_KEYS)
    unknown = sorted(set(map(str, settings)) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}.")
    values = {str(key): value for key, value in settings.items()}
    if any(key in values for key in OPENRLHF_KEYS):
        values = _from_openrlhf(where, values)
    batch_normalize = values.pop("rollout_is_batch_normalize", False)
    if not isinstance(batch_normalize, bool):
        raise ConfigError(f"{where}: rollout_is_batch_normalize must be true or false, got {batch_normalize!r}.")
    for key in ("mode", "description", "rollout_is", "legacy_is", "legacy_is_mode"):
        if values.get(key) is not None:
            values[key] = str(values[key])
    try:
        return Preset(name=name, rollout_is_batch_normalize=batch_normalize, **values)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc.message}", hint=exc.hint) from None


def _from_openrlhf(where: str, values: dict[str, Any]) -> dict[str, Any]:
    """A presets file's settings in OpenRLHF's grammar as verl's (``openrlhf_settings``, mode ``openrlhf`` unless
    given); raises ConfigError, naming the preset, for a mix of the two grammars or a value OpenRLHF refuses."""
    openrlhf = [key for key in OPENRLHF_KEYS if key in values]
    verl_keys = sorted(set(values) & (_FILE_KEYS - {"mode", "description"}))
    if verl_keys:
        raise ConfigError(
            f"{where}: OpenRLHF's {', '.join(openrlhf)} cannot be combined with {', '.join(verl_keys)}; "
            "write the preset in one grammar."
        )
    try:
        translated = openrlhf_settings(values)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc.message}", hint=exc.hint) from None
    values = {key: value for key, value in values.items() if key not in OPENRLHF_KEYS}
    values.update(translated)
    values.setdefault("mode", "openrlhf")
    return values


def resolve_presets(presets: Sequence[str | Preset] | None) -> list[Preset]:
    """None -> every built-in preset; names (and groups) are looked up; Preset objects pass as they are.
    Raises ConfigError for an unknown name or two presets with one name."""
    if presets is None:
        return get_presets(None)
    chosen: list[Preset] = []
    for item in presets:
        chosen.extend([item] if isinstance(item, Preset) else get_presets([item]))
    unique: dict[str, Preset] = {}
    for preset in chosen:
        if preset.name in unique and unique[preset.name] != preset:
            raise ConfigError(f"preset '{preset.name}' is given twice with different settings; rename one.")
        unique[preset.name] = preset
    if not unique:
        raise ConfigError("no preset chosen.", hint=f"leave out {option_name('presets')} to compare all presets.")
    return list(unique.values())


def choose_presets(
    names: Sequence[str] | None = None,
    presets_file: str | Path | None = None,
    rollout_is: str | None = None,
    rollout_is_threshold: str | None = None,
    rollout_rs: str | None = None,
    rollout_rs_threshold: str | None = None,
    batch_normalize: bool = False,
) -> list[str | Preset] | None:
    """The presets a comparison runs: preset (or group) ``names``, the presets of a ``presets_file``, and one custom
    preset from verl-style options, each beside the built-in presets unless ``names`` picks some; None = every
    built-in preset. Raises ConfigError for an unknown name, an unreadable file or a bad option."""
    chosen: list[str | Preset] = list(names or [])
    if presets_file is not None:
        chosen.extend(load_presets_file(presets_file).values())
    custom = rollout_is or rollout_rs
    if custom:
        chosen.append(
            preset_from_options(
                rollout_is=rollout_is,
                rollout_is_threshold=rollout_is_threshold,
                rollout_rs=rollout_rs,
                rollout_rs_threshold=rollout_rs_threshold,
                batch_normalize=batch_normalize,
            )
        )
    if chosen and not names and (presets_file is not None or custom):
        chosen = [*get_presets(None), *chosen]  # your presets beside the built-in ones
    return chosen or None
