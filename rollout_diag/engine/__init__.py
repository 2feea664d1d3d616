"""How a chunk's numbers are computed fast, stating no metric: the array arithmetic (numpy or torch alike), the
token-quantity table, the per-chunk engines (``ChunkStats``, ``KernelStats``) and the per-step state storage with its
merge rules (``store.py``). ``kernels/`` holds the compiled passes the engine runs; ``rollout_diag.metrics`` states
what is measured from what the engine gives."""
