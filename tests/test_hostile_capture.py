"""The capture budget (issue 11): a long prompt must not make a tab hold every layer's and head's T x T attention.

One ~1,400-token prompt runs twice on the bundled model, prefilled in three chunks (512, 512, 376) and decoded
for two steps: once with the lab's Capture (max_attention_bytes=ATTENTION_BUDGET) and once unbudgeted. The
budgeted run keeps at most the budget per step, exactly the last rows that fit, equal bit for bit to the
unbudgeted run's rows; the charts draw those rows and say on the chart what was kept.
"""
import copy
import math

import numpy as np
import pytest
import torch

from app.charts import attention as A
from app.charts import embeddings as E
from app.charts.common import TITLE_LINE
from engine import Capture, SamplingParams
from engine.model import ATTENTION_BLOCK_BYTES, ATTENTION_BUDGET, MIN_BLOCK_ROWS, Model

LAYER, HEAD = 7, 4
PROMPT_TOKENS = 1400
STEPS = 5  # three prefill chunks, two decode steps


def lab_capture(**kw):
    """The Capture app/session.py gives every tab."""
    return Capture(**{"lens_top_k": 5, "lens_max_positions": 16, "max_attention_bytes": ATTENTION_BUDGET, **kw})


def long_ids(eng, n=PROMPT_TOKENS):
    text = " ".join(["gravity pulls every mass toward every other mass, and the pull falls with distance;"] * 200)
    ids = eng.tokenizer.encode(text)[:n]
    assert len(ids) == n
    return ids


def run_prompt(base, capture, ids, steps, keep=None):
    """Events of `steps` steps of one greedy request. keep(event) -> what to keep of each event (then the
    capture is dropped, so the unbudgeted run never holds more than one step's attention)."""
    eng = base.session()
    eng.instrument = capture
    rid = eng.add_request(prompt_ids=list(ids), params=SamplingParams(max_tokens=steps, temperature=0.0))
    out = []
    for _ in range(steps):
        ev = eng.step()
        out.append(ev if keep is None else keep(ev.seq(rid)))
    return rid, out


def attention_bytes(cap):
    return sum(t.numel() * t.element_size() for t in cap.attention.values())


@pytest.fixture(scope="module")
def runs(base_engine):
    ids = long_ids(base_engine)
    rid, budgeted = run_prompt(base_engine, lab_capture(), ids, STEPS)
    rows = [ev.seq(rid).capture.attention_rows for ev in budgeted]

    def keep(s):  # the unbudgeted step's rows at the positions the budgeted step kept, and everything small
        cap = s.capture
        i = [cap.positions.index(p) for p in rows[len(full)]]
        kept = {layer: a[:, i].clone() for layer, a in cap.attention.items()}
        entry = dict(token=s.new_token, attention=kept, nbytes=attention_bytes(cap), lens=cap.lens_probs,
                     lens_ids=cap.lens_ids, norms=cap.residual_norms, emb=cap.embeddings)
        s.drop_capture()
        full.append(entry)
        return entry

    full = []
    run_prompt(base_engine, Capture(lens_top_k=5, lens_max_positions=16), ids, STEPS, keep)
    texts = [base_engine.token_text(t) for t in ids + [e["token"] for e in full if e["token"] is not None]]
    return dict(rid=rid, events=budgeted, full=full, texts=texts, spec=base_engine.spec)


def test_today_a_long_prompt_captures_far_more_than_the_budget(runs):
    # what the lab kept per tab before the budget: every layer and head, T x T per chunk (>1.3 GB in all)
    per_step = [e["nbytes"] for e in runs["full"]]
    assert sum(per_step) > 1_000 * 2**20 and max(per_step) > 100 * 2**20


def test_each_step_keeps_at_most_the_budget(runs):
    spec = runs["spec"]
    for ev in runs["events"]:
        s = ev.seq(runs["rid"])
        cap = s.capture
        assert attention_bytes(cap) <= ATTENTION_BUDGET
        assert cap.attention_budget == ATTENTION_BUDGET
        ctx = s.chunk_start + s.num_processed
        # exactly the last rows that fit, for every layer and head
        fit = min(s.num_processed, ATTENTION_BUDGET // (spec.num_layers * spec.num_heads * ctx * 4))
        assert cap.attention_rows == list(range(ctx - fit, ctx)) == cap.attention_positions
        assert sorted(cap.attention) == list(range(spec.num_layers))
        assert all(a.shape == (spec.num_heads, fit, ctx) and a.dtype == torch.float32
                   for a in cap.attention.values())
        # everything the step holds (norms, embeddings and lens included) stays near the budget
        assert ev.capture_nbytes() <= ATTENTION_BUDGET + 4 * 2**20
    prefill = [ev.seq(runs["rid"]).capture for ev in runs["events"][:3]]
    assert [len(c.attention_rows) for c in prefill] == [45, 22, 16]  # 24 MiB at 512, 1,024 and 1,400 keys
    assert [len(ev.seq(runs["rid"]).capture.attention_rows) for ev in runs["events"][3:]] == [1, 1]


def test_kept_rows_equal_the_unbudgeted_capture_bitwise(runs):
    # the same eager ops in row blocks of >= MIN_BLOCK_ROWS rows: every bit of the kept rows, of the outputs
    # (the greedy tokens) and of the other captured tensors equals the unbudgeted run's
    for ev, ref in zip(runs["events"], runs["full"]):
        s = ev.seq(runs["rid"])
        cap = s.capture
        assert s.new_token == ref["token"]
        for layer, a in cap.attention.items():
            assert torch.equal(a, ref["attention"][layer]), layer
        for mine, theirs in ((cap.lens_probs, ref["lens"]), (cap.lens_ids, ref["lens_ids"]),
                             (cap.residual_norms, ref["norms"]), (cap.embeddings, ref["emb"])):
            assert torch.equal(mine, theirs)


def test_the_forward_holds_bounded_blocks_of_scores(base_engine, monkeypatch):
    """Above the budget no step materialises heads x rows x ctx scores: every softmax block stays within
    ATTENTION_BLOCK_BYTES (or MIN_BLOCK_ROWS rows)."""
    seen = []
    probs = Model._probs

    def spy(self, qh, kf, mask):
        out = probs(self, qh, kf, mask)
        seen.append(out.numel() * out.element_size())
        return out

    monkeypatch.setattr(Model, "_probs", spy)
    ids = long_ids(base_engine, 600)
    run_prompt(base_engine, lab_capture(), ids, 2)
    H = base_engine.spec.num_heads
    assert seen and max(seen) <= max(ATTENTION_BLOCK_BYTES, MIN_BLOCK_ROWS * H * 600 * 4)
    assert max(seen) < H * 512 * 512 * 4  # the whole first chunk's scores (9.4 MB) were never held at once


def test_a_short_prompt_is_unaffected(base_engine):
    ids = long_ids(base_engine, 60)
    rid, lab = run_prompt(base_engine, lab_capture(), ids, 3)
    _, plain = run_prompt(base_engine, Capture(lens_top_k=5, lens_max_positions=16), ids, 3)
    for a, b in zip(lab, plain):
        x, y = a.seq(rid).capture, b.seq(rid).capture
        assert x.attention_rows == y.attention_rows == x.positions and y.attention_positions is None
        assert sorted(x.attention) == sorted(y.attention)
        for layer in x.attention:
            assert torch.equal(x.attention[layer], y.attention[layer])
        for f in ("lens_ids", "lens_probs", "residual_norms", "embeddings"):
            assert torch.equal(getattr(x, f), getattr(y, f))
        assert a.seq(rid).new_token == b.seq(rid).new_token


def test_a_row_over_the_budget_is_not_kept(base_engine):
    ids = long_ids(base_engine, 40)
    tiny = 30 * 9 * 30 * 4  # less than one row of a 40-key context
    rid, evs = run_prompt(base_engine, lab_capture(max_attention_bytes=tiny), ids, 2)
    for ev in evs:
        cap = ev.seq(rid).capture
        assert cap.attention == {} and cap.attention_rows == [] and cap.embeddings is not None
    fig = A.attention_heatmap(evs, rid, LAYER, HEAD, None)
    assert fig["data"] == [] and "(capture budget)" in message(fig)
    assert "(capture budget)" in message(A.head_entropy_chart(evs, rid))


# ---- the charts draw what was kept and say so ------------------------------------------------------------

def message(fig):
    """A placeholder's message, its line breaks undone."""
    return fig["layout"]["annotations"][0]["text"].replace("<br>", " ")


def z_of(fig):
    return np.array([[np.nan if v is None else v for v in r] for r in fig["data"][0]["z"]], dtype=float)


def test_heatmap_draws_the_kept_rows_and_says_what_was_kept(runs):
    evs, rid, texts = runs["events"], runs["rid"], runs["texts"]
    fig = A.attention_heatmap(evs, rid, LAYER, HEAD, texts)
    T = evs[-1].seq(rid).chunk_start + evs[-1].seq(rid).num_processed
    lo = T - A.MAX_POSITIONS
    z = z_of(fig)
    assert z.shape == (A.MAX_POSITIONS, A.MAX_POSITIONS)
    kept = {}
    for ev in evs:
        cap = ev.seq(rid).capture
        for i, p in enumerate(cap.attention_rows):
            kept[p] = cap.attention[LAYER][HEAD, i].numpy()
    shown = [p for p in range(lo, T) if p in kept]
    assert shown == list(range(PROMPT_TOKENS - 16, T))  # the last chunk's 16 rows and both decode rows
    for p in range(lo, T):
        if p in kept:
            np.testing.assert_allclose(z[p - lo, : p + 1 - lo], kept[p][lo: p + 1], atol=5.1e-5)
        else:
            assert np.isnan(z[p - lo]).all()
    title = fig["layout"]["title"]["text"].replace("<br>", " ")  # titles wrap (common.TITLE_CHARS)
    assert f"attention kept for the last {len(shown)} of the 256 positions shown" in title
    assert f"{256 - len(shown)} over the capture budget (24 MiB a step)" in title
    # a line of title and two of subtitle, and a line more for each line the title wraps into (common.layout)
    wrapped = fig["layout"]["title"]["text"].count("<br>") + 1 - 3
    assert fig["layout"]["margin"]["t"] == 40 + 2 * A.SUBTITLE_PX + TITLE_LINE * wrapped
    ru = A.attention_heatmap(evs, rid, LAYER, HEAD, texts, "ru")["layout"]["title"]["text"].replace("<br>", " ")
    assert f"внимание сохранено для последних {len(shown)} из 256 показанных позиций" in ru
    assert "сверх бюджета захвата (24 МиБ на шаг)" in ru
    # the first chunk alone: 45 of its 512 rows, the window of its last 256
    first = A.attention_heatmap(evs[:1], rid, LAYER, HEAD, texts)["layout"]["title"]["text"].replace("<br>", " ")
    assert "the last 45 of the 256 positions shown" in first and "211 over the capture budget" in first


def test_grid_and_entropy_under_the_budget(runs):
    evs, rid, texts = runs["events"], runs["rid"], runs["texts"]
    grid = A.attention_heads_grid(evs, rid, LAYER, texts, max_positions=32)
    assert "attention kept for the last 18 of the 32 positions shown" in grid["layout"]["title"]["text"].replace(
        "<br>", " ")
    n = 32
    z = z_of(grid)
    m, _ = A.attention_matrix(evs, rid, LAYER, HEAD)
    cols = math.ceil(math.sqrt(runs["spec"].num_heads))
    r, c = divmod(HEAD, cols)
    block = z[r * (n + A.GRID_GAP_ROWS): r * (n + A.GRID_GAP_ROWS) + n, c * (n + A.GRID_GAP_COLS):][:, :n]
    want = np.where(np.tril(np.ones((n, n), bool)), m[-n:, -n:], np.nan)
    np.testing.assert_allclose(block, want, atol=5.1e-4)
    # the entropy of the newest query: the last decode row, which is always kept
    ent = A.head_entropy_chart(evs, rid)
    cap = evs[-1].seq(rid).capture
    p = cap.attention[LAYER][HEAD, -1].double()
    want_bits = float(-(p[p > 0] * torch.log2(p[p > 0])).sum())
    assert ent["data"][0]["z"][LAYER][HEAD] == pytest.approx(want_bits, abs=1e-3)
    assert "not kept" not in ent["layout"]["title"]["text"]


def test_dropped_captures_say_not_kept(runs):
    """The session drops old events' captures when a tab holds too much: the charts then say so."""
    evs, rid, texts = runs["events"], runs["rid"], runs["texts"]
    copies = copy.deepcopy(evs)  # the fixture's events stay as they are
    total = sum(ev.capture_nbytes() for ev in copies)
    last = copies[-1]
    held = last.capture_nbytes()
    T = last.seq(rid).chunk_start + last.seq(rid).num_processed
    freed = last.seq(rid).drop_capture()
    assert freed == attention_bytes(evs[-1].seq(rid).capture) and last.capture_nbytes() == held - freed
    assert last.seq(rid).capture.attention == {} and last.seq(rid).capture.dropped == ["attention"]
    assert last.seq(rid).drop_capture() == 0  # twice is harmless
    title = A.attention_heatmap(copies, rid, LAYER, HEAD, texts)["layout"]["title"]["text"].replace("<br>", " ")
    assert "1 freed later (capture budget)" in title and "the last 17 of the 256" not in title
    ent = A.head_entropy_chart(copies, rid)["layout"]["title"]["text"].replace("<br>", " ")
    assert "attention of the 1 newer positions not kept (capture budget)" in ent
    # drop everything of every step: placeholders say why, the embeddings chart too
    for ev in copies:
        ev.drop_captures(("attention", "lens", "residual_norms", "embeddings"))
    assert sum(ev.capture_nbytes() for ev in copies) == 0 < total
    heat = A.attention_heatmap(copies, rid, LAYER, HEAD, texts)
    assert heat["data"] == [] and "was not kept for these positions (capture budget)" in message(heat)
    grid = A.attention_heads_grid(copies, rid, LAYER, texts)
    assert grid["data"] == [] and "(capture budget)" in message(grid)
    assert "(capture budget)" in message(A.head_entropy_chart(copies, rid))
    assert "logit lens of 50 positions not kept (capture budget)" in message(A.logit_lens_chart(copies, rid))
    pca = E.embedding_pca(copies, rid, texts)
    assert pca["data"] == [] and f"embeddings of {E.count_text(T, 'en')} positions not kept" in message(pca)
    assert "бюджет захвата" in message(E.embedding_pca(copies, rid, texts, "ru"))
    with pytest.raises(ValueError):
        copies[0].seq(rid).drop_capture(("everything",))


def test_capture_none_is_still_fine(runs):
    evs = copy.deepcopy(runs["events"][:1])
    evs[0].seq(runs["rid"]).capture = None
    assert evs[0].capture_nbytes() == 0 and evs[0].drop_captures() == 0
    fig = A.attention_heatmap(evs, runs["rid"], LAYER, HEAD, None)
    assert fig["data"] == [] and "capture budget" not in str(fig["layout"])


def test_budget_fields_round_trip_and_old_events_load(runs):
    ev = copy.deepcopy(runs["events"][0])
    for s in ev.seqs:  # a few rows are enough (to_dict writes nested lists: 24 MiB of them would be slow)
        s.capture.attention = {layer: a[:, -2:] for layer, a in s.capture.attention.items() if layer < 2}
        s.capture.attention_positions = s.capture.attention_positions[-2:]
    back = type(ev).from_dict(ev.to_dict())
    cap, again = ev.seq(runs["rid"]).capture, back.seq(runs["rid"]).capture
    assert again.attention_positions == cap.attention_positions and again.attention_budget == ATTENTION_BUDGET
    d = ev.to_dict()
    for s in d["seqs"]:  # an event written before budgets existed
        for key in ("attention_positions", "attention_budget", "dropped"):
            s["capture"].pop(key)
        s["capture"]["attention"] = {}
    old = type(ev).from_dict(d).seq(runs["rid"]).capture
    assert old.attention_positions is None and old.dropped == [] and old.attention_rows == old.positions


def test_the_lab_session_uses_the_budget(base_engine):
    from app.session import LabSession

    lab = LabSession.create(base_engine, kv_memory=8 * 2**20)
    assert lab.engine.instrument.max_attention_bytes == ATTENTION_BUDGET
