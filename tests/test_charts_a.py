"""Chart and HTML builders for tokens, embeddings, attention, logit lens and logits, checked against REAL events.

One small run (module fixture): request A (chunked prefill: 40 + 11 tokens), request B admitted later
with a prefix-cache hit on the shared system prompt, one step with capture switched off.
"""
import json
import math
import re

import numpy as np
import pytest
import torch

from app.charts.common import EMPTY_LINE_CHARS, LABEL_CHARS, axis_title
from app.charts import attention as A
from app.charts.common import plain
from app.charts import embeddings as E
from app.charts import logits as LG
from app.charts import tokens as TK
from app.charts.common import ACCENT
from app.panels import tokens as PT
from engine import Capture, SamplingParams
from engine.sampling import SamplingTrace
from engine.tokenizer import bpe_merges, token_info

LAYER, HEAD = 3, 2


class Run:
    pass


@pytest.fixture(scope="module")
def run(base_engine):
    eng = base_engine.session(max_num_batched_tokens=40)
    r = Run()
    r.eng = eng
    eng.instrument = Capture()
    r.a = eng.add_request("Что такое гравитация? <script>", SamplingParams(max_tokens=6, temperature=0.7, seed=1))
    r.events = [eng.step() for _ in range(3)]
    r.b = eng.add_request("Что такое гравитация? Коротко.", SamplingParams(max_tokens=4, temperature=0.0, seed=2))
    for i in range(4):
        eng.instrument = None if i == 2 else Capture()  # step 5: capture off
        r.events.append(eng.step())
    r.off_step = 5
    for sid in (r.a, r.b):
        seq = eng.sequences[sid]
        setattr(r, f"ids_{sid}", seq.prompt_ids + seq.output_ids)
    r.texts = {sid: [eng.token_text(t) for t in getattr(r, f"ids_{sid}")] for sid in (r.a, r.b)}
    return r


def captured(run, sid):
    return [(e.step, e.seq(sid)) for e in run.events if e.seq(sid) is not None and e.seq(sid).capture is not None]


def valid(fig):
    """JSON-safe (no NaN) and accepted by plotly's own schema validation."""
    import plotly.graph_objects as go

    json.dumps(fig, allow_nan=False)
    go.Figure(fig)
    return fig


def is_empty(fig):
    return fig["data"] == [] and fig["layout"]["annotations"] and fig["layout"]["annotations"][0]["text"]


def test_the_run_has_the_cases_we_want(run):
    a0 = run.events[0].seq(run.a)
    assert a0.phase == "prefill" and a0.num_processed == 40  # chunked
    b_pre = next(e.seq(run.b) for e in run.events if e.seq(run.b) is not None)
    assert b_pre.num_cached_tokens > 0 and b_pre.chunk_start == b_pre.num_cached_tokens  # prefix-cache hit
    assert run.events[run.off_step].seq(run.a).capture is None


# a sampling trace that tracked no tokens
NO_TOKENS = SamplingTrace(token_ids=[], token_texts=[], stages=[], u=0.0, chosen=0, chosen_prob=0.0, chosen_rank=0,
                          greedy=True, params={}, cdf=[])


def test_empty_before_any_step(run):
    t = run.texts[run.a]
    figs = [A.attention_heatmap([], 0, 0, 0, t), A.attention_heads_grid([], 0, 0, t), A.head_entropy_chart([], 0),
            A.logit_lens_chart([], 0), E.embedding_pca([], 0, t), E.neighbours_chart([], "x"),
            LG.logits_chart(None, None), LG.logits_chart(NO_TOKENS, None), LG.perplexity_chart([], 0),
            TK.bytes_per_token_chart([], 0)]
    for f in figs:
        valid(f)
        assert is_empty(f)
        assert f["layout"]["uirevision"]
        # the message is broken into lines that fit a half-width panel
        assert all(len(line) <= EMPTY_LINE_CHARS for line in f["layout"]["annotations"][0]["text"].split("<br>"))
    note = A.attention_heatmap([], 0, 0, 0, t)["layout"]["annotations"][0]["text"]
    assert "Nothing captured yet" in note.replace("<br>", " ")
    # a run whose every step had capture off draws nothing either
    off = [run.events[run.off_step]]
    assert is_empty(A.attention_heatmap(off, run.a, LAYER, HEAD, t))
    assert is_empty(A.logit_lens_chart(off, run.a))
    assert is_empty(E.embedding_pca(off, run.a, t))
    # an unknown sequence
    assert is_empty(A.head_entropy_chart(run.events, 99))


def test_attention_matrix_stitches_prefill_chunks_and_decode_rows(run):
    m, filled = A.attention_matrix(run.events, run.a, LAYER, HEAD)
    last = run.events[-1].seq(run.a)
    T = last.chunk_start + last.num_processed
    assert m.shape == (T, T)
    for step, s in captured(run, run.a):
        block = s.capture.attention[LAYER][HEAD].numpy()  # [rows, ctx]
        for i, p in enumerate(s.capture.positions):
            np.testing.assert_array_equal(m[p, : p + 1], block[i, : p + 1])
            assert np.all(m[p, p + 1:] == 0)
    off_pos = run.events[run.off_step].seq(run.a).chunk_start
    assert np.isnan(m[off_pos]).all() and off_pos not in filled
    assert filled == [p for p in range(T) if p != off_pos]
    np.testing.assert_allclose(np.nansum(m[filled], axis=1), 1.0, atol=1e-4)
    # B: the prefix-cache hit was never computed for B, so its rows are NaN
    mb, filled_b = A.attention_matrix(run.events, run.b, LAYER, HEAD)
    cached = next(e.seq(run.b) for e in run.events if e.seq(run.b) is not None).num_cached_tokens
    assert np.isnan(mb[:cached]).all() and min(filled_b) == cached


def test_attention_heatmap_values_labels_and_highlight(run):
    texts = run.texts[run.a]
    fig = valid(A.attention_heatmap(run.events, run.a, LAYER, HEAD, texts))
    (tr,) = fig["data"]
    z = tr["z"]
    n = len(z)
    dec = run.events[-1].seq(run.a)
    p = dec.capture.positions[0]
    assert n == p + 1
    row = dec.capture.attention[LAYER][HEAD, 0, :].numpy()
    np.testing.assert_allclose(np.array(z[p], dtype=float), row, atol=5.1e-5)
    pre = run.events[0].seq(run.a).capture.attention[LAYER][HEAD].numpy()  # prefill block [40, 40]
    for i in range(pre.shape[0]):
        np.testing.assert_allclose(np.array(z[i][: i + 1], dtype=float), pre[i, : i + 1], atol=5.1e-5)
        assert all(v is None for v in z[i][i + 1:])  # keys after the query: blank
    off_pos = run.events[run.off_step].seq(run.a).chunk_start
    assert all(v is None for v in z[off_pos])
    assert tr["y"] == tr["x"] == [f"{q} {plain(texts[q])}" for q in range(n)]
    assert len(set(tr["y"])) == n  # repeated tokens keep their own rows
    assert fig["layout"]["yaxis"]["range"] == [n - 0.5, -0.5]  # the first query on top (tests/test_charts_truth.py)
    assert "→" in tr["hovertemplate"] and "%{z" in tr["hovertemplate"]
    (shape,) = fig["layout"]["shapes"]
    assert shape["y0"] == n - 1.5 and shape["y1"] == n - 0.5
    assert fig["layout"]["uirevision"] == "attention-heatmap"
    assert axis_title(fig, "xaxis") and axis_title(fig, "yaxis")
    # a window of the last 20 positions
    m, _ = A.attention_matrix(run.events, run.a, LAYER, HEAD)
    small = valid(A.attention_heatmap(run.events, run.a, LAYER, HEAD, texts, max_positions=20))
    zs = np.array([[np.nan if v is None else v for v in r] for r in small["data"][0]["z"]])
    assert zs.shape == (20, 20)
    want = np.where(np.tril(np.ones((20, 20), bool)), m[-20:, -20:], np.nan)
    np.testing.assert_allclose(zs, want, atol=5.1e-5)
    assert small["data"][0]["y"][0].startswith(f"{n - 20} ")
    assert "20" in small["layout"]["title"]["text"]
    # a layer that was never captured
    assert is_empty(A.attention_heatmap(run.events, run.a, 999, 0, texts))


def test_attention_heads_grid(run):
    texts = run.texts[run.a]
    fig = valid(A.attention_heads_grid(run.events, run.a, LAYER, texts, max_positions=24))
    heads = run.eng.spec.num_heads
    (tr,) = fig["data"]  # one heatmap: every head a block of it
    lay = fig["layout"]
    assert "coloraxis" in lay and lay["coloraxis"]["colorbar"]
    assert tr["coloraxis"] == "coloraxis" and "colorbar" not in tr and not tr.get("showscale")
    z = np.array([[np.nan if v is None else v for v in r] for r in tr["z"]])
    cols = math.ceil(math.sqrt(heads))
    n, gc, gr = 24, A.GRID_GAP_COLS, A.GRID_GAP_ROWS
    assert z.shape == (math.ceil(heads / cols) * (n + gr) - gr, cols * (n + gc) - gc)
    seen = np.zeros(z.shape, bool)
    for k in range(heads):
        r, c = divmod(k, cols)
        block = (slice(r * (n + gr), r * (n + gr) + n), slice(c * (n + gc), c * (n + gc) + n))
        m, _ = A.attention_matrix(run.events, run.a, LAYER, k)
        want = np.where(np.tril(np.ones((n, n), bool)), m[-n:, -n:], np.nan)
        np.testing.assert_allclose(z[block], want, atol=5.1e-5)
        seen[block] = True
        # a block's hover names its query and key positions (the zero-width suffix keeps blocks apart)
        T = m.shape[0]
        labels = [A.pos_label(p, texts) for p in range(T - n, T)]
        assert [y.rstrip("\u200b") for y in tr["y"][block[0]]] == labels
        assert [x.rstrip("\u200b") for x in tr["x"][block[1]]] == labels
    assert np.isnan(z[~seen]).all()  # the gaps between blocks are empty
    assert len(set(tr["x"])) == len(tr["x"]) and len(set(tr["y"])) == len(tr["y"])  # distinct categories
    assert [a["text"] for a in lay["annotations"]] == [f"head {h}" for h in range(heads)]


def test_head_entropy_of_the_newest_query(run):
    fig = valid(A.head_entropy_chart(run.events, run.a))
    (tr,) = fig["data"]
    cap = run.events[-1].seq(run.a).capture
    L = run.eng.spec.num_layers
    assert tr["y"] == list(range(L)) and tr["x"] == list(range(run.eng.spec.num_heads))
    for layer in (0, LAYER, L - 1):
        p = cap.attention[layer][:, 0, :].double()
        ent = -(p * torch.log2(p.clamp_min(1e-300))).sum(-1)
        np.testing.assert_allclose(tr["z"][layer], ent.numpy(), atol=1e-3)
    assert str(cap.positions[0]) in fig["layout"]["title"]["text"]
    assert tr["zmax"] == pytest.approx(math.log2(cap.positions[0] + 1))


def test_logit_lens_accumulates_positions_latest_wins(run):
    texts = run.texts[run.a]
    fig = valid(A.logit_lens_chart(run.events, run.a, texts=texts))
    (tr,) = fig["data"]
    expect = {}
    for _, s in captured(run, run.a):
        for j, p in enumerate(s.capture.lens_positions):
            expect[p] = (s.capture.lens_probs[:, j, :].numpy(), [layer[j] for layer in s.capture.lens_tokens])
    positions = sorted(expect)
    assert tr["x"] == [A.pos_label(p, texts) for p in positions]
    L = run.eng.spec.num_layers
    assert tr["y"] == list(range(L))  # numeric: layer 0 at the bottom
    for j, p in enumerate(positions):
        probs, toks = expect[p]
        for layer in range(L):
            assert tr["z"][layer][j] == pytest.approx(float(probs[layer, 0]), abs=1e-5)
            # the top-1 token is written where it differs from the layer below, and in the first and last layer
            top1 = plain(toks[layer][0])
            written = layer in (0, L - 1) or toks[layer][0] != toks[layer - 1][0]
            assert tr["text"][layer][j] == (top1 if written else "")
            for tok in toks[layer]:
                assert plain(tok) in tr["customdata"][layer][j]
    # the last layer's lens is the model's real distribution: its top-1 is the greedy choice
    last = run.events[-1].seq(run.a)
    assert tr["z"][L - 1][-1] == pytest.approx(max(last.sampling.stages[0].probs), abs=1e-4)
    small = A.logit_lens_chart(run.events, run.a, max_positions=3)
    assert small["data"][0]["x"] == [str(p) for p in positions[-3:]]


def key_items(fig) -> list[tuple[str, str]]:
    """(colour, name) of each item of a chart's legend key (common.legend_key)."""
    (key,) = [a for a in fig["layout"]["annotations"] if a.get("name") == "legend-key"]
    return re.findall(r"<span style='color:([^']+)'>[^<]*</span> ([^<]+?)(?=   |<br>|$)", key["text"])


def test_logits_chart_matches_the_sampling_trace(run):
    for sid, step in ((run.a, 2), (run.b, len(run.events) - 1)):
        s = run.events[step].seq(sid)
        smp, stats = s.sampling, s.logit_stats
        fig = valid(LG.logits_chart(smp, stats))
        raw = next(st for st in smp.stages if st.name == "logits")
        logit_bar, prob_bar, final_bar = fig["data"]
        assert logit_bar["x"] == raw.logits and prob_bar["x"] == raw.probs
        assert final_bar["x"] == smp.stages[-1].probs
        assert logit_bar["xaxis"] == "x" and prob_bar["xaxis"] == "x2"
        assert [c[0] for c in prob_bar["customdata"]] == smp.token_ids  # clicking a bar forces this id
        k = smp.token_ids.index(smp.chosen)
        colors = logit_bar["marker"]["color"]
        assert colors[k] == ACCENT and colors.count(ACCENT) == 1
        for bar in (logit_bar, prob_bar, final_bar):
            widths = bar["marker"]["line"]["width"]
            assert widths[k] > 0 and sum(1 for w in widths if w) == 1
        (band,) = fig["layout"]["shapes"]
        assert band["y0"] == k - 0.5 and band["y1"] == k + 0.5
        ticks = fig["layout"]["yaxis"]["ticktext"]
        assert ticks == [LG.id_label(x, i) for x, i in zip(smp.token_texts, smp.token_ids)]
        assert all(tick.startswith(plain(x)) for tick, x in
                   zip(ticks, smp.token_texts))
        title = fig["layout"]["title"]["text"]
        assert f"{stats.entropy:.2f} nats" in title and f"{stats.entropy / math.log(2):.2f} bits" in title
        assert f"rank {smp.chosen_rank + 1}" in title and f"{smp.chosen_prob:.3f}" in title
        # the key names the probability bars in their colours
        assert key_items(fig) == [(b["marker"]["color"], b["name"]) for b in (prob_bar, final_bar)]
    ru = LG.logits_chart(smp, stats, lang="ru")
    assert ru["layout"]["title"]["text"] != fig["layout"]["title"]["text"]


def test_ranks_are_counted_from_one(run):
    """The page counts ranks as a reader does: the token with the highest raw logit is rank 1 (it read "raw rank
    0"). Checked on request B's greedy steps against the raw logits the engine traced."""
    from app.charts import sampling as SM
    tops = 0
    for e in run.events:
        sev = e.seq(run.b)
        if sev is None or sev.sampling is None:
            continue
        smp = sev.sampling
        raw = dict(zip(smp.token_ids, smp.stages[0].logits))  # the tracked tokens: the top ones by raw logit
        ahead = sum(1 for t, x in raw.items() if x > raw[smp.chosen])
        assert smp.chosen_rank == ahead  # the engine counts the tokens ahead of the chosen one
        lg = LG.logits_chart(smp, sev.logit_stats)["layout"]["title"]["text"]
        chain = SM.sampling_chain_chart(smp)["layout"]["title"]["text"]
        assert f"rank {ahead + 1}," in lg and f"raw rank {ahead + 1})" in chain
        tops += raw[smp.chosen] == max(raw.values())
    assert tops  # greedy: the top token, shown as rank 1
    ru = LG.logits_chart(smp, sev.logit_stats, lang="ru")["layout"]["title"]["text"]
    assert f"ранг {ahead + 1}," in ru


def test_perplexity_chart(run):
    fig = valid(LG.perplexity_chart(run.events, run.a))
    bars, expected, running = fig["data"]
    evs = [e.seq(run.a) for e in run.events if e.seq(run.a) is not None and e.seq(run.a).new_token is not None]
    lp = [s.logit_stats.token_logprob for s in evs]
    assert bars["y"] == pytest.approx(lp)
    assert bars["x"] == list(range(len(lp)))
    assert expected["y"] == pytest.approx([-s.logit_stats.entropy for s in evs])
    want = np.exp(-np.cumsum(lp) / np.arange(1, len(lp) + 1))
    assert running["y"] == pytest.approx(want.tolist()) and running["yaxis"] == "y2"
    assert [c[0] for c in bars["customdata"]] == [LG.id_label(s.new_token_text, s.new_token) for s in evs]
    colours = [bars["marker"]["color"], expected["line"]["color"], running["line"]["color"]]
    assert key_items(fig) == list(zip(colours, [t["name"] for t in fig["data"]]))


def test_perplexity_drops_tokens_after_a_rewind():
    from engine.events import LogitStats, SeqEvent, StepEvent

    def step(i, k, lp):
        s = SeqEvent(seq_id=0, phase="decode", chunk_start=10 + k, num_processed=1, processed_ids=[1],
                     num_cached_tokens=0, prompt_len=10, num_tokens=11 + k, new_token=5, new_token_text="x",
                     logit_stats=LogitStats(entropy=1.0, max_logit=0.0, logsumexp=0.0, token_logprob=lp, token_rank=0))
        return StepEvent(step=i, seqs=[s], admitted=[], preempted=[], finished=[], waiting=[], running=[0], kv={},
                         blocks=[], block_tables={}, timing={}, cost={})

    evs = [step(0, 0, -1.0), step(1, 1, -2.0), step(2, 2, -3.0), step(3, 1, -0.5)]  # rewound to 1 output
    pts = LG.token_logprobs(evs, 0)
    assert [(p["index"], p["logprob"]) for p in pts] == [(0, -1.0), (1, -0.5)]


def test_embedding_pca_reproduces_the_projection(run):
    texts = run.texts[run.a]
    fig = valid(E.embedding_pca(run.events, run.a, texts))
    rows = {}
    for _, s in captured(run, run.a):
        for i, p in enumerate(s.capture.positions):
            rows[p] = s.capture.embeddings[i].double().numpy()
    positions = sorted(rows)
    x = np.stack([rows[p] for p in positions])
    # independent: eigenvectors of the covariance
    xc = x - x.mean(0)
    w, v = np.linalg.eigh(xc.T @ xc)
    order = np.argsort(w)[::-1][:2]
    ref = xc @ v[:, order]
    pts = {}
    newest = set(positions[-E.PCA_LABELS:])
    for tr in fig["data"]:
        for px, py, (pos,), hover, label in zip(tr["x"], tr["y"], tr["customdata"], tr["hovertext"], tr["text"]):
            pts[pos] = (px, py)
            assert hover == plain(texts[pos])
            # only the newest tokens are written next to their point
            assert label == (hover if pos in newest else "")
    assert sorted(pts) == positions and len(positions) > E.PCA_LABELS
    assert key_items(fig) == [(tr["marker"]["color"], tr["name"]) for tr in fig["data"]]
    got = np.array([pts[p] for p in positions])
    for c in range(2):
        sign = np.sign(got[:, c] @ ref[:, c])
        np.testing.assert_allclose(got[:, c], sign * ref[:, c], atol=1e-3)
    # the squared distances kept equal the variance along the two components
    assert (got ** 2).sum() == pytest.approx(w[order].sum(), rel=1e-4)
    n_prompt = run.events[0].seq(run.a).prompt_len
    prompt_tr, gen_tr = fig["data"]
    assert all(p < n_prompt for (p,) in prompt_tr["customdata"]) and all(p >= n_prompt for (p,) in gen_tr["customdata"])
    ratio = w[order] / w.sum()
    assert f"{100 * ratio[0]:.1f}%" in axis_title(fig, "xaxis")
    assert f"{100 * ratio[1]:.1f}%" in axis_title(fig, "yaxis")


def test_pca_small_inputs():
    c, r = E.pca_2d(np.ones((1, 4)))
    assert c.shape == (1, 2) and not c.any()
    c, r = E.pca_2d(np.array([[0.0, 0.0], [2.0, 0.0]]))
    assert np.allclose(np.abs(c[:, 0]), 1.0) and r[0] == pytest.approx(1.0)


def test_neighbours_chart(run):
    tid = run.eng.sequences[run.a].prompt_ids[-5]
    nb = run.eng.nearest_tokens(tid, 6)
    fig = valid(E.neighbours_chart(nb, run.eng.token_text(tid)))
    (tr,) = fig["data"]
    assert tr["x"] == pytest.approx([c for _, _, c in nb])
    assert tr["customdata"] == [i for i, _, _ in nb]
    assert all(lab.endswith(f"#{i}") for lab, (i, _, _) in zip(tr["y"], nb))
    assert tr["orientation"] == "h"
    # a long token is cut on the axis (the margin is fixed) and whole in the hover
    (long,) = E.neighbours_chart([(7, "x" * 30, 0.5)], "b")["data"]
    assert long["y"] == ["x" * (LABEL_CHARS - 1) + "…  #7"] and long["hovertext"] == ["x" * 30 + "  #7"]


def test_bytes_per_token_chart(run):
    ids = getattr(run, f"ids_{run.a}")
    infos = token_info(run.eng.tokenizer, ids)
    n_prompt = len(run.eng.sequences[run.a].prompt_ids)
    fig = valid(TK.bytes_per_token_chart(infos, n_prompt))
    seen = {}
    for tr in fig["data"]:
        for x, y, cd in zip(tr["x"], tr["y"], tr["customdata"]):
            seen[x] = (tr["name"], y, cd[0])
    assert sorted(seen) == list(range(len(ids)))
    for i, info in enumerate(infos):
        name, y, tid = seen[i]
        assert tid == info["id"] and y == len(info["bytes_hex"].split())
        assert name == ("special" if info["special"] else "prompt" if i < n_prompt else "generated")
    assert {tr["name"] for tr in fig["data"]} == {"prompt", "special", "generated"}


def test_template_html_escapes_and_marks_specials(run):
    r = run.eng.encode("Что такое гравитация? <script>alert(1)</script>")
    out = PT.template_html(r.text, r.spans)
    assert "<script>" not in out and "&lt;script&gt;" in out
    assert out.count('class="il-special"') == sum(1 for s in r.spans if s["kind"] == "special")
    assert "⏎</span><br>" in out and "\n" not in out
    assert "&lt;|im_start|&gt;" in out
    implicit = PT.template_html("ab", [{"start": 0, "end": 0, "kind": "special", "token_start": 0, "token_end": 1},
                                       {"start": 0, "end": 2, "kind": "text", "token_start": 1, "token_end": 2}])
    assert "il-special-implicit" in implicit and implicit.endswith("ab</div>")
    assert "il-empty" in PT.template_html("", [])
    assert PT.template_html("x", [], lang="ru") == PT.template_html("x", [])


def test_token_chips_html(run):
    seq = run.eng.sequences[run.a]
    ids = seq.prompt_ids + seq.output_ids
    infos = token_info(run.eng.tokenizer, ids)
    evil = {"id": 7, "piece": "<script>", "text": "<script>", "bytes_hex": "3c 73 63 72 69 70 74 3e",
            "special": False, "byte_fallback": False, "partial_utf8": False}
    out = PT.token_chips_html(infos + [evil], len(seq.prompt_ids))
    assert "<script>" not in out and "&lt;script&gt;" in out
    assert out.count('class="il-chip ') == len(ids) + 1
    for i, tid in enumerate(ids):
        assert f'data-token-id="{tid}" data-pos="{i}"' in out
    assert out.count("il-generated") == len(seq.output_ids) + 1
    n_p = len(seq.prompt_ids)
    for g, tid in enumerate(seq.output_ids):
        assert f'data-token-id="{tid}" data-pos="{n_p + g}" data-gen-index="{g}"' in out
    assert out.count("data-gen-index") == len(seq.output_ids) + 1
    assert out.count("il-special") == sum(i["special"] for i in infos)
    assert ("il-partial" in out) == any(i["partial_utf8"] for i in infos)
    assert 'title="id 1 · pos 0 · bytes 3c 7c' in out
    # the counts of the prompt alone are those of the rendered text
    prompt_only = PT.token_chips_html(infos[: len(seq.prompt_ids)], len(seq.prompt_ids))
    text = seq.prompt_text
    nbytes = len(text.encode("utf-8"))
    assert f"{len(text)} characters · {nbytes} UTF-8 bytes · {len(seq.prompt_ids)} tokens" in prompt_only
    assert f"{nbytes / len(seq.prompt_ids):.2f} bytes per token" in prompt_only
    assert "il-empty" in PT.token_chips_html([], 0)
    assert "символов" in PT.token_chips_html(infos, len(seq.prompt_ids), lang="ru")


def test_bpe_merges_html(run):
    steps = bpe_merges(run.eng.tokenizer, " gravity")
    out = PT.bpe_merges_html(steps)
    assert out.count('<tr class="il-bpe-row">') == len(steps)
    assert out.count("il-sym-new") >= 2 * (len(steps) - 1)  # in the merge cell and among the symbols
    assert "␣gravity" in out
    evil = [{"step": 0, "merge": None, "rank": None, "symbols": ["<", "script>"], "pieces": ["<", "script>"],
             "ids": [1, None]},
            {"step": 1, "merge": ["<", "script>"], "rank": 3, "symbols": ["<script>"], "pieces": ["<script>"],
             "ids": [None]}]
    out = PT.bpe_merges_html(evil)
    assert "<script>" not in out and "&lt;script&gt;" in out
    assert "il-empty" in PT.bpe_merges_html([])


def test_every_chart_in_russian(run):
    texts = run.texts[run.a]
    s = run.events[2].seq(run.a)
    infos = token_info(run.eng.tokenizer, getattr(run, f"ids_{run.a}"))
    pairs = [(lambda lang: A.attention_heatmap(run.events, run.a, LAYER, HEAD, texts, lang)),
             (lambda lang: A.attention_heads_grid(run.events, run.a, LAYER, texts, lang)),
             (lambda lang: A.head_entropy_chart(run.events, run.a, lang)),
             (lambda lang: A.logit_lens_chart(run.events, run.a, lang)),
             (lambda lang: E.embedding_pca(run.events, run.a, texts, lang)),
             (lambda lang: E.neighbours_chart([(5, "a", 0.5)], "b", lang)),
             (lambda lang: LG.logits_chart(s.sampling, s.logit_stats, lang)),
             (lambda lang: LG.perplexity_chart(run.events, run.a, lang)),
             (lambda lang: TK.bytes_per_token_chart(infos, 10, lang)),
             (lambda lang: A.attention_heatmap([], 0, 0, 0, texts, lang))]
    for make in pairs:
        en, ru = make("en"), valid(make("ru"))
        assert ru["layout"]["title"]["text"] != en["layout"]["title"]["text"] or \
            ru["layout"]["annotations"] != en["layout"]["annotations"]
        assert make("xx") == en  # unknown language: English
