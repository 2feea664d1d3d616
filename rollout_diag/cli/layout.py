"""Where each command shows its options: ``@command("inputs column device format output …")`` lays out its
--help (and so its docs/commands.md section) in one line, naming its own options (its signature's) and the shared
ones (a group's field, or a group's argument for all of its fields in their order) in the order shown; ``--debug``
comes last in every command. A group is an argument annotated with a frozen dataclass whose fields are options
(``rollout_diag.cli.options``' groups, ``output.TableOrJson``, a command's own); an option of it a command does not
show keeps the group's default. The command is handed each group built from the values, inside the one error
boundary. By convention a command's signature is keyword-only, in the layout's order, each group where its first
option stands."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from typing import Any, TypeVar, cast

import typer

from rollout_diag.cli.boundary import errors_as_one_line
from rollout_diag.cli.options import OPTION_GROUPS, DebugOpt

F = TypeVar("F", bound=Callable[..., Any])
PLACEHOLDER = inspect.Parameter.KEYWORD_ONLY  # typer passes every option by name: any order of defaults is valid


def is_group(annotation: Any) -> bool:
    """Whether a parameter's annotation is an option group: a dataclass whose fields are options."""
    return isinstance(annotation, type) and dataclasses.is_dataclass(annotation)


@functools.cache
def group_fields(group: type) -> dict[str, tuple[Any, Any]]:
    """A group's options: name -> (its Annotated declaration, its default)."""
    hints = typing.get_type_hints(group, include_extras=True)
    return {field.name: (hints[field.name], field.default) for field in dataclasses.fields(group)}


def _shown(name: str, groups: dict[str, type], own: dict[str, inspect.Parameter], defaults: dict[str, Any]) -> list:
    """The parameters one name of a layout stands for: an own option, a whole group, or one option of a group."""
    if name in own:
        return [own.pop(name)]
    taken = list(groups.values())
    fields = [(groups[name], field) for field in group_fields(groups[name])] if name in groups else []
    fields = fields or [(group, name) for group in taken if name in group_fields(group)]
    if not fields:
        elsewhere = [group.__name__ for group in OPTION_GROUPS if name in group_fields(group)]
        if elsewhere:
            raise TypeError(f"{name} is shown but no argument takes {elsewhere[0]}")
        raise TypeError(f"{name} is neither an option of the command nor of a group")
    parameters = []
    for group, field in fields:
        declared, default = group_fields(group)[field]
        default = defaults.pop(field, default)
        parameters.append(inspect.Parameter(field, PLACEHOLDER, annotation=declared, default=default))
    return parameters


def command(order: str, **defaults: Any) -> Callable[[F], F]:
    """Lay out a command's options in ``order`` (names, space separated; ``--debug`` added last), with ``defaults``:
    this command's own default of a group's option (compare-presets' larger chunks). Raises TypeError where the
    layout leaves out one of the command's own options or names an unknown one (a programming error)."""

    def decorate(function: F) -> F:
        signature = inspect.signature(function, eval_str=True)
        groups = {p.name: p.annotation for p in signature.parameters.values() if is_group(p.annotation)}
        own = {name: p for name, p in signature.parameters.items() if name not in groups}
        context = [own.pop(name) for name, p in list(own.items()) if p.annotation is typer.Context]
        parameters = [p.replace(kind=PLACEHOLDER) for p in context]
        overrides = dict(defaults)
        for name in order.split():
            parameters += [p.replace(kind=PLACEHOLDER) for p in _shown(name, groups, own, overrides)]
        if own or overrides:
            raise TypeError(f"{function.__name__}: not laid out: {', '.join([*own, *overrides])}")
        parameters.append(inspect.Parameter("debug", PLACEHOLDER, annotation=DebugOpt, default=False))
        placed = {p.name for p in parameters} - set(signature.parameters)

        @functools.wraps(function)
        def wrapper(**kwargs: Any) -> Any:
            given = {name: kwargs.pop(name) for name in placed}
            with errors_as_one_line(given["debug"]):
                for argument, group in groups.items():
                    names = {field.name for field in dataclasses.fields(group)}
                    kwargs[argument] = group(**{name: value for name, value in given.items() if name in names})
                return function(**kwargs)

        # what typer reads: the options in their places (inspect.signature honours __signature__, which mypy does not
        # know as an attribute of a function)
        wrapper.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": signature.return_annotation}
        return cast(F, wrapper)

    return decorate
