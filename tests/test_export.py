"""Chart export: every chart of a real payload as PNG (kaleido + Debian's chromium) and as offline HTML."""
import json
import re
import struct

import pytest

from app import render
from app.export import chart_file, chart_title, figure_html, figure_png
from app.session import LabSession
from engine import SamplingParams


@pytest.fixture(scope="module")
def figs(base_engine):
    lab = LabSession.create(base_engine, kv_memory=16 * 1024 * 1024)
    lab.add_request("Что такое гравитация?", SamplingParams(max_tokens=8, temperature=0.7, seed=3), True, None)
    for _ in range(3):
        lab.step()
    p = render.build_payload(lab, "ru", 2, 1, "", None, {"bandwidth": 20e9, "peak_flops": 100e9})
    return p["figs"]


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_every_chart_exports_as_png(figs, tmp_path):
    for cid in render.CHART_IDS:
        data = figure_png(figs[cid], width=640)
        assert png_size(data) == (640, figs[cid]["layout"].get("height") or 500), cid
        assert len(data) > 2000, cid  # something was drawn, not an empty canvas
    assert png_size(figure_png(figs["chart-attention"], width=400, height=300, scale=2)) == (800, 600)
    path = chart_file(figs, "chart-attention", "png", tmp_path)
    height = figs["chart-attention"]["layout"].get("height") or 500  # the figure's own height, else Plotly's
    assert path.name == "inferlab-attention.png" and png_size(path.read_bytes()) == (900, height)


def test_chart_html_is_standalone(figs, tmp_path):
    fig = figs["chart-timeline"]
    page = figure_html(fig, "InferLab <timeline>")
    assert page.startswith("<!DOCTYPE html>") and "<title>InferLab &lt;timeline&gt;</title>" in page
    # plotly.js is inline: no script is fetched from anywhere
    assert not re.search(r"<script[^>]*\ssrc=", page) and "Plotly.newPlot" in page and len(page) > 1_000_000
    # the figure's own numbers are in the page
    steps = next(t for t in fig["data"] if t.get("name") == "steps")
    assert all(json.dumps(y) in page for y in steps["y"])
    path = chart_file(figs, "chart-bytes", "html", tmp_path)
    text = path.read_text(encoding="utf-8")
    assert path.suffix == ".html" and chart_title(figs["chart-bytes"], "chart-bytes") in text
    for cid in render.CHART_IDS:  # every chart's figure is accepted by plotly's HTML writer
        assert "Plotly.newPlot" in figure_html(figs[cid], cid)


def test_export_errors_are_clear(figs, tmp_path):
    with pytest.raises(ValueError, match="unknown chart 'chart-nope'"):
        chart_file(figs, "chart-nope", "png", tmp_path)
    with pytest.raises(ValueError, match="unknown export format 'svg'"):
        chart_file(figs, "chart-attention", "svg", tmp_path)
    with pytest.raises(ValueError, match="has not been drawn yet"):
        chart_file({}, "chart-attention", "html", tmp_path)
    with pytest.raises(ValueError, match="Plotly figure dict"):
        figure_png("not a figure")
    with pytest.raises(ValueError, match="plain JSON"):
        figure_html({"data": [{"type": "bar", "y": [float("nan")]}]}, "x")
    with pytest.raises(ValueError, match="scale"):
        figure_png(figs["chart-attention"], scale=0)
    with pytest.raises(ValueError, match="pixels"):
        figure_png(figs["chart-attention"], width=100000)
