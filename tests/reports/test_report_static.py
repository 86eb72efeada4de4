"""Static PNG/SVG export through kaleido and the system Chromium, and its one-line errors."""

from __future__ import annotations

import builtins

import pytest
from browser_required import require_browser, require_kaleido
from report_fake_run import write_fake_run

from reports import export_static
from reports.static import StaticExportError, find_browser


def test_png_and_svg_written_offline(tmp_path):
    require_kaleido()  # skipped without them, failed under make test or CI (browser_required.py)
    require_browser()
    run = write_fake_run(tmp_path, n_requests=20)
    paths = export_static(run, ("png", "svg"), names=["cdf_jct", "decode_memory"], scale=1)
    assert sorted(p.name for p in paths) == ["cdf_jct.png", "cdf_jct.svg", "decode_memory.png", "decode_memory.svg"]
    assert all(p.parent == run / "figures" for p in paths)
    png = (run / "figures" / "cdf_jct.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    svg = (run / "figures" / "decode_memory.svg").read_text()
    assert "<svg" in svg[:500] and "decode replica" in svg and "capacity" in svg


def test_missing_kaleido_is_one_clear_line(tmp_path, monkeypatch):
    real_import = builtins.__import__

    def no_kaleido(name, *args, **kwargs):
        if name == "kaleido" or name.startswith("kaleido."):
            raise ImportError("No module named 'kaleido'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_kaleido)
    with pytest.raises(StaticExportError, match=r"needs kaleido>=1: pip install") as e:
        export_static(write_fake_run(tmp_path, n_requests=5))
    assert "\n" not in str(e.value)


def test_browser_lookup(monkeypatch, tmp_path):
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "no-such-chrome"))
    with pytest.raises(StaticExportError, match="BROWSER_PATH"):
        find_browser()
    monkeypatch.delenv("BROWSER_PATH")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(StaticExportError, match="apt-get install chromium"):
        find_browser()
    fake = tmp_path / "chromium"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert find_browser() == str(fake)
    assert find_browser(fake) == str(fake)


def test_unknown_format_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown image format"):
        export_static(tmp_path, ("gif",))


class _FlakyKaleido:
    """kaleido's write_fig_from_object_sync as it behaves on a loaded machine: the first call renders every figure
    but `fail` and returns that one's error (kaleido returns failed renders' errors, it does not raise); each later
    call fails the figures of `always`."""

    def __init__(self, fail: str, always: str = ""):
        self.fail, self.always, self.calls = fail, always, []

    def write_fig_from_object_sync(self, specs, kopts=None):
        self.calls.append([s["path"].name for s in specs])
        errors = []
        for s in specs:
            bad = s["path"].name == self.always or (len(self.calls) == 1 and s["path"].name == self.fail)
            if bad:
                errors.append(TimeoutError("render timed out\nmore"))
            else:
                s["path"].write_bytes(b"x")
        return tuple(errors)


def test_a_render_that_fails_once_is_rendered_again(tmp_path, monkeypatch):
    """One figure's render fails (a browser tab's timeout under load): only it is rendered again, and the export
    succeeds; one that fails every time is named in one line with kaleido's reason."""
    import reports.static as static

    run = write_fake_run(tmp_path, n_requests=20)
    exe = tmp_path / "chromium"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    flaky = _FlakyKaleido("cdf_jct.png")
    monkeypatch.setattr(static, "_kaleido", lambda: flaky)
    paths = export_static(run, ("png", "svg"), names=["cdf_jct", "decode_memory"], scale=1, browser_path=exe)
    assert all(p.is_file() for p in paths) and len(paths) == 4
    assert flaky.calls[1] == ["cdf_jct.png"]  # the retry renders the missing figure alone
    for p in paths:
        p.unlink()
    stuck = _FlakyKaleido("", always="decode_memory.svg")
    monkeypatch.setattr(static, "_kaleido", lambda: stuck)
    with pytest.raises(
        StaticExportError, match=r"wrote no file for decode_memory.svg: TimeoutError: render timed out$"
    ):
        export_static(run, ("png", "svg"), names=["cdf_jct", "decode_memory"], scale=1, browser_path=exe)
    assert len(stuck.calls) == 2
