"""The room load's rounds (app/room_load.py) without a browser: tickets are one request each, void when a newer
round starts or after their time, a round waits for the cooldown, reports are checked and counted once, and the
summary's numbers are those of the records it was given. The browser run with real followers and the real
engine: tests/test_e2e_room_load.py."""
import pytest

from app.i18n import Refusal
from app.panels.room_load import summary_html
from app.room_load import (COOLDOWN_S, MAX_FOLLOWERS, MAX_TOKENS, TICKET_TTL_S, RoomLoad, metrics_batches,
                           percentile, room_batches)
from i18n_check import english, html_text


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_a_ticket_is_one_request_of_its_round_only():
    clock = Clock()
    load = RoomLoad(clock=clock)
    rnd, tickets = load.start("What is gravity?", 500, 0, followers=3)
    assert len(tickets) == len(set(tickets)) == 3 and rnd.max_tokens == MAX_TOKENS  # capped
    grant = load.redeem(tickets[1])
    assert (grant.round, grant.follower, grant.max_tokens) == (1, 2, MAX_TOKENS)
    with pytest.raises(ValueError, match="used already"):
        load.redeem(tickets[1])
    with pytest.raises(ValueError, match="not valid"):
        load.redeem("made-up")
    clock.now += TICKET_TTL_S + 1
    with pytest.raises(ValueError, match="expired"):
        load.redeem(tickets[0])
    clock.now += COOLDOWN_S
    _, newer = load.start("again", 8, 0.5, followers=1)
    with pytest.raises(ValueError, match="not valid"):  # the older round's unused ticket is void now
        load.redeem(tickets[2])
    assert load.redeem(newer[0]).round == 2


def test_rounds_are_bounded_and_checked_before_anything_starts():
    clock = Clock()
    load = RoomLoad(clock=clock)
    for args, key in ((("", 8, 0), "load_prompt"), (("x" * 2001, 8, 0), "load_prompt"), (("hi", 0, 0), "load_numbers"),
                      (("hi", "many", 0), "load_numbers"), (("hi", 8, 3), "load_numbers")):
        with pytest.raises(Refusal) as exc:
            load.start(*args, followers=2)
        assert exc.value.phrase.key == key
    with pytest.raises(Refusal, match="Nobody follows"):
        load.start("hi", 8, 0, followers=0)
    assert load.round is None  # nothing started by a refusal
    _, tickets = load.start("hi", 8, 0, followers=MAX_FOLLOWERS + 5)
    assert len(tickets) == MAX_FOLLOWERS
    clock.now += COOLDOWN_S - 2
    with pytest.raises(Refusal) as exc:
        load.start("hi", 8, 0, followers=1)
    assert exc.value.phrase.key == "load_cooldown" and exc.value.phrase.fields["wait"] == 2
    assert "подождите 2 с" in exc.value.text("ru")


def test_reports_are_checked_counted_once_and_summed_up():
    clock = Clock()
    load = RoomLoad(clock=clock)
    rnd, tickets = load.start("hi", 8, 0, followers=4)
    for bad in ({"ok": True}, {"ok": True, "ttft_ms": -1}, {"ok": True, "ttft_ms": "fast"},
                {"ok": True, "ttft_ms": True}, {"ok": True, "ttft_ms": 1e9}):
        with pytest.raises(ValueError, match="ttft_ms"):
            load.report(tickets[0], 1, bad)
    with pytest.raises(ValueError, match="no round of yours"):
        load.report(tickets[0], 2, {"ok": True, "ttft_ms": 5})  # another round's number
    with pytest.raises(ValueError, match="no round of yours"):
        load.report(None, 1, {"ok": True, "ttft_ms": 5})  # a socket that was handed no ticket
    ttfts = [300.0, 100.0, 200.0]
    for tk, ms in zip(tickets, ttfts):
        load.redeem(tk)
        load.owned(tk, f"follower {ms:.0f}")
        clock.now += 0.5
        load.served(tk, f"follower {ms:.0f}", 8)
        load.report(tk, 1, {"ok": True, "ttft_ms": ms, "tokens": 8})
    with pytest.raises(ValueError, match="sent already"):
        load.report(tickets[0], 1, {"ok": True, "ttft_ms": 1})
    load.report(tickets[3], 1, {"ok": False, "error": "HTTP 500"})
    s = load.summary()
    assert (s["asked"], s["sent"], s["answered"], s["failed"]) == (4, 3, 3, 1)
    assert (s["ttft_p50_s"], s["ttft_p95_s"]) == (0.2, 0.3)
    assert s["tokens"] == 24 and s["window_s"] == pytest.approx(1.5) and s["tok_s"] == pytest.approx(16.0)
    html = summary_html(s, "en")
    assert 'id="load-answered">3<' in html and "median 200 ms, 95th percentile 300 ms" in html
    assert not english(html_text(summary_html(s, "ru")))


def test_percentiles_and_the_batches_from_records_and_metrics():
    assert percentile([], 50) is None
    assert percentile([1.0], 95) == 1.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.0 and percentile([1.0, 2.0, 3.0, 4.0], 95) == 4.0
    load = RoomLoad(clock=Clock())
    rnd, _ = load.start("hi", 8, 0, followers=2)
    t = rnd.started_unix
    seg = lambda owner: {"owner": owner, "seq_id": 0, "phase": "decode"}  # noqa: E731
    records = [{"t": t - 30, "batch": [seg("follower 1"), seg("tab 1")] * 3},  # before the round: not counted
               {"t": t + 1, "batch": [seg("follower 1"), seg("tab 1")]},
               {"t": t + 2, "batch": [seg("follower 1"), seg("follower 2"), seg("api 1")]},
               {"t": t + 3, "batch": [seg("tab 1")]}]  # none of the round's: not counted
    b = room_batches(records, rnd, {"follower 1", "follower 2"})
    assert b == {"source": "room", "steps": 2, "max": 3, "mean": 2.5, "max_round": 2}
    assert room_batches(records, rnd, {"follower 9"}) is None
    series = [(t - 5, {"running": 9.0}), (t + 1, {"running": 2.0}), (t + 2, {"running": 3.0, "kv_usage": 0.1})]
    assert metrics_batches(series, rnd) == {"source": "metrics", "samples": 2, "max": 3, "mean": 2.5}
    s = {**load.summary(), "batches": metrics_batches(series, rnd)}
    assert 'id="load-max-batch">3<' in summary_html(s, "en") and not english(html_text(summary_html(s, "ru")))


def test_tickets_follow_the_apis_key_policy():
    """A follower's ticket stands in for the key, also where the API is off by default (a public lab without a
    key: the presenter token started the round), but not where the operator turned the API off."""
    from app.openai_api import decide

    assert decide("0.0.0.0", None).enabled is False and decide("0.0.0.0", None).room_load is True
    assert decide("127.0.0.1", "k").room_load is True
    assert decide("127.0.0.1", None, "off").room_load is False
