"""Speculative-decoding charts, checked against REAL engine events.

One small session runs two speculative requests side by side for a few traced steps: a sampling one drafted by
the early exit at layer 24 (accepts and rejections, so residuals) and a greedy one with prompt lookup on an
extractive prompt (long accepted runs and bonus tokens). A measured comparison with plain decoding feeds the
speed-up chart. Every figure's numbers are compared with the event fields they were drawn from.
"""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from app.charts import speculative as SC
from app.charts.common import plain
from app.charts.common import axis_title
from app.i18n import texts
from engine import SamplingParams, SpeculativeConfig
from engine import speculative as S
from engine.events import StepEvent
from engine.metrics import expected_tokens_per_pass

EXTRACTIVE = ("Repeat the following text exactly: The quick brown fox jumps over the lazy dog, "
              "and the dog keeps sleeping.")


@pytest.fixture(scope="module")
def run(base_engine):
    eng = base_engine.session()
    a = eng.add_request("Name three planets.", SamplingParams(max_tokens=12, temperature=1.0, seed=3),
                        speculative=SpeculativeConfig("early_exit", 3, exit_layer=24))
    b = eng.add_request(EXTRACTIVE, SamplingParams(max_tokens=14, temperature=0.0),
                        speculative=SpeculativeConfig("ngram", 4))
    events = []
    while eng.has_unfinished():
        events.append(eng.step())
    ids = base_engine.encode(EXTRACTIVE).token_ids
    comparison = S.compare_with_plain(base_engine, ids, SamplingParams(max_tokens=10, temperature=0.0,
                                                                       ignore_eos=True), SpeculativeConfig("ngram", 4))
    return eng, events, a, b, comparison


def valid(fig):
    """JSON-safe (no NaN) and accepted by plotly's own schema validation."""
    import plotly.graph_objects as go

    json.dumps(fig, allow_nan=False)
    go.Figure(fig)
    return fig


def rounds_of(events, sid):
    return [(e.step, e.seq(sid).spec) for e in events if e.seq(sid) is not None and e.seq(sid).spec is not None]


def trace_named(fig, name):
    return next(t for t in fig["data"] if t.get("name") == name)


def test_rounds_timeline_places_every_draft_and_final_token(run):
    eng, events, a, b, _ = run
    for sid in (a, b):
        rounds = rounds_of(events, sid)
        fig = valid(SC.rounds_timeline(events, sid))
        kinds = texts("spec", "en")["kinds"]
        expected = {}
        for r, (step, sp) in enumerate(rounds, start=1):
            for d in sp.draft:
                expected.setdefault(d.verdict, []).append((r, d.position, plain(d.text, 8)))
            fin = sp.final
            x = r + (0.32 if fin.kind == "resampled" else 0.0)
            expected.setdefault(fin.kind, []).append((x, fin.position, plain(fin.text, 8)))
        assert {t["name"] for t in fig["data"]} == {kinds[k] for k in expected}
        for kind, cells in expected.items():
            t = trace_named(fig, kinds[kind])
            assert list(zip(t["x"], t["y"], t["text"])) == cells
            assert t["marker"]["color"] == SC.KIND_STYLE[kind][0]
        assert fig["layout"]["xaxis"]["ticktext"] == [str(step) for step, _ in rounds]
        # tokens a stop/EOS cut from a round are drawn faded
        faded = sum(o < 1 for t in fig["data"] for o in t["marker"]["opacity"])
        assert faded == sum(sum(d.verdict == "accepted" and d.position > sp.num_emitted for d in sp.draft)
                            + (not sp.final.kept) for _, sp in rounds)
        drafted = sum(len(sp.draft) for _, sp in rounds)
        accepted = sum(sp.num_accepted for _, sp in rounds)
        assert f"{accepted}/{drafted}" in fig["layout"]["title"]["text"].replace("<br>", " ")
    # the sampling request really rejected and resampled; the extractive one got bonus tokens
    assert any(sp.final.kind == "resampled" for _, sp in rounds_of(events, a))
    assert any(sp.final.kind == "bonus" for _, sp in rounds_of(events, b))
    # hover of a checked draft shows its own q, p, ratio and u
    step, sp = next((st, sp) for st, sp in rounds_of(events, a) if sp.draft)
    d = sp.draft[0]
    hover = trace_named(SC.rounds_timeline(events, a), texts("spec", "en")["kinds"][d.verdict])["customdata"][0]
    assert f"q(x) = {d.q:.4f}" in hover and f"p(x) = {d.p:.4f}" in hover and f"u = {d.u:.3f}" in hover


def placeholder(fig) -> str:
    """The message of an empty chart (common.empty breaks it into lines)."""
    return fig["layout"]["annotations"][0]["text"].replace("<br>", " ")


def test_rounds_timeline_reads_replayed_events_and_speaks_russian(run):
    eng, events, a, _, _ = run
    replayed = [StepEvent.from_dict(e.to_dict()) for e in events]
    assert SC.rounds_timeline(replayed, a)["data"] == SC.rounds_timeline(events, a)["data"]
    ru = valid(SC.rounds_timeline(events, a, lang="ru"))
    assert ru["layout"]["title"]["text"].startswith("Раунды")
    assert axis_title(ru, "xaxis").startswith("раунд")
    assert placeholder(SC.rounds_timeline([], lang="en")) == texts("spec", "en")["no_rounds"]
    # without a seq id the chart follows the sequence that speculated last
    last_sid = [s.seq_id for e in events for s in e.seqs if s.spec is not None][-1]
    assert SC.rounds_timeline(events)["data"] == SC.rounds_timeline(events, last_sid)["data"]


def test_pq_chart_shows_p_q_and_the_residual_of_the_rejected_position(run):
    eng, events, a, _, _ = run
    step, sp = next((st, sp) for st, sp in rounds_of(events, a) if sp.residual is not None)
    fig = valid(SC.pq_chart(sp, step=step))
    tx = texts("spec", "en")
    assert len(sp.dists) == sp.num_accepted + 1
    p_bars = [t for t in fig["data"] if t["name"] == tx["p"]]
    q_bars = [t for t in fig["data"] if t["name"] == tx["q"]]
    res_bars = [t for t in fig["data"] if t["name"] == tx["residual"]]
    assert len(p_bars) == len(q_bars) == len(sp.dists) and len(res_bars) == 1
    r = sp.residual
    j = r.position - 1
    assert p_bars[j]["y"] == r.p and q_bars[j]["y"] == r.q and res_bars[0]["y"] == r.residual
    assert res_bars[0]["xaxis"] == p_bars[j]["xaxis"]
    for i, d in enumerate(sp.dists[:j]):  # accepted positions: the recorded p and q of their tracked tokens
        assert p_bars[i]["y"] == d.p and q_bars[i]["y"] == d.q
        outline = p_bars[i]["marker"]["line"]["width"]
        assert [w > 0 for w in outline] == [t == d.draft for t in d.token_ids]
    # each panel's heading carries the verdict and the ratio/uniform number of its check
    heads = [ann["text"] for ann in fig["layout"]["annotations"] if ann.get("name") != "legend-key"]
    rejected = sp.draft[j]
    assert tx["verdict"]["rejected"] in heads[j] and f"u = {rejected.u:.3f}" in heads[j]
    assert fig["layout"]["title"]["text"].replace("<br>", " ") == tx["pq_title"].format(step=step)


def test_pq_chart_bonus_panel_and_empty_states(run):
    eng, events, _, b, _ = run
    step, sp = next((st, sp) for st, sp in rounds_of(events, b) if sp.final.kind == "bonus")
    fig = valid(SC.pq_chart(sp, step=step, lang="ru"))
    tx = texts("spec", "ru")
    p_bars = [t for t in fig["data"] if t["name"] == tx["p"]]
    q_bars = [t for t in fig["data"] if t["name"] == tx["q"]]
    assert len(p_bars) == sp.num_drafted + 1 and len(q_bars) == sp.num_drafted  # the bonus has no q
    # tokens with no mass in p or q (and not the draft) are left out: they say nothing
    def kept(d):
        return [i for i, t in enumerate(d.token_ids)
                if t == d.draft or d.p[i] > 0 or (d.q is not None and d.q[i] > 0)]

    last = sp.dists[-1]
    assert p_bars[-1]["y"] == [last.p[i] for i in kept(last)]
    own = [a for a in fig["layout"]["annotations"]
           if not a.get("name", "").startswith("axis-title:") and a.get("name") != "legend-key"]
    assert tx["bonus_pos"] in own[-1]["text"]
    # q of a prompt-lookup draft is one-hot at the drafted token
    d = sp.dists[0]
    assert q_bars[0]["y"] == [1.0 if d.token_ids[i] == d.draft else 0.0 for i in kept(d)]
    assert 1.0 in q_bars[0]["y"]
    no_drafts = next((sp for _, sp in rounds_of(events, b) if sp.num_drafted == 0), replace(sp, num_drafted=0))
    assert placeholder(SC.pq_chart(no_drafts)) == texts("spec", "en")["no_pq"]
    untraced = replace(sp, dists=None)
    assert placeholder(SC.pq_chart(untraced)) == texts("spec", "en")["no_dists"]


def test_acceptance_and_tokens_per_pass_match_the_statistics(run):
    eng, events, a, b, _ = run
    for sid in (a, b):
        stats = rounds_of(events, sid)[-1][1].stats
        assert stats == eng.result(sid).speculative
        by = stats["by_position"]
        fig = valid(SC.acceptance_chart(stats))
        bars = fig["data"][0]
        assert bars["y"] == [acc / r if r else None for acc, r in zip(by["accepted"], by["reached"])]
        assert bars["text"] == [f"{acc}/{r}" for acc, r in zip(by["accepted"], by["reached"])]
        assert fig["data"][1]["y"] == [stats["alpha"]] * 2
        assert SC.acceptance_chart(rounds_of(events, sid)[-1][1])["data"] == fig["data"]  # a round works too

        fig = valid(SC.tokens_per_pass_chart(stats))
        curve, expected, measured = fig["data"]
        k = stats["num_tokens"]
        assert curve["y"][-1] == k + 1 and curve["y"][0] == 1.0
        assert curve["y"][25] == pytest.approx(expected_tokens_per_pass(curve["x"][25], k))
        assert measured["x"] == [stats["alpha"]] and measured["y"] == [stats["tokens_per_round"]]
        assert expected["y"] == [pytest.approx(stats["expected_tokens_per_round"])]
        assert f"{stats['tokens_per_round']:.2f}" in fig["layout"]["title"]["text"]
    assert placeholder(SC.acceptance_chart(None)) == texts("spec", "en")["no_alpha"]
    assert placeholder(SC.tokens_per_pass_chart({}, lang="ru")) == texts("spec", "ru")["no_pass"]


def test_speedup_chart_and_table_show_the_measured_comparison(run):
    _, _, _, _, cmp_ = run
    fig = valid(SC.speedup_chart(cmp_))
    bars = fig["data"][0]
    assert bars["y"] == [cmp_["plain"]["tok_s"], cmp_["speculative"]["tok_s"]]
    assert f"{cmp_['speedup']:.2f}×" in fig["layout"]["title"]["text"] and cmp_["same_tokens"]
    table = valid(SC.speedup_table([cmp_], ["extractive"]))
    cells = table["data"][0]["cells"]["values"]
    st = cmp_["speculative"]["stats"]
    assert [c[0] for c in cells] == ["extractive", "ngram", 4, f"{cmp_['plain']['tok_s']:.1f}",
                                     f"{cmp_['speculative']['tok_s']:.1f}", f"{cmp_['speedup']:.2f}×",
                                     f"{st['alpha']:.2f}", f"{st['tokens_per_round']:.2f}",
                                     f"{st['expected_tokens_per_round']:.2f}", "✓"]
    ru = valid(SC.speedup_table([cmp_], ["x"], lang="ru"))
    assert ru["data"][0]["header"]["values"][0] == "<b>запрос</b>"
    assert placeholder(SC.speedup_chart(None)) == texts("spec", "en")["no_speedup"]
