"""The drivers: chunks → accumulators → merge → results → decisions, one module per command entry.

``dump`` (the :class:`~rollout_diag.drivers.dump.Dump` every entry reads), ``passes`` (one pass over the data:
the analysis families and the chunk loop) and ``distributed`` (the same pass on processes or Ray) are shared;
each command the CLI runs calls one function of one module here. Nothing here imports rich, typer or plotly.
"""
