"""How listing commands print, as ``kubectl get`` does: a table that fits the terminal
(cells wrap, never cut), ``-o wide`` for more columns, ``-o json|yaml`` for the full
objects as the gateway returned them."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console, JustifyMethod
from rich.measure import Measurement
from rich.table import Column, Table


class Output(StrEnum):
    JSON = "json"
    YAML = "yaml"
    WIDE = "wide"


OutputOpt = Annotated[Output | None, typer.Option(
    "--output", "-o", help="json or yaml: the full objects; wide: more columns; "
    "default: a table that fits the terminal")]


@dataclass(frozen=True)
class Col:
    """One column of a listing: its header, its cell from an item, and whether it shows
    only with ``-o wide``. ``whole`` columns (ids, names) never wrap: they are copied."""

    header: str
    cell: Callable[[dict[str, Any]], str]
    wide: bool = False
    whole: bool = False
    justify: JustifyMethod = "left"


def field(key: str, default: str = "-") -> Callable[[dict[str, Any]], str]:
    """A cell that is one field of the item as text ("-" when empty)."""
    def cell(item: dict[str, Any]) -> str:
        value = item.get(key)
        return default if value is None or value == "" else str(value)
    return cell


def timestamp(key: str, default: str = "-") -> Callable[[dict[str, Any]], str]:
    """An ISO time field shown to the second, without the 'T'."""
    def cell(item: dict[str, Any]) -> str:
        value = item.get(key)
        return str(value)[:19].replace("T", " ") if value else default
    return cell


def fitted_table(*columns: Column | str, **kw: Any) -> Table:
    """A table whose cells fold onto more lines rather than end in '…' when the
    terminal is narrow (rich's default cuts them). String headers become such columns;
    ``Column`` objects are taken as given (``no_wrap`` ones stay whole)."""
    cols = [c if isinstance(c, Column) else Column(c, overflow="fold") for c in columns]
    return Table(*cols, **kw)


def table(items: Sequence[dict[str, Any]], columns: Sequence[Col], wide: bool = False,
          **kw: Any) -> Table:
    """The items as a fitted table of the default columns, or all of them when ``wide``."""
    shown = [c for c in columns if wide or not c.wide]
    t = fitted_table(*(Column(c.header, no_wrap=c.whole, overflow="fold", justify=c.justify)
                       for c in shown), **kw)
    for item in items:
        t.add_row(*(c.cell(item) for c in shown))
    return t


def dump(data: Any, output: Output) -> str:
    """``data`` as JSON or YAML text (the full objects, keys in the gateway's order)."""
    if output is Output.YAML:
        return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    return json.dumps(data, indent=2, default=str) + "\n"


def printed_as_data(data: Any, output: Output | None) -> bool:
    """With ``-o json|yaml``, print ``data`` so and say so; a table is the caller's."""
    if output not in (Output.JSON, Output.YAML):
        return False
    # plain stdout, not rich: no markup, wrapping or colour in machine-readable text
    typer.echo(dump(data, output), nl=False)
    return True


def show(console: Console, items: Sequence[dict[str, Any]], columns: Sequence[Col],
         output: Output | None, **kw: Any) -> None:
    """Print a listing in the chosen format (``kw``: the table's title, caption ...)."""
    if printed_as_data(list(items), output):
        return
    t = table(items, columns, wide=output is Output.WIDE, **kw)
    if output is Output.WIDE:  # as kubectl's: as wide as its columns, the terminal wraps
        console = Console(width=max(console.width, natural_width(console, t)))
    console.print(t)


def natural_width(console: Console, t: Table) -> int:
    """The width the table takes when nothing has to wrap."""
    return Measurement.get(console, console.options.update_width(10_000), t).maximum
