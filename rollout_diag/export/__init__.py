"""Results handed to the tools users already use: polars / pandas dataframes, Parquet tables, TensorBoard event files.

Readers only: every function here reads a result object and writes or returns a table; nothing is computed anew.
"""
