"""The README's links into the manual resolve, the manual's public-trace example runs as written, and the
reference pages docs/hooks.py generates at build time say what the code says.

`make docs` (part of `make test`) builds docs/ with `mkdocs build --strict`, whose `validation:` settings in
mkdocs.yml fail the build on a link or anchor inside the docs that leads nowhere, or on a page left out of the
nav. The README lies outside the site, so its links are checked here: each relative link names a file of the
repository, and an anchor into a docs page names one of that page's headings, slugged as mkdocs' `toc`
extension slugs it (Python-Markdown's `markdown.extensions.toc.slugify`, mkdocs' default).

The trace example (docs/scenarios.md, "Replaying a public trace") is taken from the page itself: its download
lands where its scenario looks, and the scenario runs on a file in the published format. The generated pages
(`cli.md`, `schema.md`) are checked against rows written out by hand from the declarations in cli.py and
simulator/config.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from markdown.extensions.toc import slugify

ROOT = Path(__file__).resolve().parent.parent

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _outside_fences(text: str) -> str:
    """The text with fenced code blocks removed (a `# comment` there is not a heading)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def _outside_code(text: str) -> str:
    """The text with fenced code blocks and inline code removed (a `[x](y)` there is not a link)."""
    return re.sub(r"`[^`\n]*`", "", _outside_fences(text))


def _heading_slugs(page: Path) -> set[str]:
    slugs = set()
    for line in _outside_fences(page.read_text()).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1)).replace("`", "")
            slugs.add(slugify(title, "-"))
    return slugs


def _relative_links(page: Path) -> list[str]:
    return [t for t in LINK.findall(_outside_code(page.read_text())) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def test_heading_slugs_as_mkdocs_makes_them():
    """Hand-worked slugs: lower case, punctuation and backticks dropped, spaces as hyphens."""
    page = ROOT / "docs" / "methods.md"
    slugs = _heading_slugs(page)
    assert "derived-profiles-where-each-gpus-time-goes" in slugs
    assert "hacks-prefill-attention" in slugs
    assert "outputs-of-simulate-out-dir" in _heading_slugs(ROOT / "docs" / "usage.md")


def test_readme_links_resolve():
    links = _relative_links(ROOT / "README.md")
    assert any(t.startswith("docs/") for t in links), "the README points into the manual"
    for target in links:
        path, _, anchor = target.partition("#")
        file = (ROOT / path).resolve() if path else ROOT / "README.md"
        assert file.is_file(), f"README links to {target}: no such file"
        assert file.is_relative_to(ROOT), f"README links outside the repository: {target}"
        if anchor:
            assert file.suffix == ".md", f"README links to an anchor in a non-Markdown file: {target}"
            assert anchor in _heading_slugs(file), f"README links to {target}: no heading of {path} has that slug"


def test_every_docs_page_is_linked_from_the_readme():
    """The README's reading list covers the whole manual (the nav's pages, bar the home page)."""
    linked = {Path(t.partition("#")[0]).name for t in _relative_links(ROOT / "README.md") if t.startswith("docs/")}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"index.md"}
    assert pages <= linked, f"docs pages the README does not point to: {sorted(pages - linked)}"


# --- the public-trace example of docs/scenarios.md runs as written -------------------------------------------------


def _fenced(page: Path, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", page.read_text(), flags=re.M | re.S)


def _downloads(page: Path) -> dict[str, str]:
    """`curl -L -o FOLDER/FILE URL` commands of the page's sh blocks: {FOLDER/FILE: URL}."""
    commands = "\n".join(_fenced(page, "sh")).replace("\\\n", " ")
    return dict(re.findall(r"curl -L -o (\S+)\s+(https://\S+)", commands))


def test_trace_example_runs_as_written(tmp_path):
    """The example's download lands where its scenario looks (the scenario's folder, the file name the scenario
    names, the name the publisher gives it); the scenario, written where the page says, runs on a file in the
    published format (the Azure 2023 columns, its TIMESTAMP spelling) and replays the window the text describes:
    minutes 10 to 20 of the trace, at 0.4 times its rate."""
    import yaml

    from simulator.load import load_scenario
    from simulator.run import run_scenario

    page = ROOT / "docs" / "scenarios.md"
    (scenario_text,) = [b for b in _fenced(page, "yaml") if b.startswith("# traces/azure_conv.yaml")]
    scenario_file = scenario_text.split(":", 1)[0].removeprefix("# ")
    assert f"cli.py simulate {scenario_file} " in "\n".join(_fenced(page, "sh"))
    trace = yaml.safe_load(scenario_text)["workload"]["trace"]
    downloads = _downloads(page)
    target = str(Path(scenario_file).parent / trace["path"])
    assert target in downloads, f"no download of {target} on the page"
    assert downloads[target].endswith("/" + trace["path"]), "the file keeps the publisher's name"

    # 44 rows 30 s apart from 18:00:15 (15 s after the trace's first row at 18:00:00): 20 of them fall in
    # [600 s, 1200 s), at 615 ... 1185 s; at 0.4 times the rate they arrive over (1185 - 615) / 0.4 = 1425 s.
    rows = ["2023-11-16 18:00:00.0000000,400,40"]
    rows += [f"2023-11-16 18:{(15 + 30 * k) // 60:02d}:{(15 + 30 * k) % 60:02d}.0000000,400,40" for k in range(43)]
    (tmp_path / target).parent.mkdir(parents=True)
    (tmp_path / target).write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    (tmp_path / scenario_file).write_text(scenario_text)
    cfg = load_scenario(tmp_path / scenario_file)
    result = run_scenario(cfg, methods=["baseline"])
    arrivals = result.requests["arrival_s"]
    assert len(arrivals) == 20
    assert arrivals.max() - arrivals.min() == pytest.approx(1425.0)


def test_other_trace_lines_name_their_downloads():
    """Each `trace:` line under the example is a valid trace setting whose file is one the page downloads."""
    import yaml

    from simulator.config import TraceConfig

    page = ROOT / "docs" / "scenarios.md"
    names = {Path(t).name for t in _downloads(page)}
    lines = [line for b in _fenced(page, "yaml") for line in b.splitlines() if line.strip().startswith("trace:")]
    assert {yaml.safe_load(line)["trace"]["format"] for line in lines} >= {"azure", "burstgpt", "mooncake"}
    for line in lines:
        trace = TraceConfig.model_validate(yaml.safe_load(line)["trace"])
        assert trace.path in names, f"{trace.path}: not downloaded on the page"


# --- the reference pages docs/hooks.py generates at build time ---------------------------------------------------


@pytest.fixture(scope="module")
def hooks():
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_command_reference_has_every_command(hooks):
    """cli.py's commands (its docstring lists them), each with its usage line and its own options."""
    page = hooks.cli_page()
    for name in ("simulate", "scenarios", "schema", "report", "validate", "calibrate", "sweep", "plan"):
        assert f"\n## {name}\n\n```text\nUsage: python cli.py {name} [OPTIONS]" in page, name
    simulate = page.split("\n## simulate\n", 1)[1].split("\n## ", 1)[0]
    assert "path.to.field=value (repeatable), e.g." in simulate and "--set" in simulate  # cli.py's --set help
    assert "--rate" not in simulate  # plan's option, in plan's section only
    assert "\x1b[" not in page and all(line == line.rstrip() for line in page.splitlines())


def test_schema_reference_rows_by_hand(hooks):
    """Rows written out from the fields' declarations in simulator/config.py: `Field(1, ge=1, le=1024, ...)` reads
    integer (≥ 1, ≤ 1024) with default 1; `gt=0, le=1e6` reads (> 0, ≤ 1e+06); `float | None` with None reads
    `... or null`, default null; a field without a default is required."""
    page = hooks.schema_page(json.loads(hooks.schema_text()))
    pool = page.split("\n## PoolConfig\n", 1)[1].split("\n## ", 1)[0]
    assert "| `tensor_parallel` | integer (≥ 1, ≤ 1024) | `1` | GPUs per pipeline stage (within one instance) |" in pool
    trace = page.split("\n## TraceConfig\n", 1)[1].split("\n## ", 1)[0]
    assert (
        "| `rate_scale` | number (> 0, ≤ 1e+06) | `1.0` | replay this many times faster: gaps divided by it |" in trace
    )
    assert "| `duration_s` | number (> 0, ≤ 1e+12) or null | `null` |" in trace
    assert "| `path` | string | required | the trace file, relative to the scenario file |" in trace
    top = page.split("\n## Scenario\n", 1)[1].split("\n## ", 1)[0]
    assert "| `workload` | [WorkloadConfig](#workloadconfig) | required |" in top


def test_schema_reference_has_every_field(hooks):
    """Every object of `cli.py schema` has its section, and every field of it a row there."""
    schema = json.loads(hooks.schema_text())
    page = hooks.schema_page(schema)
    sections = {s.split("\n", 1)[0]: s for s in page.split("\n## ")[1:]}
    for name, obj in {"Scenario": schema, **schema["$defs"]}.items():
        fields = obj.get("properties") or max((a.get("properties", {}) for a in obj.get("anyOf", [])), key=len)
        assert name in sections, name
        for field in fields:
            assert f"\n| `{field}` |" in sections[name], f"{name}.{field}"


def test_table_cells_are_escaped(hooks):
    assert hooks._escape("a|b <c> *d* x_y [e](f)\nnext") == r"a\|b &lt;c&gt; \*d\* x\_y \[e\](f) next"
    assert hooks.type_of({"type": "array", "items": {"$ref": "#/$defs/LinkConfig"}, "minItems": 1}) == (
        "list of [LinkConfig](#linkconfig) (≥ 1 items)"
    )
