"""The token-quantity table: the names of the per-token quantities the engines compute (δ = a − r over model
tokens), stated once. ``QUANTITIES`` lists, in its output order, the quantities whose segment sums the numba engine's
fused pass computes (``kernels/cpu.py``), ``EXTREMES`` those whose segment maxima and minima it computes, and
``PRESET_BASES`` the quantities a derived one (``engine/formulas.py`` ``Derived``: truncated and IcePop weights,
clamped statistics, bound flags) is made from, by code, in the presets' compiled pass (``kernels/presets.py``). Each
name's float64 formula, as the torch engine computes it, is in ``engine/formulas.py`` ``TOKEN_QUANTITIES`` (the hint
quantities' in ``metrics/hints.py``). Plain data: the kernels read it before anything else loads."""

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
    "trainer_prob",
    "rollout_prob",
    "prob_diff",
    "hint_clipped_abs",
    "hint_clipped_square",
    "hint_cross",
    "hint_rollout_square",
    "skyrl_k3",
)
# The quantities whose segment maxima and minima the fused pass computes (what the families read), in output order.
EXTREMES = ("abs_log_ratio", "clamped_log_ratio", "rs_k2", "prob_diff")
# The token quantities a derived one is made from (``Derived.base``), in the order of their codes.
PRESET_BASES = ("log_ratio", "clamped_log_ratio", "token_is_weight", "rs_k1", "rs_k2", "rs_k3")
SHARED_QUANTITIES = ("log_ratio", "abs_log_ratio")  # what every family reads
