"""What the layers panel says about rows it cannot draw, and the folded token chips (issue 37, items 1, 3, 9).

Real sessions in a real room on the bundled model: a prefix-cache hit, a prompt longer than the heatmap's window
and the capture budget, a room that captured nothing for a page. Each chart is checked against the events.
"""
import numpy as np
import pytest

from app import room as room_mod
from app.charts import attention as A
from app.panels import tokens as P
from app.session import LabSession, new_room
from engine import SamplingParams

GREEDY = SamplingParams(max_tokens=2, temperature=0.0)


@pytest.fixture
def room(base_engine):
    r = new_room(base_engine, 64 * 2**20)
    yield r
    r.close()


def stepped(room, prompt, steps=1, params=GREEDY):
    s = LabSession.create(room)
    s.add_request(prompt, params, True, None)
    for _ in range(steps):
        s.step()
    return s


def test_prefix_cache_rows_are_a_grey_band_with_a_label_and_hover(room):
    stepped(room, "What is gravity?")
    s = stepped(room, "What is mass?")
    sev = s.events[0].seq(s.focus)
    cached = sev.num_cached_tokens
    assert cached > 0 and sev.chunk_start == cached
    texts = s.token_texts(s.focus)
    assert list(A.cached_rows(A.seq_events(s.events, s.focus), 0, len(texts))) == list(range(cached))
    for lang, words in (("en", "prefix cache"), ("ru", "префиксного кэша")):
        fig = A.attention_heatmap(s.events, s.focus, 0, 0, texts, lang)
        band, weights = fig["data"]
        z = np.array(band["z"], dtype=float)
        assert [r for r in range(len(z)) if np.isfinite(z[r]).any()] == list(range(cached))
        assert all(np.isfinite(z[r, :r + 1]).all() and np.isnan(z[r, r + 1:]).all() for r in range(cached))
        assert np.isnan(np.array(weights["z"], dtype=float)[:cached]).all()  # never computed: no weights
        assert words in band["hovertemplate"]
        label = next(a for a in fig["layout"]["annotations"] if words in a["text"].replace("<br>", " "))
        assert f"0–{cached - 1}" in label["text"]
        frame = [sh for sh in fig["layout"]["shapes"] if sh["line"].get("dash") == "dot"]
        assert len(frame) == 1 and (frame[0]["y0"], frame[0]["y1"]) == (-0.5, cached - 0.5)
        grid = A.attention_heads_grid(s.events, s.focus, 0, texts, lang, max_positions=None)
        assert f"0–{cached - 1}" in grid["layout"]["title"]["text"]
    # a request with nothing cached has no band
    alone = stepped(new_room(room.engine, 16 * 2**20), "What is mass?")
    assert alone.events[0].seq(alone.focus).num_cached_tokens == 0
    fig = A.attention_heatmap(alone.events, alone.focus, 0, 0, alone.token_texts(alone.focus))
    assert len(fig["data"]) == 1
    alone.room.close()


def test_a_long_prompt_labels_the_rows_over_the_capture_budget(room):
    text = "Gravity is the force by which a planet or other body draws objects toward its center. " * 20
    s = stepped(room, text)
    sev = s.events[0].seq(s.focus)
    T = sev.chunk_start + sev.num_processed
    assert T > A.MAX_POSITIONS
    kept = sev.capture.attention_positions
    lo = T - A.MAX_POSITIONS
    assert lo < min(kept)  # the budget kept fewer rows than the window shows
    for lang, word in (("en", "not kept"), ("ru", "не сохранены")):
        fig = A.attention_heatmap(s.events, s.focus, 0, 0, s.token_texts(s.focus), lang)
        gap = next(a for a in fig["layout"]["annotations"] if word in a["text"].replace("<br>", " "))
        sep = "," if lang == "en" else "\u00a0"
        assert f"{lo}–{min(kept) - 1}" in gap["text"].replace(sep, "")
        assert gap["yref"] == "y" and gap["y"] == (lo + min(kept) - 1) / 2 - lo  # in the middle of those rows


def test_a_step_the_room_did_not_capture_says_so(room, monkeypatch):
    """A page showing no capture chart in a room that captured nothing for such pages: the charts say that
    those steps were not captured (not that the panel was off screen, and not "capture budget")."""
    monkeypatch.setattr(room_mod, "ROOM_BACKGROUND_CAPTURES", 0)
    s = stepped(room, "What is gravity?", steps=2, params=SamplingParams(max_tokens=4, temperature=0.0))
    assert all(ev.seq(s.focus).capture is None for ev in s.events)
    texts = s.token_texts(s.focus)
    for lang in ("en", "ru"):
        t = A.tr(lang)
        for fig in (A.attention_heatmap(s.events, s.focus, 0, 0, texts, lang),
                    A.attention_heads_grid(s.events, s.focus, 0, texts, lang),
                    A.head_entropy_chart(s.events, s.focus, lang)):
            assert fig["layout"]["annotations"][0]["text"].replace("<br>", " ") == t["not_captured"]
    # the page shows a capture chart now: the next step is captured, whatever the room's background share
    s.shows_captures = True
    s.step()
    assert s.events[-1].seq(s.focus).capture is not None


@pytest.mark.parametrize("n", [P.CHIPS_EDGE * 2 + P.CHIPS_MIN_FOLDED - 1, P.CHIPS_EDGE * 2 + P.CHIPS_MIN_FOLDED,
                               4539])
def test_long_chip_lists_fold_their_middle(n):
    infos = [{"id": i % 50, "text": f"t{i}", "bytes_hex": (f"t{i}").encode().hex()} for i in range(n)]
    for lang, more in (("en", "more tokens"), ("ru", "ещё токенов")):
        out = P.token_chips_html(infos, n - 3, lang)
        assert out.count('class="il-chip ') == n  # every chip is there; the middle ones behind the control
        folded = n - 2 * P.CHIPS_EDGE >= P.CHIPS_MIN_FOLDED
        assert ("<details" in out) == folded
        if folded:
            head, rest = out.split("<details", 1)
            middle, tail = rest.split("</details>", 1)
            assert head.count('class="il-chip ') == tail.count('class="il-chip ') == P.CHIPS_EDGE
            assert f"{n - 2 * P.CHIPS_EDGE} {more}" in middle or f"{more}: {n - 2 * P.CHIPS_EDGE}" in middle
            assert f"{P.CHIPS_EDGE}–{n - P.CHIPS_EDGE - 1}" in middle
            assert 'data-il-fold="chips"' in rest and "<summary>" in middle


def test_a_long_template_scrolls_in_its_own_box():
    short = P.template_html("What is gravity?", [])
    assert "il-template-long" not in short
    long = P.template_html("x" * (P.TEMPLATE_SCROLL_CHARS + 1), [], "ru")
    assert 'class="il-template il-template-long" tabindex="0" role="region"' in long
    assert "прокрутите" in long
