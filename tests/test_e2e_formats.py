"""Browser test of the weight-formats panel: one served lab, fp32 against q4 on a short prompt; the page's
charts carry the server's record, and no text of theirs is cut or overlaps another at 800, 1280 and 1600 px in
English and Russian (the table's narrow columns cut "format" to "forma")."""

import pytest

from app.charts.quantization import CHART_IDS
from e2e_util import TEST_SHOTS, chromium_available, ensure_drawn, open_lab, served_lab
from screenshots import WIDTHS, switch_language, text_problems

pytestmark = pytest.mark.skipif(not chromium_available(), reason="Debian chromium is not installed")
SHOTS = TEST_SHOTS


def chart_data(page, chart_id):
    return page.evaluate("""id => { const el = document.getElementById(id);
        return el && el.data ? el.data.map(t => ({x: t.x, y: t.y, name: t.name || '', text: t.text,
            cells: t.cells ? t.cells.values : null})) : null; }""", chart_id)


def test_formats_panel_draws_the_servers_comparison(base_engine):
    with served_lab(base_engine) as (url, app, b):
        page = open_lab(b, url, height=1400)
        page.fill("#prompt textarea", "What is gravity?")
        for fmt in ("bf16", "int8"):  # fp32 (always) and q4: one format to load
            page.locator("#formats_pick label", has_text=fmt).click()
        page.locator("#formats_tokens input[type=number]").fill("8")
        page.locator("#formats_tokens input[type=number]").press("Enter")
        page.locator("#formats_run").scroll_into_view_if_needed()
        page.click("#formats_run")
        # the status line says what runs while it runs, then the charts come
        page.wait_for_function("() => /q4|fp32/.test(document.querySelector('#html-message').innerText)",
                               timeout=60000)
        page.wait_for_function("() => (window.inferlab.state.ops.formats || 0) >= 1", timeout=400000, polling=500)
        (cmp,) = app.state.formats.results.values()
        assert [r.weights for r in cmp.runs] == ["fp32", "q4"] and len(cmp.reference_ids) == 8
        page.evaluate("() => { document.getElementById('chart-formats-floor').scrollIntoView(); "
                      "window.inferlab.flush(); }")
        floor = {t["name"]: t for t in chart_data(page, "chart-formats-floor")}
        assert floor["formats"]["text"] == ["fp32", "q4"]
        assert floor["formats"]["x"] == pytest.approx([r.step_bytes / 1e6 for r in cmp.runs])
        assert floor["formats"]["y"] == pytest.approx([r.step_ms for r in cmp.runs])
        (kl,) = chart_data(page, "chart-formats-kl")
        assert kl["name"] == "q4" and kl["y"] == pytest.approx(cmp.run("q4").kl, abs=1e-9)
        logit = chart_data(page, "chart-formats-logit")
        assert [t["y"] for t in logit] == [pytest.approx(r.chosen_logit) for r in cmp.runs]
        (table,) = chart_data(page, "chart-formats-table")
        assert table["cells"][0] == ["fp32", "q4"]
        assert "fp32" in page.inner_text("#html-formats-texts") and cmp.reference.text[:10] in \
            page.inner_text("#html-formats-texts")
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.locator("#panel-formats").screenshot(path=str(SHOTS / "formats.png"))
        found = []
        for lang in ("en", "ru"):
            if lang == "ru":
                switch_language(page, "ru")  # the comparison is redrawn in Russian
                page.wait_for_function("""() => { window.inferlab.flush();  // drawn though out of view
                    return document.getElementById('chart-formats-table').data[0].header.values[0]
                        .includes('формат'); }""", timeout=30000)
            for width in WIDTHS:
                page.set_viewport_size({"width": width, "height": 1000})
                for cid in CHART_IDS:
                    ensure_drawn(page, cid)
                page.wait_for_timeout(600)  # Plotly's resize after the window's
                found += [f"{lang} {width}: {p}" for p in text_problems(page, CHART_IDS)]
        assert not found, "\n".join(found)
