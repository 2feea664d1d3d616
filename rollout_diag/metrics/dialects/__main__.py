"""``python -m rollout_diag.metrics.dialects > docs/dialects.md``"""

from rollout_diag.metrics.dialects import markdown

print(markdown(), end="")
