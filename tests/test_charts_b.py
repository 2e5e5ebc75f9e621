"""Sampling, detokenizer, KV-cache and timeline charts/panels, checked against REAL engine events.

One small session (6 KV blocks of 16 tokens) runs four requests for 16 steps: a Russian prompt (a Cyrillic
letter's first byte is held back), a greedy English one with a stop string, the same English prompt again
(prefix-cache hit) and a late one that arrives when the pool is full (eviction); the tight pool also forces a
preemption. Every figure's numbers are compared with the event fields they were drawn from.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from types import SimpleNamespace

import pytest

from app.charts import detok, kv_cache, sampling, timeline
from app.charts.common import ACCENT, GREY, SEQ_COLORS, fmt_bytes, plain, seq_color, token_label
from app.panels import kv as kv_panel
from app.panels import pipeline, stream
from engine import SamplingParams, StepEvent
from engine.events import SeqEvent
from engine.tokenizer import DetokStep

BW, PEAK = 20e9, 150e9  # a made-up machine for the roofline (the real one is measured by the app)
WHAT_IF = "what-if (not applied until the next step)"


@pytest.fixture(scope="module")
def run(base_engine):
    eng = base_engine.session(kv_memory=6 * 16 * base_engine.kv_bytes_per_token, max_num_batched_tokens=64)
    q = "What is gravity?"
    eng.add_request("Что такое гравитация?", SamplingParams(max_tokens=12, temperature=0.7, top_p=0.9, seed=1))
    eng.add_request(q, SamplingParams(max_tokens=12, temperature=0.0, stop=[" in physics"]))
    eng.add_request(q, SamplingParams(max_tokens=24, temperature=1.0, top_k=5, min_p=0.05, seed=3))
    events = []
    for i in range(16):
        if i == 6:
            eng.add_request("Tell me a joke", SamplingParams(max_tokens=4, temperature=0.0))
        events.append(eng.step())
    return eng, events


def _seq_events(events):
    return [(e, s) for e in events for s in e.seqs]


def _sampled(events):
    return [(e, s) for e, s in _seq_events(events) if s.sampling is not None]


def _all_figures(eng, events, lang="en"):
    last = events[-1]
    e, s = _sampled(events)[-1]
    figs = [
        sampling.sampling_chain_chart(s.sampling, lang=lang),
        sampling.sampling_chain_chart(eng.what_if(s.seq_id, SamplingParams(temperature=1.3, top_k=4)),
                                      what_if=True, lang=lang),
        sampling.sampling_cdf_chart(s.sampling, lang),
        detok.detok_table(events, 1, lang=lang),
    ]
    for ev in (events[1], events[2], last):
        figs += [kv_cache.block_pool_chart(ev, lang), kv_cache.block_tables_chart(ev, lang),
                 kv_cache.kv_memory_chart(ev, lang)]
    figs += [timeline.timeline_chart(events, lang), timeline.latency_table(events, lang),
             timeline.roofline_chart(events, BW, PEAK, lang)]
    return figs


def test_scenario_exercises_the_interesting_cases(run):
    _, events = run
    assert any(e.preempted for e in events) or events[-1].kv.evictions > 0
    assert events[-1].kv.prefix_hit_tokens > 0
    assert any(s.finish_reason == "stop" for _, s in _seq_events(events))
    assert any(s.detok and s.detok.held_bytes for _, s in _seq_events(events))
    assert any(s.detok and s.detok.stop_partial for _, s in _seq_events(events))
    assert {timeline.step_kind(e) for e in events} >= {"prefill", "decode", "mixed"}


# ---- sampling ------------------------------------------------------------------------------------

def test_sampling_chain_bars_equal_stage_probs(run):
    _, events = run
    pairs = _sampled(events)
    assert pairs
    for _, s in pairs:
        tr = s.sampling
        fig = sampling.sampling_chain_chart(tr)
        bars = [t for t in fig["data"] if t["type"] == "bar"]
        # these runs are unconstrained: every stage but the grammar's, in the chart's order
        expected = [name for name in sampling.CHAIN_ORDER if name != "grammar"]
        assert [b["name"] for b in bars] == [st.name for st in tr.stages] == expected
        for k, (bar, st) in enumerate(zip(bars, tr.stages)):
            assert bar["x"] == st.probs
            assert bar["y"] == list(range(len(tr.token_ids)))
            colors = bar["marker"]["color"]
            assert [c == GREY for c in colors] == [not kept for kept in st.kept]
            for i, kept in enumerate(st.kept):
                if not kept:
                    assert bar["x"][i] == 0.0 and bar["text"][i] == "✕"
            assert (bar["opacity"] < 1) == (not st.active)
            ann = fig["layout"]["annotations"][k]["text"]
            if st.active:
                assert f"<br>{st.num_kept:,}" in ann
                hover = fig["layout"]["annotations"][k]["hovertext"]
                assert f"{st.num_kept:,} of {tr.vocab_size:,} tokens kept" in hover
            else:
                assert "off" in ann
        c = tr.token_ids.index(tr.chosen)
        assert bars[-1]["marker"]["color"][c] == ACCENT
        assert sum(col == ACCENT for col in bars[-1]["marker"]["color"]) == 1
        assert fig["layout"]["yaxis"]["ticktext"][c].startswith(token_label(tr.token_texts[c])[:5])
        assert WHAT_IF not in fig["layout"]["title"]["text"]


def test_sampling_chain_marks_removed_mass_and_what_if(run):
    eng, events = run
    e, s = next((e, s) for e, s in _sampled(events) if s.seq_id == 2)  # top_k=5, min_p=0.05
    fig = sampling.sampling_chain_chart(s.sampling)
    top_k = next(st for st in s.sampling.stages if st.name == "top_k")
    assert top_k.active and top_k.num_kept <= 5
    names = [st.name for st in s.sampling.stages]  # an unconstrained chain: no grammar stage
    ann = fig["layout"]["annotations"][names.index("top_k")]["text"]
    if top_k.mass_removed > 0:
        assert f"−{top_k.mass_removed:.1%}" in ann

    wi = eng.what_if(2, SamplingParams(temperature=1.5, top_k=3))
    fig_wi = sampling.sampling_chain_chart(wi, what_if=True)
    assert WHAT_IF in fig_wi["layout"]["title"]["text"].replace("<br>", " ")  # titles wrap (common.TITLE_CHARS)
    assert fig_wi["layout"]["shapes"][0]["line"]["color"] == sampling.WHAT_IF_COLOR
    assert any("WHAT-IF" in a["text"] for a in fig_wi["layout"]["annotations"])
    bars = [t for t in fig_wi["data"] if t["type"] == "bar"]
    assert bars[names.index("top_k")]["x"] == wi.stages[4].probs and wi.stages[4].name == "top_k"
    assert sum(wi.stages[4].kept) == 3
    ru = sampling.sampling_chain_chart(wi, what_if=True, lang="ru")
    assert "что-если" in ru["layout"]["title"]["text"]


def test_sampling_cdf_staircase_u_line_and_choice(run):
    eng, events = run
    checked_draw = checked_greedy = False
    for _, s in _sampled(events):
        tr = s.sampling
        fig = sampling.sampling_cdf_chart(tr)
        by = {t["name"]: t for t in fig["data"]}
        assert by["cdf"]["y"] == [c for _, c in tr.cdf]
        assert [cd[0] for cd in by["cdf"]["customdata"]] == [t for t, _ in tr.cdf]
        assert by["cdf"]["line"]["shape"] == "hv"
        pos = [t for t, _ in tr.cdf].index(tr.chosen)
        # each interval bar spans [cdf - p, cdf) of its token
        for i, (tid, cum) in enumerate(tr.cdf):
            p = tr.stages[-1].probs[tr.token_ids.index(tid)]
            assert math.isclose(by["interval"]["base"][i] + by["interval"]["y"][i], cum, abs_tol=1e-6)
            assert math.isclose(by["interval"]["y"][i], p, rel_tol=1e-9)
        if tr.greedy:
            checked_greedy = True
            assert "u" not in by
            assert any("temperature 0: argmax, no draw" in a["text"] for a in fig["layout"]["annotations"])
        else:
            checked_draw = True
            assert by["u"]["y"] == [tr.u, tr.u]
            assert by["chosen"]["x"] == [pos] and by["chosen"]["y"] == [tr.u]
            lo = tr.cdf[pos - 1][1] if pos else 0.0
            assert lo - 1e-6 <= tr.u < tr.cdf[pos][1] + 1e-6  # u falls in the chosen token's slice
    assert checked_draw and checked_greedy
    wi = eng.what_if(0, SamplingParams(temperature=1.0))
    fig = sampling.sampling_cdf_chart(wi)
    assert {t["name"]: t for t in fig["data"]}["u"]["y"] == [wi.u] * 2


# ---- detokenizer and stream -------------------------------------------------------------------------

def test_detok_table_rows_equal_detok_steps(run):
    _, events = run
    rows = [(e.step, s) for e, s in _seq_events(events) if s.seq_id == 1 and s.detok is not None]
    fig = detok.detok_table(events, 1, last_n=12)
    (tbl,) = fig["data"]
    assert tbl["type"] == "table"
    cols = tbl["cells"]["values"]
    rows = rows[-12:]
    assert cols[0] == [st for st, _ in rows]
    assert cols[1] == [s.detok.token_id for _, s in rows] == [s.new_token for _, s in rows]
    assert cols[2] == [plain(s.new_token_text) for _, s in rows]
    assert cols[3] == [s.detok.token_bytes for _, s in rows]
    assert cols[4] == [plain(s.emitted) if s.emitted else "" for _, s in rows]
    assert cols[5] == [plain(detok.held_display(s.detok)) if detok.held_display(s.detok) else ""
                       for _, s in rows]
    held = [i for i, (_, s) in enumerate(rows) if s.detok.stop_partial]
    assert held and all(cols[6][i] == plain(rows[i][1].detok.stop_partial) for i in held)
    assert "matched" in cols[6][-1]  # the stop string completed on the last row
    assert len(detok.detok_table(events, 1, last_n=3)["data"][0]["cells"]["values"][0]) == 3
    assert detok.detok_table(events, 99)["data"] == []  # unknown sequence: a placeholder


def test_stream_html_text_held_and_finish(run):
    _, events = run
    for sid in (0, 1, 2, 3):
        text = "".join(s.emitted for _, s in _seq_events(events) if s.seq_id == sid)
        out = stream.stream_html(events, sid)
        m = re.search(r'<span class="il-stream-text">(.*?)</span>', out, re.S)
        assert m and m.group(1) == text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") \
            .replace('"', "&quot;").replace("'", "&#x27;")
    # seq 1 finished on its stop string: badge, and the held " in" is gone
    out = stream.stream_html(events, 1)
    assert '<span class="il-finish il-finish-stop"' in out and ">stop<" in out and "il-held" not in out
    # after step 0 the Russian sequence holds the first byte of a Cyrillic letter
    first = events[0].seq(0).detok
    assert first.held_bytes
    out0 = stream.stream_html(events[:1], 0)
    assert 'class="il-held"' in out0 and first.held_bytes in out0 and "il-finish" not in out0
    # the stop-string prefix shows while it is held
    k = next(i for i, e in enumerate(events) if e.seq(1) and e.seq(1).detok and e.seq(1).detok.stop_partial)
    assert '<span class="il-held"' in stream.stream_html(events[: k + 1], 1)
    assert "il-stream-empty" in stream.stream_html(events, 42)


def test_stream_html_escapes_markup():
    def step(i, emitted, held, reason=None):
        detok = DetokStep(token_id=1, token_bytes="", emitted=emitted, held_text=held, held_bytes="", stop=None,
                          stop_partial=held)
        seq = SeqEvent(seq_id=5, phase="decode", chunk_start=i, num_processed=1, processed_ids=[1], num_cached_tokens=0,
                       prompt_len=1, num_tokens=i + 2, new_token=1, emitted=emitted, detok=detok,
                       finished=reason is not None, finish_reason=reason)
        return SimpleNamespace(step=i, seqs=[seq])  # stream_html reads only the sequences of each step

    evs = [step(0, "<b>x</b> & ", "<s"), step(1, "<script>", "", "eos")]
    out = stream.stream_html(evs, 5, "ru")
    assert "<b>x" not in out and "<script>" not in out
    assert "&lt;b&gt;x&lt;/b&gt; &amp; &lt;script&gt;" in out
    assert 'il-finish-eos' in out
    out = stream.stream_html(evs[:1], 5)
    assert '<span class="il-held"' in out and "&lt;s" in out


# ---- KV cache ---------------------------------------------------------------------------------------

def test_block_pool_grid_reproduces_blocks(run):
    _, events = run
    scale = kv_cache.discrete_colorscale()
    for ev in events:
        fig = kv_cache.block_pool_chart(ev)
        heat = fig["data"][0]
        assert heat["type"] == "heatmap"
        drawn = min(len(ev.blocks), len(heat["z"]) * kv_cache.COLS)
        assert all(b["state"] == "free" for b in ev.blocks[drawn:])  # what is not drawn is free
        seen = 0
        for r, row in enumerate(heat["z"]):
            for c, code in enumerate(row):
                bid = r * kv_cache.COLS + c
                if bid >= drawn:
                    assert code is None and heat["customdata"][r][c] is None
                    continue
                b = ev.blocks[bid]
                seen += 1
                assert heat["customdata"][r][c] == [b["id"], b["state"], b["refcount"],
                                                    ", ".join(map(str, b["owners"])) or "—",
                                                    "yes" if b["hashed"] else "no"]
                assert heat["text"][r][c] == (f"×{b['refcount']}" if b["refcount"] > 1 else "")
                color = scale[2 * code][1]
                if b["state"] == "used":
                    assert color == seq_color(b["owners"][0])
                elif b["state"] == "cached":
                    assert color == GREY
                else:
                    assert color == kv_cache.FREE_COLOR
        assert seen == drawn
        assert "block %{customdata[0]}" in heat["hovertemplate"] and "%{customdata[3]}" in heat["hovertemplate"]
    shared = [ev for ev in events if any(b["refcount"] > 1 for b in ev.blocks)]
    assert shared  # the prefix hit shares a block
    assert any("×2" in t for row in kv_cache.block_pool_chart(shared[0])["data"][0]["text"] for t in row)



def test_a_large_pool_draws_the_blocks_in_use_and_counts_the_rest(base_engine):
    """The room's pool (728 blocks of 16 tokens here) with one short request: the grid draws the rows in use and
    one free row after them, and a legend item counts the free blocks not drawn (it spent a screen on 3 used)."""
    from app.session import ROOM_KV_MEMORY

    eng = base_engine.session(kv_memory=ROOM_KV_MEMORY)
    eng.add_request("What is gravity?", SamplingParams(max_tokens=2, temperature=0.0))
    ev = eng.step()
    n = len(ev.blocks)
    busy = [b["id"] for b in ev.blocks if b["state"] != "free"]
    assert n > 600 and 0 < len(busy) < kv_cache.COLS
    for lang, words in (("en", "more free blocks"), ("ru", "свободных блоков")):
        fig = kv_cache.block_pool_chart(ev, lang)
        heat = fig["data"][0]
        rows = max(kv_cache.MIN_ROWS, max(busy) // kv_cache.COLS + 2)
        # a short figure, with room for a legend of three rows (a narrow window wraps it)
        assert len(heat["z"]) == rows and fig["layout"]["height"] <= 24 * rows + 160
        hidden = n - rows * kv_cache.COLS
        note = [t["name"] for t in fig["data"] if words in (t.get("name") or "")]
        assert note == [f"{'+ ' if lang == 'en' else '+ ещё '}{hidden:,} "
                        + (f"more free blocks, {rows * kv_cache.COLS}–{n - 1}, not drawn" if lang == "en" else
                           f"свободных блоков, {rows * kv_cache.COLS}–{n - 1}, не показаны")]
        ticks = fig["layout"]["yaxis"]["ticktext"]
        assert ticks[-1] == f"{(rows - 1) * kv_cache.COLS}–{rows * kv_cache.COLS - 1}"
        assert str(n) in fig["layout"]["title"]["text"]  # the title still counts the whole pool

def test_colorscale_maps_codes_to_seq_colors():
    scale = kv_cache.discrete_colorscale()
    assert scale[0][0] == 0 and scale[-1][0] == 1
    for sid in range(25):
        code = kv_cache.CODE_SEQ0 + sid % len(SEQ_COLORS)
        frac = (code + 0.5) / kv_cache.NUM_CODES  # (z - zmin) / (zmax - zmin)
        band = [c for (a, c), (b, _) in zip(scale[::2], scale[1::2]) if a <= frac < b]
        assert band == [seq_color(sid)]


def test_block_tables_rows_equal_event(run):
    _, events = run
    for ev in events:
        fig = kv_cache.block_tables_chart(ev)
        if not ev.block_tables:
            assert fig["data"] == []
            continue
        heat = fig["data"][0]
        seqs = sorted(ev.block_tables)
        assert fig["layout"]["yaxis"]["ticktext"] == [f"seq {s}" for s in seqs]
        for row, sid in zip(heat["customdata"], seqs):
            table = ev.block_tables[sid]
            assert row[: len(table)] == table and all(v is None for v in row[len(table):])
        for trow, sid in zip(heat["text"], seqs):
            assert trow[: len(ev.block_tables[sid])] == [str(b) for b in ev.block_tables[sid]]


def test_kv_memory_bars_equal_kv_bytes(run):
    _, events = run
    for ev in events:
        kv = ev.kv
        fig = kv_cache.kv_memory_chart(ev)
        rows = {}
        for tr in fig["data"]:
            for y, x in zip(tr["y"], tr["x"]):
                rows.setdefault(y, []).append((tr["name"], x))
        pool, paged, naive = "paged pool", "paged: used blocks", "naive contiguous"
        assert [x for _, x in rows[pool]] == [kv.used_bytes, kv.cached_bytes, kv.free_bytes]
        assert math.isclose(sum(x for _, x in rows[pool]), kv.pool_bytes)
        bpt = kv.bytes_per_token
        assert math.isclose(sum(x for _, x in rows[paged]), max(kv.used_bytes, kv.paged_waste_tokens * bpt))
        assert dict(rows[paged])["paged: unused slots in last blocks"] == kv.paged_waste_tokens * bpt
        assert math.isclose(sum(x for _, x in rows[naive]), kv.naive_reserved_tokens * bpt)
        assert dict(rows[naive])["naive: reserved for max_tokens, unused"] == kv.naive_waste_tokens * bpt
        assert fig["layout"]["shapes"][0]["x0"] == kv.pool_bytes


def test_kv_formula_html(run):
    _, events = run
    ev = events[-1]
    kv, f = ev.kv, ev.kv.formula
    out = kv_panel.kv_formula_html(ev)
    assert 2 * f.layers * f.kv_heads * f.head_dim * f.bytes_per_elem == kv.bytes_per_token
    assert (f"2 × {f.layers} layers × {f.kv_heads} KV heads × {f.head_dim} × {f.bytes_per_elem} B = "
            in out)
    assert f"{kv.bytes_per_token:,} B</b> per token" in out
    assert f"block of {kv.block_size} tokens = " in out and fmt_bytes(kv.block_bytes) in out
    assert fmt_bytes(kv.pool_bytes) in out
    assert f"{kv.hit_rate:.1%}" in out
    for key, value in (("prefill_saved", kv.prefix_hit_tokens), ("evictions", kv.evictions),
                       ("preemptions", kv.preemptions), ("cow_copies", kv.cow_copies)):
        assert re.search(rf'data-stat="{key}">[^<]*<b>{value:,}</b>', out)
    assert "il-kv-empty" in kv_panel.kv_formula_html(None)
    assert "слоёв" in kv_panel.kv_formula_html(ev, "ru")


# ---- timeline ---------------------------------------------------------------------------------------

def test_timeline_bars_equal_step_ms(run):
    _, events = run
    fig = timeline.timeline_chart(events)
    bars = fig["data"][0]
    assert bars["x"] == [e.step for e in events]
    assert bars["y"] == [e.timing.step_ms for e in events]
    assert bars["marker"]["color"] == [timeline.KIND_COLORS[timeline.step_kind(e)] for e in events]
    assert timeline.step_kind(events[0]) == "prefill"
    mixed = next(e for e in events if timeline.step_kind(e) == "mixed")
    hover = bars["customdata"][events.index(mixed)]
    for s in mixed.seqs:
        assert f"seq {s.seq_id}: {s.phase} {s.num_processed} tok" in hover
    assert f"forward {mixed.timing.forward_ms:.1f} ms" in hover


def _lab(colour: str) -> tuple[float, float, float]:
    """CIE L*a*b* of an sRGB "#rrggbb" (D65)."""
    lin = [(c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4)
           for c in (int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5))]
    xyz = [sum(w * c for w, c in zip(row, lin)) / n for row, n in
           (((0.4124, 0.3576, 0.1805), 0.95047), ((0.2126, 0.7152, 0.0722), 1.0), ((0.0193, 0.1192, 0.9505), 1.08883))]
    f = [v ** (1 / 3) if v > 0.008856 else 7.787 * v + 16 / 116 for v in xyz]
    return 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])


def colour_distance(a: str, b: str) -> float:
    """CIE76 ΔE: about 2 is just noticeable, 25 or more reads as another colour at a glance."""
    return math.dist(_lab(a), _lab(b))


def test_timeline_step_kinds_and_sequences_never_share_a_colour(run):
    """One key names both the sequences and the kinds of step: "mixed step" was the orange of "seq #1"."""
    _, events = run
    fig = timeline.timeline_chart(events)
    (key,) = [a for a in fig["layout"]["annotations"] if a.get("name") == "legend-key"]
    items = re.findall(r"<span style='color:([^']+)'>[^<]*</span> ([^<]+?)(?=   |<br>|$)", key["text"])
    seqs = [c for c, name in items if name.startswith("seq #")]
    kinds = [c for c, name in items if name.endswith(" step")]
    assert len(seqs) >= 2 and "mixed" in {timeline.step_kind(e) for e in events} and len(kinds) >= 3
    # every sequence colour there may be, against every kind of step the key names (and the kinds against each
    # other); an idle step, grey, has no sequence to be confused with
    for kind in (timeline.KIND_COLORS[k] for k in ("prefill", "decode", "mixed")):
        assert all(colour_distance(kind, c) >= 25 for c in SEQ_COLORS + [timeline.OTHER_COLOR]), kind
    assert all(colour_distance(a, b) >= 25 for i, a in enumerate(kinds) for b in kinds[i + 1:])


def test_latency_table_equals_seq_times(run):
    _, events = run
    fig = timeline.latency_table(events)
    cols = fig["data"][0]["cells"]["values"]
    assert "engine time" in fig["layout"]["title"]["text"]
    for i, sid in enumerate(cols[0]):
        mine = [s for _, s in _seq_events(events) if s.seq_id == sid]
        ttft = next(s.ttft_s for s in mine if s.ttft_s is not None)
        assert cols[1][i] == f"{ttft * 1000:.1f}"
        itl = [s.itl_s * 1000 for s in mine if s.itl_s is not None]
        mean_itl = sum(itl) / len(itl)
        assert cols[2][i] == f"{mean_itl:.1f}"
        assert cols[4][i] == f"{1000 / mean_itl:.1f}"
        assert cols[3][i] == sum(s.new_token is not None for s in mine)
    assert cols[5][cols[0].index(1)] == "stop"


def test_roofline_points_and_roof(run):
    _, events = run
    fig = timeline.roofline_chart(events, BW, PEAK)
    by = {t["name"]: t for t in fig["data"]}
    ran = [e for e in events if e.cost.tokens > 0]
    assert by["steps"]["x"] == [e.cost.flops / e.cost.bytes for e in ran]
    assert by["steps"]["y"] == [e.cost.flops / (e.timing.forward_ms / 1e3) for e in ran]
    assert [cd[0] for cd in by["steps"]["customdata"]] == [e.step for e in ran]
    for x, y, cd in zip(by["steps"]["x"], by["steps"]["y"], by["steps"]["customdata"]):
        assert math.isclose(cd[3], 100 * y / min(PEAK, BW * x))
    ridge = PEAK / BW
    assert by["roof"]["x"][1] == ridge
    assert by["roof"]["y"] == [min(PEAK, BW * x) for x in by["roof"]["x"]]
    assert min(by["roof"]["x"]) < min(by["steps"]["x"]) and max(by["roof"]["x"]) > max(by["steps"]["x"])
    assert fig["layout"]["xaxis"]["type"] == fig["layout"]["yaxis"]["type"] == "log"
    assert any("ridge 7.5 FLOP/B" in a["text"] for a in fig["layout"]["annotations"])
    assert timeline.roofline_chart(events, 0, PEAK)["data"] == []


# ---- pipeline ---------------------------------------------------------------------------------------

def _lit(out):
    return set(re.findall(r'class="il-stage il-lit" data-stage="(\w+)"', out))


def test_pipeline_lit_stages(run):
    _, events = run
    all8 = set(pipeline.STAGES)
    first = pipeline.pipeline_html(events[0])  # prefill, and seq 0 sampled its first token
    assert _lit(first) == all8
    pre = sum(s.num_processed for s in events[0].seqs)
    assert f"step 0 · prefill {pre} tok · {events[0].timing.step_ms:.0f} ms" in first
    dec = next(e for e in events if timeline.step_kind(e) == "decode" and len(e.seqs) > 1)
    out = pipeline.pipeline_html(dec)
    assert _lit(out) == all8 - {"template", "tokens"}
    assert f"decode {len(dec.seqs)} seqs" in out
    assert len(re.findall(r'class="il-stage( il-lit)?" data-stage=', out)) == 8 and out.count("il-arrow") == 7
    # a prefill chunk that samples nothing
    chunk = replace(events[0], step=7, admitted=[0], preempted=[], finished=[],
                    seqs=[replace(events[0].seqs[0], phase="prefill", num_processed=16, new_token=None)])
    assert _lit(pipeline.pipeline_html(chunk)) == {"template", "tokens", "embeddings", "layers", "logits"}
    assert _lit(pipeline.pipeline_html(None)) == set()
    assert "Шаблон чата" in pipeline.pipeline_html(None, "ru")


# ---- all figures ------------------------------------------------------------------------------------

@pytest.mark.parametrize("lang", ["en", "ru"])
def test_all_figures_are_plain_json_with_constant_uirevision(run, lang):
    eng, events = run
    for fig in _all_figures(eng, events, lang):
        json.dumps(fig, allow_nan=False)
        assert fig["layout"]["uirevision"].startswith("chart-")
        if fig["data"][0]["type"] != "table":
            assert "title" in fig["layout"]["xaxis"] and "title" in fig["layout"]["yaxis"]
            assert all("hovertemplate" in t or t.get("hoverinfo") == "skip" for t in fig["data"])
    replayed = [StepEvent.from_dict(e.to_dict()) for e in events]  # events built back from their JSON draw too
    for fig in (detok.detok_table(replayed, 1, lang=lang), kv_cache.block_pool_chart(replayed[-1], lang),
                kv_cache.block_tables_chart(replayed[2], lang), kv_cache.kv_memory_chart(replayed[2], lang),
                timeline.timeline_chart(replayed, lang), timeline.latency_table(replayed, lang),
                timeline.roofline_chart(replayed, BW, PEAK, lang)):
        json.dumps(fig, allow_nan=False)
        assert fig["data"]
    assert stream.stream_html(replayed, 0) == stream.stream_html(events, 0)
    assert pipeline.pipeline_html(replayed[3]) == pipeline.pipeline_html(events[3])


def test_empty_inputs_give_placeholders():
    figs = [sampling.sampling_chain_chart(None), sampling.sampling_cdf_chart(None), detok.detok_table([], 0),
            kv_cache.block_pool_chart(None), kv_cache.block_tables_chart(None), kv_cache.kv_memory_chart(None),
            timeline.timeline_chart([]), timeline.latency_table([]), timeline.roofline_chart([], BW, PEAK)]
    for fig in figs:
        assert fig["data"] == [] and fig["layout"]["annotations"][0]["text"]
        json.dumps(fig, allow_nan=False)
    uirevs = [f["layout"]["uirevision"] for f in figs]
    assert len(set(uirevs)) == len(uirevs)


def test_axis_titles_sit_at_the_margins_outer_edge():
    """common.titles_at_margin: titles of axes on the plot area's edge become annotations in their margin;
    an axis in the middle of the figure, or with a margin Plotly sizes, keeps Plotly's own title."""
    from app.charts.common import axis_title, figure, layout

    lay = layout("t", "chart-x", margin=dict(l=70, r=30, t=40, b=60),
                 xaxis=dict(title=dict(text="X"), domain=[0, 0.45]), yaxis=dict(title=dict(text="Y")),
                 yaxis2=dict(title=dict(text="Y2"), overlaying="y", side="right"),
                 xaxis3=dict(title=dict(text="X3"), anchor="y3", domain=[0.55, 1]),
                 yaxis3=dict(title=dict(text="Y3"), anchor="x3", domain=[0.5, 1]),
                 xaxis4=dict(title=dict(text="X4"), automargin=True))
    fig = figure([], lay)
    notes = {a["name"]: a for a in fig["layout"]["annotations"]}
    x, y, y2 = notes["axis-title:xaxis"], notes["axis-title:yaxis"], notes["axis-title:yaxis2"]
    assert (x["xref"], x["x"], x["yref"], x["y"], x["yshift"]) == ("x domain", 0.5, "paper", 0, -58)
    assert (y["xref"], y["x"], y["xshift"], y["yref"], y["textangle"]) == ("paper", 0, -68, "y domain", -90)
    assert (y2["x"], y2["xanchor"], y2["xshift"]) == (1, "right", 28)
    # x3 sits above the bottom (its y3 starts at 0.5), y3 starts right of the plot's left edge (x3 at 0.55)
    assert "axis-title:xaxis3" not in notes and fig["layout"]["xaxis3"]["title"]["text"] == "X3"
    assert "axis-title:yaxis3" not in notes and fig["layout"]["yaxis3"]["title"]["text"] == "Y3"
    assert "axis-title:xaxis4" not in notes and fig["layout"]["xaxis4"]["title"]["text"] == "X4"
    assert fig["layout"]["xaxis"]["title"] == {"text": ""}
    assert [axis_title(fig, a) for a in ("xaxis", "yaxis", "yaxis2", "xaxis3")] == ["X", "Y", "Y2", "X3"]


def test_sampling_chain_columns_share_one_axis_and_one_scale(run):
    """All stage columns on one x axis: each column's bars start at its origin (base), columns one scale
    (the largest probability of any stage) apart plus a gap, and ticks 0 and a round value in every column."""
    _, events = run
    s = next(s for _, s in _sampled(events) if s.seq_id == 2)  # top_k=5, min_p=0.05: renormalised stages
    fig = sampling.sampling_chain_chart(s.sampling)
    bars = [t for t in fig["data"] if t["type"] == "bar"]
    reach = max(p for st in s.sampling.stages for p in st.probs) * 1.08
    assert [b["base"] for b in bars] == pytest.approx([k * reach * (1 + sampling.COLUMN_GAP) for k in range(6)])
    assert all("xaxis" not in b for b in bars) and "xaxis2" not in fig["layout"]
    xaxis = fig["layout"]["xaxis"]
    assert xaxis["range"][1] == pytest.approx(bars[-1]["base"] + reach)
    assert xaxis["tickvals"][0::2] == [b["base"] for b in bars] and set(xaxis["ticktext"][0::2]) == {""}
    tick = xaxis["tickvals"][1] - xaxis["tickvals"][0]
    assert tick <= 0.75 * reach and xaxis["ticktext"][1] == f"{tick:.0%}"
    for b, st in zip(bars, s.sampling.stages):  # the hover reads p from customdata, x is the bar's length
        assert [c[4] for c in b["customdata"]] == st.probs and "customdata[4]" in b["hovertemplate"]
