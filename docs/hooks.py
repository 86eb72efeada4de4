"""mkdocs hooks (mkdocs.yml `hooks:`): the manual's reference pages, generated from the code at every build.

Nothing here is committed output, so nothing can go stale: each `mkdocs build` (`make docs`, part of `make test`)
runs the commands and writes

- `cli.md`: `python cli.py --help` and every command's `--help`, as the command prints them (100 columns, no
  colour), the commands taken from the typer app itself, so a new command appears with no edit here;
- `schema.md`: what `python cli.py schema` prints (the scenario JSON Schema, = scenarios/schema.json), as a field
  reference: one table per object, each field with its type and bounds, default and description;
- `schema.json`: that schema as a file next to the page.

The commands run in-process through typer's test runner (no subprocess, nothing fetched), so the build stays
offline; they add about 3 s to it (1.8 s of imports, 1.0 s for the nine helps, 0.4 s for the schema, measured
at a load of 12 on two cores).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HELP_COLUMNS = 100
PROG = "python cli.py"
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _invoke(args: list[str]) -> str:
    """What `python cli.py ARGS` prints, at HELP_COLUMNS columns and without colour."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from typer.testing import CliRunner

    import cli

    env = {"COLUMNS": str(HELP_COLUMNS), "NO_COLOR": "1", "TERM": "dumb"}
    result = CliRunner().invoke(cli.app, args, prog_name=PROG, env=env)
    if result.exit_code != 0:
        raise RuntimeError(f"{PROG} {' '.join(args)} exited {result.exit_code}: {result.output}")
    return ANSI.sub("", result.output)


def _commands() -> list[str]:
    """The CLI's commands in the order `--help` lists them."""
    import typer

    import cli

    return list(typer.main.get_command(cli.app).commands)  # pyright: ignore[reportAttributeAccessIssue]


def _help_block(text: str) -> str:
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return "```text\n" + "\n".join(lines) + "\n```\n"


def cli_page() -> str:
    parts = [
        "# Command reference\n",
        "Every command's `--help`, generated from the CLI when this site is built (`docs/hooks.py`), so it is the "
        f"help of this version. Worked examples of the commands are in [Commands and outputs](usage.md). "
        f"`{PROG}` and the installed `hacksim` command are the same program.\n",
        f"## {PROG}\n",
        _help_block(_invoke(["--help"])),
    ]
    for name in _commands():
        parts += [f"## {name}\n", _help_block(_invoke([name, "--help"]))]
    return "\n".join(parts)


# --- the scenario schema as a field reference -------------------------------------------------------------------


def _escape(text: str) -> str:
    """Text for a Markdown table cell: one line, no HTML, no emphasis or link syntax, no column breaks."""
    text = " ".join(str(text).split())
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return re.sub(r"([\\`*_\[\]|])", r"\\\1", text)


def _value(v) -> str:
    """A JSON value as inline code (JSON spelling: null, true, 1e+18)."""
    return "`" + json.dumps(v, separators=(", ", ": ")).replace("|", "\\|") + "`"


def _anchor(name: str) -> str:
    return name.lower()


BOUNDS = (
    ("exclusiveMinimum", "> {}"),
    ("minimum", "≥ {}"),
    ("exclusiveMaximum", "< {}"),
    ("maximum", "≤ {}"),
    ("multipleOf", "multiple of {}"),
    ("minItems", "≥ {} items"),
    ("maxItems", "≤ {} items"),
    ("minLength", "≥ {} characters"),
    ("maxLength", "≤ {} characters"),
)


def _number(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def type_of(s: dict) -> str:
    """One schema as a short type: `$ref`s as links to their section, alternatives joined by "or", bounds and
    enums inline. A field whose type is `integer ≥ 1, ≤ 1024` reads as it validates."""
    if "$ref" in s:
        name = s["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{_anchor(name)})"
    for key in ("anyOf", "oneOf"):
        if key in s:
            return " or ".join(type_of(alt) for alt in s[key])
    if "const" in s:
        return _value(s["const"])
    if "enum" in s:
        return "one of " + ", ".join(_value(v) for v in s["enum"])
    kind = s.get("type", "any")
    if kind == "array":
        text = f"list of {type_of(s.get('items', {}))}"
    elif kind == "object" and isinstance(s.get("additionalProperties"), dict):
        text = f"map of string to {type_of(s['additionalProperties'])}"
    else:
        text = str(kind)
    bounds = [fmt.format(_number(s[key])) for key, fmt in BOUNDS if key in s]
    return f"{text} ({', '.join(bounds)})" if bounds else text


def _table(obj: dict) -> list[str]:
    required = set(obj.get("required", []))
    rows = ["| field | type | default | description |", "|---|---|---|---|"]
    for name, field in obj.get("properties", {}).items():
        default = "required" if name in required else _value(field["default"]) if "default" in field else "optional"
        rows.append(f"| `{name}` | {type_of(field)} | {default} | {_escape(field.get('description', ''))} |")
    return rows


def _section(name: str, s: dict) -> list[str]:
    out = [f"## {name}", ""]
    if s.get("description"):
        out += [_escape(s["description"]), ""]
    if "properties" in s:
        return out + _table(s) + [""]
    # a catalog preset (simulator/schema.py): a key, {preset: KEY, ...overrides}, or the whole object
    alternatives = s.get("anyOf", [])
    full = [a for a in alternatives if "properties" in a and a.get("required") != ["preset"]]
    keys = [a for a in alternatives if "enum" in a]
    if full and keys:
        out += [
            f"A catalog key ({', '.join(_value(k) for k in keys[0]['enum'])}), or `{{preset: KEY, ...}}` with any "
            "of the fields below overriding the preset's, or every required field below.",
            "",
        ]
        return out + _table(full[0]) + [""]
    return out + [f"Type: {type_of(s)}", ""]


def schema_page(schema: dict) -> str:
    out = [
        "# Scenario schema",
        "",
        "Every field a scenario file may set, generated from the schema when this site is built "
        "(`docs/hooks.py` renders what `python cli.py schema` prints; the same schema ships as "
        "`scenarios/schema.json` and, for download, as [schema.json](schema.json)). Types carry their bounds. A "
        "field marked required has no default; one marked optional may be left out, and the code then builds "
        "its value (an object from its own fields' defaults, an empty list, or none). How scenarios are written, "
        "with examples, is in [Scenarios](scenarios.md).",
        "",
    ]
    top = {k: v for k, v in schema.items() if k != "$defs"}
    out += _section("Scenario", {**top, "description": ""})
    for name, s in schema.get("$defs", {}).items():
        out += _section(name, s)
    return "\n".join(out)


def schema_text() -> str:
    text = _invoke(["schema"])
    json.loads(text)  # the command printed one JSON document
    return text


# --- mkdocs events ----------------------------------------------------------------------------------------------


def on_files(files, config):
    from mkdocs.structure.files import File

    schema = schema_text()
    files.append(File.generated(config, "cli.md", content=cli_page()))
    files.append(File.generated(config, "schema.md", content=schema_page(json.loads(schema))))
    files.append(File.generated(config, "schema.json", content=schema))
    return files
