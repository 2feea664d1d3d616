"""``python -m rollout_diag.cli``: the console script."""

from rollout_diag.cli import main

if __name__ == "__main__":
    main()
