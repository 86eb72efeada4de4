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
