"""Issue 13's chart fixes, checked against REAL engine events: a forced token named and marked in every chart
that shows the step (item 3), one detokenizer row per token of a speculative round (item 9), long block
tables wrapped (item 8), the rounds and sampling charts' y axes fixed top-down (item 13), the perplexity
title's units and "seq #0 finished" (item 13).
"""
from __future__ import annotations

import json
import math
import re

import pytest

from app.charts import detok, kv_cache, logits, sampling, speculative
from app.charts.common import plain
from app.i18n import texts
from app.panels import pipeline
from app.panels import tokens as token_panels
from engine import SamplingParams, SpeculativeConfig
from engine.speculative import SpecRound
from engine.tokenizer import DetokStep, token_info

EXTRACTIVE = ("Repeat the following text exactly: The quick brown fox jumps over the lazy dog, "
              "and the dog keeps sleeping.")
FAR_TOKEN = 30000  # forced where the model would never put it: not among the tokens a trace tracks


def flat(title: str) -> str:
    """A title as one line: the charts wrap long titles at spaces (app/charts/common.py wrap_title)."""
    return re.sub(r"\s+", " ", title.replace("<br>", " "))


def valid(fig):
    """JSON-safe (no NaN) and accepted by plotly's own schema validation."""
    import plotly.graph_objects as go

    json.dumps(fig, allow_nan=False)
    go.Figure(fig)
    return fig


@pytest.fixture(scope="module")
def forced_run(base_engine):
    """A sampled first token; the same position again with its 3rd-ranked token forced (so the forced token is
    among the tracked ones); then FAR_TOKEN forced; then an ordinary step."""
    eng = base_engine.session()
    sid = eng.add_request("What is gravity?", SamplingParams(max_tokens=8, temperature=0.8, seed=1), chat=True)
    events = [eng.step()]
    first = events[-1].seq(sid).sampling
    near = next(t for t in first.token_ids[2:] if t != first.chosen)
    eng.rewind(sid, 0)  # the same context again: the same distribution, so `near` is tracked again
    eng.force_token(sid, near)
    events.append(eng.step())
    eng.force_token(sid, FAR_TOKEN)
    events.append(eng.step())
    events.append(eng.step())
    infos = token_info(base_engine.tokenizer, list(eng.seq_view(sid).token_ids))
    return dict(eng=eng, sid=sid, events=events, near=near, infos=infos,
                prompt_len=events[0].seq(sid).prompt_len)


def _sev(run, i):
    return run["events"][i].seq(run["sid"])


# ---- item 3: a forced token ---------------------------------------------------------------------------------

def test_forced_of_reads_the_event(forced_run):
    sev = _sev(forced_run, 1)
    assert sev.forced and sev.new_token == forced_run["near"] != sev.sampling.chosen
    f = logits.forced_of(sev)
    assert (f.token, f.text) == (sev.new_token, sev.new_token_text)
    assert f.logprob == sev.logit_stats.token_logprob and f.rank == sev.logit_stats.token_rank
    assert logits.forced_of(_sev(forced_run, 0)) is None and logits.forced_of(_sev(forced_run, 3)) is None


def test_logits_chart_names_the_forced_token_and_what_would_have_been_sampled(forced_run):
    sev = _sev(forced_run, 1)
    smp, f = sev.sampling, logits.forced_of(sev)
    tx = texts("logits", "en")
    fig = valid(logits.logits_chart(smp, sev.logit_stats, forced=f))
    title = flat(fig["layout"]["title"]["text"])
    ids = list(smp.token_ids)
    chosen_label = logits.id_label(smp.token_texts[ids.index(smp.chosen)], smp.chosen)
    assert f"forced «{f.label()}» (id {f.token})" in title
    assert f"would have sampled «{chosen_label}»" in title
    assert f"p = {math.exp(f.logprob):.3f}" in title and f"rank {f.rank + 1}" in title  # counted from 1
    logit_bars = fig["data"][0]
    colors = logit_bars["marker"]["color"]
    assert colors[ids.index(f.token)] == logits.FORCED_COLOR and colors[ids.index(smp.chosen)] == logits.CHOSEN_COLOR
    roles = {c[0]: c[2] for c in logit_bars["customdata"]}
    assert roles[f.token] == f" · {tx['key_forced']}" and roles[smp.chosen] == f" · {tx['key_would']}"
    (band,) = fig["layout"]["shapes"]  # behind the forced row, the one emitted
    assert band["y0"] == ids.index(f.token) - 0.5
    key = fig["layout"]["annotations"][0]["text"]
    assert tx["key_forced"] in key and tx["key_would"] in key
    # not forced: the sample is "chosen", no purple anywhere
    plain_fig = logits.logits_chart(smp, sev.logit_stats)
    assert "would have" not in plain_fig["layout"]["title"]["text"]
    assert logits.FORCED_COLOR not in json.dumps(plain_fig)


def test_a_forced_token_outside_the_tracked_ones_is_named_with_its_probability(forced_run):
    sev = _sev(forced_run, 2)
    f = logits.forced_of(sev)
    assert f.token == FAR_TOKEN and FAR_TOKEN not in sev.sampling.token_ids
    title = flat(logits.logits_chart(sev.sampling, sev.logit_stats, forced=f)["layout"]["title"]["text"])
    assert f"forced «{f.label()}»" in title and texts("logits", "en")["not_shown"] in title
    assert f"p = {math.exp(f.logprob):.1e}" in title  # too small for three decimals
    cdf = valid(sampling.sampling_cdf_chart(sev.sampling, forced=f))
    notes = flat(" ".join(a["text"] for a in cdf["layout"]["annotations"]))
    assert texts("sampling", "en")["forced_outside"].format(tok=f.label()) in notes
    assert "forced" not in [t["name"] for t in cdf["data"]]


def test_sampling_chain_marks_the_forced_row_and_calls_the_pick_would_have_sampled(forced_run):
    sev = _sev(forced_run, 1)
    smp, f = sev.sampling, logits.forced_of(sev)
    tx = texts("sampling", "en")
    fig = valid(sampling.sampling_chain_chart(smp, forced=f))
    title = flat(fig["layout"]["title"]["text"])
    assert f"forced «{f.label()}»" in title and "would have sampled «" in title
    ids = list(smp.token_ids)
    k = ids.index(f.token)
    (band,) = fig["layout"]["shapes"]
    assert (band["y0"], band["y1"]) == (k - 0.5, k + 0.5)
    hover = fig["data"][-1]["customdata"]
    assert tx["forced"] in hover[k][3] and tx["would"] in hover[ids.index(smp.chosen)][3]
    # the pick is still the red bar of the last stage: the chain's own facts stay as they were
    assert fig["data"][-1]["marker"]["color"][ids.index(smp.chosen)] == sampling.ACCENT
    plain_fig = sampling.sampling_chain_chart(smp)
    assert "forced" not in plain_fig["layout"]["title"]["text"] and "shapes" not in plain_fig["layout"]


def test_cdf_marks_the_forced_slice(forced_run):
    sev = _sev(forced_run, 1)
    smp, f = sev.sampling, logits.forced_of(sev)
    tx = texts("sampling", "en")
    fig = valid(sampling.sampling_cdf_chart(smp, forced=f))
    traces = {t["name"]: t for t in fig["data"]}
    order = [t for t, _ in smp.cdf]
    assert f.token in order  # the 3rd-ranked token survives temperature 0.8 without top-k/p
    k = order.index(f.token)
    interval = traces["interval"]
    assert interval["marker"]["color"][k] == logits.FORCED_COLOR
    assert traces["forced"]["x"] == [k]
    lo, hi = interval["base"][k], interval["base"][k] + interval["y"][k]
    assert lo <= traces["forced"]["y"][0] <= hi
    assert tx["would"] in traces["chosen"]["hovertemplate"]
    title = flat(fig["layout"]["title"]["text"])
    assert tx["forced_title"].format(tok=f.label()) in title and "would have sampled" in title


def test_detok_table_and_chips_mark_forced_tokens(forced_run):
    run = forced_run
    events, sid = run["events"], run["sid"]
    assert detok.forced_indices(events, sid) == {0, 1}  # the rewound token 0 was forced again, then token 1
    fig = valid(detok.detok_table(events, sid))
    cells = fig["data"][0]["cells"]
    suffix = f" {texts('detok', 'en')['forced']}"
    rows = detok.token_rows(events, sid)
    assert [r.forced for r in rows] == [False, True, True, False]
    assert cells["values"][2] == [plain(r.text) + (suffix if r.forced else "") for r in rows]
    assert [c == detok.FORCED_FILL for c in cells["fill"]["color"][2]] == [r.forced for r in rows]
    html = token_panels.token_chips_html(run["infos"], run["prompt_len"], forced={0, 1})
    forced_chips = re.findall(r'class="[^"]*il-forced[^"]*"[^>]*data-gen-index="(\d+)"', html)
    assert forced_chips == ["0", "1"]
    assert texts("tokens", "en")["forced_count"].format(n=2) in html
    assert "il-forced" not in token_panels.token_chips_html(run["infos"], run["prompt_len"])


def test_forced_marks_speak_russian(forced_run):
    sev = _sev(forced_run, 1)
    f = logits.forced_of(sev)
    for fig in (logits.logits_chart(sev.sampling, sev.logit_stats, "ru", forced=f),
                sampling.sampling_chain_chart(sev.sampling, lang="ru", forced=f),
                sampling.sampling_cdf_chart(sev.sampling, "ru", forced=f)):
        title = flat(fig["layout"]["title"]["text"])
        assert "навяз" in title and "forced" not in title and "would" not in title


def test_sampling_and_logits_rows_run_top_down_by_an_explicit_range(forced_run):
    """autorange "reversed" is dropped by Plotly.react over a placeholder of the same uirevision (the page's
    first figure): the order must be in the range itself."""
    sev = _sev(forced_run, 0)
    n = len(sev.sampling.token_ids)
    for fig in (sampling.sampling_chain_chart(sev.sampling), logits.logits_chart(sev.sampling, sev.logit_stats)):
        y = fig["layout"]["yaxis"]
        assert y["range"] == [n - 0.5, -0.5] and y["autorange"] is False


def test_attention_queries_run_top_down_by_an_explicit_range(base_engine):
    """The heatmap's own placeholder ("nothing captured yet") shares its uirevision: drawn over it, a heatmap
    with autorange "reversed" came out upside down (the causal triangle turned over)."""
    from app.charts import attention
    from engine import Capture

    eng = base_engine.session()
    eng.instrument = Capture()
    sid = eng.add_request("Hi there", SamplingParams(max_tokens=2, temperature=0.0), chat=False)
    events = [eng.step(), eng.step()]
    texts_ = [base_engine.token_text(t) for t in eng.seq_view(sid).token_ids]
    heat = valid(attention.attention_heatmap(events, sid, 0, 0, texts_))
    n = len(heat["data"][0]["y"])
    assert heat["layout"]["yaxis"]["range"] == [n - 0.5, -0.5] and heat["layout"]["yaxis"]["autorange"] is False
    grid = valid(attention.attention_heads_grid(events, sid, 0, texts_))
    rows = len(grid["data"][0]["y"])
    assert grid["layout"]["yaxis"]["range"] == [rows - 0.5, -0.5] and grid["layout"]["yaxis"]["autorange"] is False


# ---- item 9: a speculative round's tokens, one row each -----------------------------------------------------

@pytest.fixture(scope="module")
def spec_run(base_engine):
    eng = base_engine.session()
    sid = eng.add_request(EXTRACTIVE, SamplingParams(max_tokens=14, temperature=0.0),
                          speculative=SpeculativeConfig("ngram", 4))
    events = []
    while eng.has_unfinished():
        events.append(eng.step())
    return events, sid


def test_a_round_keeps_each_tokens_detokenizer_step(spec_run):
    events, sid = spec_run
    rounds = [s for e in events for s in e.seqs if s.seq_id == sid and s.spec is not None]
    assert any(r.spec.num_emitted > 1 for r in rounds)  # prompt lookup on an extractive prompt
    for s in rounds:
        sp = s.spec
        assert [d.token_id for d in sp.detok] == sp.emitted_ids and len(sp.detok) == sp.num_emitted
        assert sp.detok[-1] == s.detok  # the event's own record is the round's last
        released = "".join(d.emitted for d in sp.detok)
        assert s.emitted.startswith(released)  # the rest is a finish's flush
    again = SpecRound.from_dict(json.loads(json.dumps(rounds[-1].spec.to_dict())))
    assert again.detok == rounds[-1].spec.detok and isinstance(again.detok[0], DetokStep)


def test_detok_table_has_one_row_per_emitted_token_grouped_by_round(spec_run):
    events, sid = spec_run
    emitted = [(e.step, s) for e in events for s in e.seqs if s.seq_id == sid and s.detok is not None]
    want_ids = [t for _, s in emitted for t in (s.spec.emitted_ids if s.spec is not None else [s.new_token])]
    fig = valid(detok.detok_table(events, sid, last_n=100))
    cols = fig["data"][0]["cells"]["values"]
    assert cols[1] == want_ids
    # the step column: "step · i/k" inside a round of k tokens, the plain step otherwise
    want_steps = []
    for step, s in emitted:
        k = s.spec.num_emitted if s.spec is not None else 1
        want_steps += [step] if k == 1 else [f"{step} · {i}/{k}" for i in range(1, k + 1)]
    assert cols[0] == want_steps
    # each row's text is its own token's, and the rows' released text adds up to the sequence's stream
    texts_ = [t for _, s in emitted for t in (s.spec.emitted_texts if s.spec is not None else [s.new_token_text])]
    assert cols[2] == [plain(t) for t in texts_]
    stream = "".join(s.emitted for _, s in emitted)
    assert "".join(r.emitted for r in detok.token_rows(events, sid)) == stream
    # the rounds alternate their tint, so a round's rows read as one group
    rows = detok.token_rows(events, sid)
    fills = fig["data"][0]["cells"]["fill"]["color"][0]
    for r, fill in zip(rows, fills):
        plain_row = not r.detok.held_text and not r.detok.held_bytes.strip() and r.detok.stop is None
        if r.round_index is not None and plain_row:
            assert fill == (detok.ROUND_FILL if r.round_index % 2 else detok.ROW_FILL)
    assert len(detok.detok_table(events, sid, last_n=5)["data"][0]["cells"]["values"][0]) == 5


def test_a_trace_from_before_per_token_steps_still_draws_a_row_per_step(spec_run):
    events, sid = spec_run
    old = []
    for e in events:  # the same events as an older engine wrote them: no SpecRound.detok
        d = e.to_dict()
        for s in d["seqs"]:
            if s.get("spec"):
                s["spec"].pop("detok")
        old.append(type(e).from_dict(d))
    rows = detok.token_rows(old, sid)
    assert len(rows) == sum(1 for e in old for s in e.seqs if s.seq_id == sid and s.detok is not None)
    valid(detok.detok_table(old, sid))


# ---- item 8: long block tables wrap -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def long_event(base_engine):
    """A prompt of 53+ blocks beside a short one: the long table wraps, the short one stays one row."""
    eng = base_engine.session(kv_memory=64 * 1024 * 1024)
    words = " ".join(f"word{i}" for i in range(250))  # ~3.6 tokens a word: ~900 tokens, 57 blocks of 16
    long_id = eng.add_request(words, SamplingParams(max_tokens=8, temperature=0.0), chat=False)
    short_id = eng.add_request("Hi", SamplingParams(max_tokens=40, temperature=0.0), chat=False)
    event = eng.step()
    while len(event.block_tables.get(long_id, [])) < 53 or short_id not in event.block_tables:
        event = eng.step()
    return event, long_id, short_id


def test_long_block_tables_wrap_into_labelled_rows(long_event):
    event, long_id, short_id = long_event
    fig = valid(kv_cache.block_tables_chart(event))
    (heat,) = fig["data"]
    line = kv_cache.LINE_BLOCKS
    assert all(len(row) == line for row in heat["text"])
    labels = fig["layout"]["yaxis"]["ticktext"]
    # every sequence's table read row by row is its block table, and each row names its logical blocks
    row = 0
    for sid in sorted(event.block_tables):
        table = event.block_tables[sid]
        n_rows = max(1, math.ceil(len(table) / line))
        cells = [c for r in heat["customdata"][row:row + n_rows] for c in r if c is not None]
        assert cells == table
        assert [t for r in heat["text"][row:row + n_rows] for t in r if t] == [str(b) for b in table]
        for j in range(n_rows):
            first, last = j * line, min((j + 1) * line, len(table)) - 1
            assert labels[row + j] == f"seq {sid} · {first}–{last}"
        row += n_rows
    assert row == len(heat["z"])
    assert len(event.block_tables[long_id]) >= 53
    assert fig["layout"]["yaxis"]["range"] == [row - 0.5, -0.5]
    # a short table alone keeps the plain one-row form
    short = kv_cache.block_tables_chart(type(event)(**{**vars(event), "block_tables":
                                                       {short_id: event.block_tables[short_id]}}))
    assert short["layout"]["yaxis"]["ticktext"] == [f"seq {short_id}"]


# ---- item 13: small ones ------------------------------------------------------------------------------------

def test_rounds_chart_puts_position_one_on_top_by_an_explicit_range(spec_run):
    events, sid = spec_run
    fig = valid(speculative.rounds_timeline(events, sid))
    y = fig["layout"]["yaxis"]
    assert y["autorange"] is False and y["range"][0] > y["range"][1] == 0.5


def test_perplexity_title_names_its_units(forced_run):
    fig = logits.perplexity_chart(forced_run["events"], forced_run["sid"])
    title = flat(fig["layout"]["title"]["text"])
    assert "(nats)" in title and "per token" in title and "over 3 tokens" in title  # the rewind dropped one
    ru = logits.perplexity_chart(forced_run["events"], forced_run["sid"], "ru")
    assert "на токен" in flat(ru["layout"]["title"]["text"])


def test_pipeline_names_finished_sequences_by_id(spec_run):
    events, sid = spec_run
    last = events[-1]
    assert last.finished == [sid]
    assert f"seq #{sid} finished" in pipeline.pipeline_summary(last)
    assert f"завершена посл. #{sid}" in pipeline.pipeline_summary(last, "ru")
