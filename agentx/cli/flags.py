"""Command-line flags of the option structs' fields (agentx.replayer.options), from the table of
agentx.cli.flag_table, so that `replay`, `sweep` and `decode` share one definition of every flag they have in common.

A field is a flag when the table has its path (`Scenario.duration_s`). The flag is `--field-name` (a unit suffix `_s`
dropped) unless the entry names it; its click type, range, choices and default come from the field's type and
constraints; `none` is the word that means None (e.g. `--idle-timeout off`), `bare` the value of the flag given alone
(`--ray` for `--ray auto`). Fields whose values need parsing (headers, JSON, NAME=VALUE pairs, LOW,HIGH) take a parser
from the caller (`repeat`: the flag may be given more than once). The values come back as keyword arguments named
`part__field`; `part_values` gathers one part's, with the flags the user set.

`--help` lists the options in sections, `HELP_GROUPS`, most used first (`GroupedCommand`): a derived flag in its
entry's `group`, else its part's (`part_flags(group=...)`); an option a command defines itself in `OWN_OPTION_GROUPS`,
by parameter name. An entry with `late` is listed after its section's other options (a derived flag less used than the
options a command defines after the derived ones, such as `--out`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any, Final

import click
import msgspec
import msgspec.inspect as mi

from agentx.cli.flag_table import FLAGS, Flag

Command = Callable[..., Any]
HELP_GROUPS: Final = (
    "Server",
    "Load",
    "Output",
    "Sweep",
    "AgentX scenario",
    "Trace",
    "Prompts",
    "Speculative decoding",
    "Connection",
    "Run",
)
"""The sections of `replay --help`, `sweep --help` and `decode --help`, in order."""
OWN_OPTION_GROUPS: Final[Mapping[str, str]] = {
    "served_models": "Server",
    "api_key_env": "Server",
    "no_proxy": "Connection",
    "mode": "Load",
    "levels": "Load",
    "out_dir": "Output",
    "overwrite": "Output",
    "repeat": "Output",
    "resume": "Output",
    "resume_anyway": "Output",
    "as_json": "Output",
    "gpus": "Output",
    "gpu_sku": "Output",
    "before_level": "Sweep",
    "before_level_timeout": "Sweep",
    "level_settings": "Sweep",
    "input_format": "Trace",
    "block_size": "Trace",
    "spec_golden": "Speculative decoding",
    "spec_thinking": "Speculative decoding",
    "sim_time_scale": "Run",
}
"""The section of each option `replay`, `sweep` and `decode` define themselves (not derived from a field); `--help`
goes last, in "Run"."""
UNGROUPED: Final = "Other"
"""Where an option of no known section would go (a test keeps this section empty)."""
Parser = Callable[[str, Any], Any]
"""`parser(flag, raw)`: the field's value from what click parsed; click.BadParameter when it cannot be one."""


def field_flag(kind: type[msgspec.Struct], field: mi.Field) -> Flag | None:
    """How `kind`'s `field` is a flag (agentx.cli.flag_table); None when it is not one."""
    return FLAGS.get(f"{kind.__name__}.{field.name}")


def flag_name(kind: type[msgspec.Struct], field: mi.Field) -> str:
    entry = field_flag(kind, field)
    return (entry.flag if entry is not None else None) or "--" + field.name.removesuffix("_s").replace("_", "-")


def _inner(kind: mi.Type) -> tuple[mi.Type, bool]:
    """The type without None, and whether None was allowed."""
    if isinstance(kind, mi.UnionType):
        rest = [t for t in kind.types if not isinstance(t, mi.NoneType)]
        if len(rest) == 1:
            return rest[0], len(rest) < len(kind.types)
    if isinstance(kind, mi.Metadata):
        return _inner(kind.type)
    return kind, False


def _click_type(kind: mi.Type) -> Any:
    if isinstance(kind, mi.Metadata):
        return _click_type(kind.type)
    if isinstance(kind, mi.IntType):
        least = kind.ge if kind.ge is not None else (kind.gt + 1 if kind.gt is not None else None)
        return click.IntRange(min=least, max=kind.le) if least is not None or kind.le is not None else int
    if isinstance(kind, mi.FloatType):
        bound = kind.ge if kind.ge is not None else kind.gt
        if bound is None and kind.le is None:
            return float
        return click.FloatRange(min=bound, max=kind.le, min_open=kind.gt is not None)
    if isinstance(kind, mi.LiteralType):
        return click.Choice([str(value) for value in kind.values], case_sensitive=False)
    return str


class _Value(click.ParamType[Any]):
    """A finite value of `inner` (click's float types accept NaN and infinities), or the word that means None."""

    def __init__(self, inner: Any, word: str | None = None) -> None:
        self.inner, self.word = inner, word
        self.name = getattr(inner, "name", "value") + (f"|{word}" if word else "")

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value is None or (self.word is not None and value == self.word):
            return None
        if isinstance(value, str):
            try:
                float(value)
            except ValueError:
                self.fail(f"{value!r} is not a number" + (f" or {self.word!r}" if self.word else ""), param, ctx)
        converted = (
            self.inner.convert(value, param, ctx) if isinstance(self.inner, click.ParamType) else self.inner(value)
        )
        if isinstance(converted, float) and not math.isfinite(converted):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return converted


def _finite(inner: Any) -> Any:
    return _Value(inner) if inner is float or isinstance(inner, click.FloatRange) else inner


class GroupedOption(click.Option):
    """An option that knows its `--help` section (`group`, one of `HELP_GROUPS`) and whether it goes last there."""

    def __init__(self, *args: Any, group: str, late: bool = False, **attrs: Any) -> None:
        super().__init__(*args, **attrs)
        self.group = group
        self.late = late


def option_group(param: click.Option) -> str:
    """The `--help` section of `param`: a derived flag's own, else `OWN_OPTION_GROUPS`' (else `UNGROUPED`)."""
    if "--help" in param.opts:
        return HELP_GROUPS[-1]
    group = getattr(param, "group", None) or OWN_OPTION_GROUPS.get(param.name or "")
    return group if group in HELP_GROUPS else UNGROUPED


HELP_TERM_MAX = 30
"""Option names longer than this put their help on the next line (click's default)."""


class GroupedCommand(click.Command):
    """A command whose `--help` lists its options in sections, `HELP_GROUPS` order, each in definition order."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        sections: dict[str, list[tuple[str, str]]] = {}
        # Arguments are named in the usage line, not listed; late options go last (a stable sort keeps the rest).
        for param in sorted(self.get_params(ctx), key=lambda param: getattr(param, "late", False)):
            if isinstance(param, click.Option) and (record := param.get_help_record(ctx)) is not None:
                sections.setdefault(option_group(param), []).append(record)
        # One column for the help texts of every section, as one list would have.
        width = min(HELP_TERM_MAX, max((len(term) for rows in sections.values() for term, _ in rows), default=0))
        order = (*HELP_GROUPS, UNGROUPED)
        for name in sorted(sections, key=order.index):
            with formatter.section(name):
                formatter.write_dl([(term.ljust(width), text) for term, text in sections[name]], col_max=HELP_TERM_MAX)


def _text(value: object) -> str:
    """A default as the flag would be typed: 50, not 50.0."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def _typed(value: object, none: str | None) -> str:
    """A value as the flag would be typed: `none`'s word (`off`) or "none" for None, a tuple comma-separated."""
    if value is None:
        return none or "none"
    return ",".join(map(_text, value)) if isinstance(value, tuple) else _text(value)


def mode_default(part: str, field: mi.Field, none: str | None) -> str | None:
    """The default `--help` shows for a field the AgentX scenario sets (`--mode agentx` takes its rule set's defaults,
    agentx.replayer.options.rules): "3600 with --mode agentx, 1800 under --rules aiperf-0.13.0; else none"; None for
    the other fields."""
    from agentx.replayer.options.rules import DEFAULT_RULES_NAME, RULE_SETS

    plain = None if field.required else field.default
    by_rules = {name: rules.defaults.get(part, {}).get(field.name, plain) for name, rules in RULE_SETS.items()}
    agentx = by_rules[DEFAULT_RULES_NAME]
    if agentx == plain:
        return None
    others = [f", {_typed(value, none)} under --rules {name}" for name, value in by_rules.items() if value != agentx]
    return f"{_typed(agentx, none)} with --mode agentx{''.join(others)}; else {_typed(plain, none)}"


def field_option(
    part: str,
    struct: type[msgspec.Struct],
    field: mi.Field,
    parsers: Mapping[str, Parser],
    group: str,
    **overrides: Any,
) -> Any:
    """The click option of one field (see the module docstring), listed under its entry's `group`, else `group`."""
    entry = field_flag(struct, field)
    assert entry is not None
    kind = field.type.type if isinstance(field.type, mi.Metadata) else field.type
    names = [flag_name(struct, field)] + ([entry.alias] if entry.alias is not None else [])
    settings: dict[str, Any] = {
        "help": entry.help,
        "metavar": entry.metavar,
        "cls": GroupedOption,
        "group": entry.group or group,
        "late": entry.late,
    }
    default = None if field.required else field.default
    inner, _ = _inner(kind)
    if field.name in parsers:
        multiple = entry.repeat
        settings.update(type=str, multiple=multiple)
        if not multiple and default is not None and not isinstance(default, dict):
            settings.update(default=",".join(map(_text, default)) if isinstance(default, tuple) else default)
            settings["show_default"] = True
    elif isinstance(inner, mi.BoolType):
        names = [f"{names[0]}/--no-{names[0].removeprefix('--')}"]
        settings.update(default=default, show_default=True)
    elif isinstance(inner, mi.VarTupleType):
        settings.update(type=_click_type(inner.item_type), multiple=True)
    elif entry.bare is not None:  # the flag alone means `bare`, e.g. `--ray` for `--ray auto`
        settings.update(type=str, is_flag=False, flag_value=entry.bare, default=default)
    elif entry.none is not None:
        settings.update(type=_Value(_click_type(inner), entry.none), show_default=True)
        settings["default"] = entry.none if default is None else str(default)
    else:
        settings.update(type=_finite(_click_type(inner)))
        if default is not None:
            settings.update(default=default, show_default=True)
    shown = mode_default(part, field, entry.none)
    if shown is not None:
        settings["show_default"] = shown
    settings.update(overrides)
    return click.option(*names, f"{part}__{field.name}", **settings)


@functools.cache
def _fields(kind: type[msgspec.Struct]) -> tuple[mi.Field, ...]:
    """`kind`'s fields as msgspec sees them (inspected once: `replay`, `sweep` and `decode` share the parts)."""
    info = mi.type_info(kind)
    assert isinstance(info, mi.StructType)
    return info.fields


def fields_with_flags(kind: type[msgspec.Struct], skip: frozenset[str] = frozenset()) -> list[mi.Field]:
    return [f for f in _fields(kind) if f.name not in skip and field_flag(kind, f) is not None]


def part_flags(
    part: str,
    kinds: tuple[type[msgspec.Struct], ...],
    parsers: Mapping[str, Parser] = {},
    skip: frozenset[str] = frozenset(),
    overrides: Mapping[str, Mapping[str, Any]] = {},
    *,
    group: str,
) -> Callable[[Command], Command]:
    """A decorator adding the flags of `kinds`' fields (several kinds: the variants of a union, each field once),
    listed in `--help` under `group` unless a field names its own."""
    seen: dict[str, tuple[type[msgspec.Struct], mi.Field]] = {}
    for kind in kinds:
        for field in fields_with_flags(kind, skip):
            seen.setdefault(field.name, (kind, field))
    decorators = [
        field_option(part, kind, field, parsers, group, **overrides.get(field.name, {}))
        for kind, field in seen.values()
    ]

    def apply(command: Command) -> Command:
        for decorator in reversed(decorators):
            command = decorator(command)
        return command

    return apply


def part_values(
    part: str, kind: type[msgspec.Struct], flags: Mapping[str, Any], parsers: Mapping[str, Parser] = {}
) -> dict[str, Any]:
    """`kind`'s fields among `flags` (click's keyword arguments), parsed, as a dict for `msgspec.convert`."""
    values: dict[str, Any] = {}
    for field in _fields(kind):
        key = f"{part}__{field.name}"
        if key not in flags:
            continue
        raw = flags[key]
        if raw == () and field.default != ():
            continue  # a repeatable flag not given: the field's default
        if raw is None and field.required:
            continue  # not given: msgspec says which flag is missing
        values[field.name] = parsers[field.name](flag_name(kind, field), raw) if field.name in parsers else raw
    return values


def flags_set(ctx: click.Context, part: str, flags: Mapping[str, Any]) -> set[str]:
    """The fields of `part` whose flags the user gave (not left at their defaults)."""
    given = set()
    for key in flags:
        if key.startswith(part + "__"):
            source = ctx.get_parameter_source(key)
            if source is not None and source is not click.core.ParameterSource.DEFAULT:
                given.add(key.removeprefix(part + "__"))
    return given


def convert_part(kind: type[Any], values: Mapping[str, Any], what: str) -> Any:
    """`values` as a `kind`, checked; click.BadParameter naming `what` with msgspec's or `__post_init__`'s reason."""
    try:
        return msgspec.convert(dict(values), kind, strict=False)
    except msgspec.ValidationError as exc:
        reason = str(exc).split(" - at `$")[0]
        if reason.startswith("Object missing required field `"):
            field = reason.removeprefix("Object missing required field `").rstrip("`")
            reason = f"it needs --{field.removesuffix('_s').replace('_', '-')}"
        raise click.BadParameter(reason, param_hint=what) from None
