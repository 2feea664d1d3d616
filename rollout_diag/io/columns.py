"""Which column plays which role: built-in names of the common trainers, plus user overrides."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rollout_diag.errors import ColumnError, ConfigError, option_name, where

if TYPE_CHECKING:
    import pyarrow as pa

# Role -> the names trainers use for it, verl's first. Detection takes the one present; two present is
# ambiguous and an error (the user picks with --column role=name).
ROLE_CANDIDATES: dict[str, tuple[str, ...]] = {
    # inference engine's logprob: verl, SkyRL, prime-rl, NeMo-RL, open-instruct
    "rollout": (
        "rollout_log_probs",
        "rollout_logprobs",
        "inference_logprobs",
        "generation_logprobs",
        "vllm_logprobs",
    ),
    # trainer's recomputed logprob: verl, SkyRL, prime-rl, NeMo-RL
    "trainer": ("old_log_probs", "action_log_probs", "trainer_logprobs", "prev_logprobs"),
    "mask": ("response_mask", "loss_mask", "token_loss_mask"),
    "step": ("step", "global_step"),
    "sample_id": ("sample_id", "uid"),
    "position": ("position",),
    "token_ids": ("token_ids",),
    "tokens": ("tokens",),
    "policy_version": ("policy_version",),  # version of the policy that generated the row (async RL)
    # the prompt a row answers (io/prompts.py): rows of one GRPO group share it; uid last (verl's is per prompt)
    "prompt_id": ("prompt_id", "prompt_hash", "prompt_uid", "group_id", "uid"),
    # per-token columns the hints read (docs/hints.md): the engine's own token ids where the trainer re-tokenized
    # (token_ids then holds the trainer's), and the probability mass top-p / top-k kept for each sampled token
    "rollout_token_ids": ("rollout_token_ids", "rollout_ids"),
    "kept_mass": ("kept_mass", "sampling_kept_mass"),
}
# Roles whose built-in names are tried in order (the first present wins) instead of two present being an error:
# optional roles that only the prompt checks read, so that a dump read before they existed still reads.
FIRST_FOUND_ROLES = frozenset({"prompt_id"})
# The per-token columns carried as ``Chunk.token_columns`` (and ``decode.Block.token_columns``) by role.
TOKEN_SIDE_ROLES = ("rollout_token_ids", "kept_mass")
REQUIRED_ROLES = ("rollout", "trainer")
ROLES = tuple(ROLE_CANDIDATES)


@dataclass(frozen=True)
class ColumnMap:
    """Role -> column name for one file; roles absent from the file are absent from ``names``."""

    names: Mapping[str, str]
    # Roles filled from hive partition directories (e.g. step=12/part-0.parquet) rather than a column.
    from_partition: frozenset[str] = frozenset()

    def get(self, role: str) -> str | None:
        return self.names.get(role)

    def __contains__(self, role: str) -> bool:
        return role in self.names


def parse_overrides(specs: Iterable[str]) -> dict[str, str]:
    """Parse ``role=name`` strings (the CLI's ``--column``) into a mapping; raises ConfigError for a malformed spec,
    an unknown role, or a role given two different columns (the same one twice is fine)."""
    overrides: dict[str, str] = {}
    for spec in specs:
        role, sep, name = spec.partition("=")
        role, name = role.strip(), name.strip()
        if not sep or not role or not name:
            raise ConfigError(f"{option_name('columns')}='{spec}': expected role=name, e.g. rollout=vllm_logprobs.")
        if role not in ROLE_CANDIDATES:
            raise ConfigError(f"{option_name('columns')}='{spec}': unknown role '{role}'. Roles: {', '.join(ROLES)}.")
        if overrides.get(role, name) != name:  # the last one winning would silently ignore the first
            raise ConfigError(
                f"{option_name('columns')} {role}={overrides[role]} and {role}={name}: one column per role; "
                "give it once."
            )
        overrides[role] = name
    return overrides


def resolve_columns(
    file: str,
    available: Iterable[str],
    overrides: Mapping[str, str] | None = None,
    partition_keys: Iterable[str] = (),
) -> ColumnMap:
    """Map roles to the columns of one file.

    Raises ColumnError when a required role has no column, an override names a missing column, or two
    built-in candidates for one role are both present.
    """
    overrides = dict(overrides or {})
    present = set(available)
    partition = set(partition_keys)
    names: dict[str, str] = {}
    from_partition: set[str] = set()
    for role, candidates in ROLE_CANDIDATES.items():
        column: tuple[str, bool] | None
        if role in overrides:
            column = _overridden(file, role, overrides[role], present, partition)
        else:
            column = _found(file, role, candidates, present, partition)
        if column is not None:
            names[role] = column[0]
            if column[1]:
                from_partition.add(role)
    for role in REQUIRED_ROLES:
        if role not in names:
            raise ColumnError(
                f"{file}: no {role} logprob column (looked for {', '.join(ROLE_CANDIDATES[role])}).",
                hint=f"name it with {option_name('columns')} {role}=<name>; columns in the file: "
                f"{', '.join(sorted(present))}.",
            )
    if names["rollout"] == names["trainer"]:
        raise ColumnError(f"{file}: column '{names['rollout']}' cannot be both the rollout and trainer column.")
    return ColumnMap(names=names, from_partition=frozenset(from_partition))


def _overridden(file: str, role: str, name: str, present: set[str], partition: set[str]) -> tuple[str, bool]:
    """The column ``--columns`` names for ``role`` and whether it is a partition key; raises ColumnError if neither
    the file nor its partition has it."""
    if name not in present and name not in partition:
        raise ColumnError(
            f"{where(file, column=name)}no such column (asked for by {option_name('columns')} {role}={name}).",
            hint=f"columns in the file: {', '.join(sorted(present))}.",
        )
    return name, name not in present


def _found(
    file: str, role: str, candidates: tuple[str, ...], present: set[str], partition: set[str]
) -> tuple[str, bool] | None:
    """The one built-in candidate for ``role`` in the file, else the first in the partition (and whether it is
    there), else None; raises ColumnError when two candidates are both in the file."""
    found = [name for name in candidates if name in present]
    if len(found) > 1 and role in FIRST_FOUND_ROLES:
        return found[0], False
    if len(found) > 1:
        raise ColumnError(
            f"{file}: columns '{found[0]}' and '{found[1]}' both look like the {role} column.",
            hint=f"choose one with {option_name('columns')} {role}={found[0]}.",
        )
    if found:
        return found[0], False
    in_partition = [name for name in candidates if name in partition]
    return (in_partition[0], True) if in_partition else None


def parquet_options(schema: pa.Schema, compression: str) -> dict[str, Any]:
    """How the dump's columns are encoded. Logprobs are floats that rarely repeat: a dictionary only costs there
    (Parquet tries one for every column until its page passes 1 MB), so float columns go without one, and with zstd
    their bytes are split by stream (byte_stream_split: zstd then packs them ~8 % tighter). 200 rank files of ~46K
    tokens: writing 135 -> 46 ns per token, 10.3 -> 6.4 bytes per token, reading 35 -> 31 ns; the bundled real dump
    16.6 -> 11.1 bytes per token (docs/benchmarks.md, issue 20 session 14). Every other column (step, ids, mask,
    token ids) keeps Parquet's dictionary.
    What ``DumpWriter`` and ``convert`` write."""
    import pyarrow as pa  # the caller has it loaded: this module loads no pyarrow

    floats: list[str] = []
    others: list[str] = []
    for field in schema:
        nested = pa.types.is_list(field.type) or pa.types.is_large_list(field.type)
        leaf = field.type.value_type if nested else field.type
        path = f"{field.name}.list.element" if nested else field.name  # a list's leaf column, as Parquet names it
        (floats if pa.types.is_float32(leaf) or pa.types.is_float64(leaf) else others).append(path)
    return {
        "compression": compression,
        "use_dictionary": others,
        "use_byte_stream_split": floats if compression == "zstd" else False,
    }
