"""Load from the room (lecture mode): the presenter asks every follower's page to send one request at the same
moment, and the room sees batching and time to first token under that load.

One round at a time. `RoomLoad.start` makes a one-time ticket per follower (the hub hands each follower's page
its own, app/live.py); the page sends one streaming chat request with it from the browser — to the lab's own
/v1 (the ticket stands in for the API key, which no page ever sees) or, in attach mode, to the attach page's
relay of the attached server — shows its answer and the time to first token it measured itself, and reports
both back over its socket. The server counts the tokens it served under each ticket itself (a page's report is
believed only for what the server cannot see: the client's own TTFT). `summary` is the room's view of the
round: how many answered, TTFT p50/p95 at the followers, aggregate tok/s, and the batches the engine ran
(`batches`, given by the mode: the room's step records locally, the server's /metrics in attach mode).

Bounded: one ticket per follower per round, each good for one request within TICKET_TTL_S, with max_tokens
capped; at most MAX_FOLLOWERS followers asked per round; a cooldown between rounds; a newer round voids the
older one's unused tickets.
"""
from __future__ import annotations

import math
import secrets
import threading
import time
from dataclasses import dataclass, field

from .i18n import Refusal

MAX_TOKENS = 64  # per follower's request
MAX_PROMPT_CHARS = 2000
COOLDOWN_S = 10.0  # between two rounds' starts
TICKET_TTL_S = 60.0  # a ticket not used within this is void
MAX_FOLLOWERS = 48  # asked per round; the others watch (the room runs 32 sequences per engine step)
MAX_TTFT_S = 600.0  # a report past this is not a measurement


@dataclass(frozen=True)
class Grant:
    """What a redeemed ticket allows: one streaming chat request of at most `max_tokens` tokens."""

    round: int
    follower: int
    max_tokens: int


@dataclass
class Slot:
    follower: int  # 1..n within the round
    redeemed: bool = False
    owner: str = ""  # the room owner that served it (local mode), e.g. "follower 3"
    tokens: int | None = None  # completion tokens the server counted
    served_at: float | None = None  # monotonic: when the server's stream ended
    error: str = ""  # why the server's side failed
    report: dict | None = None  # the page's: {"ok", "ttft_s", "tokens", "error"}


@dataclass
class Round:
    number: int
    prompt: str
    max_tokens: int
    temperature: float
    started: float  # monotonic
    started_unix: float
    slots: dict[str, Slot] = field(default_factory=dict)  # ticket -> slot


class RoomLoad:
    def __init__(self, batches=None, clock=time.monotonic, on_start=None):
        self.batches = batches or (lambda rnd, owners: None)  # (round, owners) -> batch summary dict or None
        self.on_start = on_start  # (round) -> None: attach mode starts reading the server's /metrics here
        self.clock = clock
        self.round: Round | None = None
        self._count = 0
        self._lock = threading.Lock()

    def start(self, prompt, max_tokens, temperature, followers: int) -> tuple[Round, list[str]]:
        """A new round for `followers` pages (at most MAX_FOLLOWERS get a ticket): the round and the tickets,
        one per follower, in order. Refusal (a message for the presenter) on bad input, no followers or a
        cooldown not yet over; nothing changes then."""
        prompt, max_tokens, temperature = checked(prompt, max_tokens, temperature)
        if followers < 1:
            raise Refusal("load_nobody")
        now = self.clock()
        with self._lock:
            if self.round is not None and now - self.round.started < COOLDOWN_S:
                raise Refusal("load_cooldown", wait=math.ceil(COOLDOWN_S - (now - self.round.started)))
            self._count += 1
            rnd = Round(self._count, prompt, max_tokens, temperature, now, time.time())
            tickets = [secrets.token_urlsafe(18) for _ in range(min(followers, MAX_FOLLOWERS))]
            rnd.slots = {tk: Slot(i + 1) for i, tk in enumerate(tickets)}
            self.round = rnd  # the older round's unused tickets are void from here on
        if self.on_start is not None:
            self.on_start(rnd)
        return rnd, tickets

    def is_ticket(self, token: str) -> bool:
        rnd = self.round
        return bool(token) and rnd is not None and token in rnd.slots

    def redeem(self, ticket: str) -> Grant:
        """The ticket's one request (ValueError when it is unknown, used, void or expired)."""
        with self._lock:
            rnd = self.round
            slot = rnd.slots.get(ticket) if rnd is not None and ticket else None
            if slot is None:
                raise ValueError("this room-load ticket is not valid (a newer round replaced it, or it never was)")
            if slot.redeemed:
                raise ValueError("this room-load ticket was used already: one request per follower per round")
            if self.clock() - rnd.started > TICKET_TTL_S:
                raise ValueError(f"this room-load ticket expired ({TICKET_TTL_S:.0f} s after the round began)")
            slot.redeemed = True
            return Grant(rnd.number, slot.follower, rnd.max_tokens)

    def served(self, ticket: str, owner: str = "", tokens: int | None = None, error: str = "") -> None:
        """The server's side of a ticket's request ended: the tokens it generated (or why it failed)."""
        with self._lock:
            slot = self.round.slots.get(ticket) if self.round is not None else None
            if slot is not None and slot.served_at is None:
                slot.owner, slot.tokens, slot.error = owner, tokens, error[:200]
                slot.served_at = self.clock()

    def owned(self, ticket: str, owner: str) -> None:
        """The room owner now serving the ticket's request (before it ends: the summary finds its steps)."""
        with self._lock:
            slot = self.round.slots.get(ticket) if self.round is not None else None
            if slot is not None:
                slot.owner = owner

    def report(self, ticket: str | None, number, msg: dict) -> None:
        """A follower page's report of its request (once per ticket; ValueError for a malformed one)."""
        ok = msg.get("ok") is True
        ttft = msg.get("ttft_ms")
        if ok and (not isinstance(ttft, (int, float)) or isinstance(ttft, bool) or not 0 <= ttft <= MAX_TTFT_S * 1e3):
            raise ValueError(f"ttft_ms must be a number of milliseconds from 0 to {MAX_TTFT_S * 1e3:.0f}")
        tokens = msg.get("tokens")
        if not isinstance(tokens, int) or isinstance(tokens, bool) or not 0 <= tokens <= 100000:
            tokens = None
        with self._lock:
            rnd = self.round
            slot = rnd.slots.get(ticket or "") if rnd is not None else None
            if slot is None or rnd.number != number:
                raise ValueError("no round of yours is open: reports belong to the latest round")
            if slot.report is not None:
                raise ValueError("this round's report was sent already")
            slot.report = {"ok": ok, "ttft_s": ttft / 1e3 if ok else None, "tokens": tokens,
                           "error": str(msg.get("error") or "")[:200]}

    def summary(self) -> dict | None:
        """The latest round as the presenter sees it (None before the first)."""
        with self._lock:
            rnd = self.round
            if rnd is None:
                return None
            slots = list(rnd.slots.values())
            reports = [s.report for s in slots if s.report is not None]
            owners = {s.owner for s in slots if s.owner}
            ttfts = sorted(r["ttft_s"] for r in reports if r["ok"])
            served = [s for s in slots if s.served_at is not None and not s.error]
            tokens = sum(s.tokens or 0 for s in served)
            last = max((s.served_at for s in served), default=None)
            out = {"round": rnd.number, "prompt": rnd.prompt, "max_tokens": rnd.max_tokens,
                   "asked": len(slots), "sent": sum(s.redeemed for s in slots), "answered": len(ttfts),
                   "failed": sum(1 for r in reports if not r["ok"]) + sum(1 for s in slots if s.error),
                   "ttft_p50_s": percentile(ttfts, 50), "ttft_p95_s": percentile(ttfts, 95),
                   "tokens": tokens, "window_s": None if last is None else last - rnd.started,
                   "age_s": self.clock() - rnd.started, "started_unix": rnd.started_unix}
        out["tok_s"] = tokens / out["window_s"] if out["window_s"] else None
        out["batches"] = self.batches(rnd, owners)
        return out


def checked(prompt, max_tokens, temperature) -> tuple[str, int, float]:
    """The presenter's request, checked before anything is sent (Refusal naming the value)."""
    if not isinstance(prompt, str) or not prompt.strip() or len(prompt) > MAX_PROMPT_CHARS:
        raise Refusal("load_prompt", max=MAX_PROMPT_CHARS)
    try:
        max_tokens = int(max_tokens)
        temperature = float(temperature)
    except (TypeError, ValueError):
        raise Refusal("load_numbers", max=MAX_TOKENS) from None
    if not 1 <= max_tokens or not 0 <= temperature <= 2:
        raise Refusal("load_numbers", max=MAX_TOKENS)
    return prompt, min(max_tokens, MAX_TOKENS), temperature


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of sorted `values` (None for none)."""
    if not values:
        return None
    return values[max(0, math.ceil(q / 100 * len(values)) - 1)]


def room_batches(records, rnd: Round, owners: set[str]) -> dict | None:
    """Local mode: the room's steps since the round began that ran any of its requests: how many, the batch
    size (every owner's sequences in that step) at most and on average, and the round's requests in one step."""
    steps = [r for r in records if r["t"] >= rnd.started_unix - 1 and any(b["owner"] in owners for b in r["batch"])]
    if not steps:
        return None
    sizes = [len(r["batch"]) for r in steps]
    ours = [sum(b["owner"] in owners for b in r["batch"]) for r in steps]
    return {"source": "room", "steps": len(steps), "max": max(sizes), "mean": sum(sizes) / len(sizes),
            "max_round": max(ours)}


def metrics_batches(series, rnd: Round) -> dict | None:
    """Attach mode: the server's requests running at once, as its /metrics said while the round ran."""
    running = [v["running"] for t, v in series if t >= rnd.started_unix and "running" in v]
    if not running:
        return None
    return {"source": "metrics", "samples": len(running), "max": int(max(running)),
            "mean": sum(running) / len(running)}
