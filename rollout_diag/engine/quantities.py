"""The token-quantity table: the names of the per-token quantities the engines compute (δ = a − r over model tokens),
stated once. ``QUANTITIES`` lists, in its output order, the quantities whose segment sums the numba engine's fused pass
computes (``kernels/cpu.py``), ``EXTREMES`` those whose segment maxima and minima it computes, and ``PRESET_BASES`` the
quantities a derived one (``engine/formulas.py`` ``Derived``: truncated and IcePop weights, clamped statistics, bound
flags) is made from, by code, in the presets' compiled pass (``kernels/presets.py``). Each name's float64 formula, as
the torch engine computes it, is in ``engine/formulas.py`` ``TOKEN_QUANTITIES`` (the hint quantities' in
``metrics/hints.py``). Plain data (and the constants of the fused pass's histogram, moments and hint patterns): the
kernels read it before anything else loads."""

import math

# The probabilities and the hint quantities made from them (what the analysis reads beside the log-ratio ones).
PROBABILITY_QUANTITIES = (
    "trainer_prob",
    "rollout_prob",
    "prob_diff",
    "hint_clipped_abs",
    "hint_clipped_square",
    "hint_cross",
    "hint_rollout_square",
)
# The quantities whose segment sums the numba engine's fused pass computes, in the order of its output rows.
QUANTITIES = (
    "trainer",
    "rollout",
    "log_ratio",
    "abs_log_ratio",
    "k3",
    "chi2_term",
    "square",
    "clamped_log_ratio",
    "rs_k2",
    *PROBABILITY_QUANTITIES,
    "skyrl_k3",
)
# The quantities whose segment maxima and minima the fused pass computes (what the families read), in output order.
EXTREMES = ("abs_log_ratio", "clamped_log_ratio", "rs_k2", "prob_diff")
# The token quantities a derived one is made from (``Derived.base``), in the order of their codes.
PRESET_BASES = (
    "log_ratio",
    "clamped_log_ratio",
    "token_is_weight",
    "rs_k1",
    "rs_k2",
    "rs_k3",
    "rs_kpop",
    "rs_bkl",
    "rs_tv",
)
GATE_BASES = ("rs_kpop", "rs_bkl", "rs_tv")  # the probability gates, in kernels.presets' gates rows
GATE_HISTOGRAM = "sweep_gate_histograms"  # ChunkStats.memo key of the sweep's gate histograms (metrics.sweep)
# The probability gates' clamps of p = exp(logprob) (presets.GATE_STATISTICS): AReaL's KPop, OpenRLHF's binary_kl.
KPOP_EPS, BKL_EPS = 1e-8, 1e-6
SHARED_QUANTITIES = ("log_ratio", "abs_log_ratio")  # what every family reads
# Exact token counts the fused pass takes per segment (their segment sums, as float64 counts, in output order): tokens
# whose two logprobs differ in any bit (compared as float32 where either column was float32: ``Chunk.float32``),
# tokens with |δ| above each of EXTREME_BOUNDS, and tokens with |δ| at most each of BANDS.
EXTREME_BOUNDS = (math.log(2.0), math.log(5.0))
BANDS = (1e-3, 1e-2, 1e-1)
COUNTS = ("mismatched", "above_ln2", "above_ln5", "within_1e-3", "within_1e-2", "within_1e-1")
# The δ histogram's bins (metrics.localize.delta_bin, the fused pass): binary exponents of |δ|, EXPONENT_MIN to
# EXPONENT_MAX.
EXPONENT_MIN, EXPONENT_MAX = -20, 7
# Centred moments the fused pass computes (debug §5): any other pair is centred by a second pass.
MOMENT_PAIRS = (("prob_diff", "prob_diff"), ("trainer_prob", "rollout_prob"))
# The kernel quantities that take the fused pass two exps a token, read by the debug family only (§5): a pass without
# it runs the pass without them (``kernels.cpu.segment_pass(..., probabilities=False)``).
PROBABILITIES = ("trainer_prob", "rollout_prob", "prob_diff")
# The hint evidence's token patterns (metrics.hints): group means use min(|δ|, CLIP) (ρ outside [1/e, e] counts as 1),
# a logprob of exactly 0 where the other side says p < 0.5 is no rounding error, a copy counts where the other side
# moves by more than log 2; rollout-probability buckets: p ≥ 0.9, 0.5–0.9, 0.1–0.5, 0.01–0.1, < 0.01.
CLIP = 1.0
LOG_HALF = math.log(0.5)
COPY_GAP = math.log(2.0)
PROBABILITY_EDGES = (0.9, 0.5, 0.1, 0.01)
# Retokenization at turn boundaries (metrics.hints): the first TURN_OFFSETS model tokens of each round, by offset.
TURN_OFFSETS = 8
