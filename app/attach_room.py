"""Load from the room in attach mode (app/room_load.py): followers open this page's /follow; the presenter (with the
presenter token) asks every follower's page to send one request at the same moment to the attached server.

A follower's page cannot call the attached server itself (another origin, and the key must stay here), so it
sends its ticket to `POST /attach/room/chat`, which spends the ticket and relays the server's stream unchanged:
the request is the round's own (the presenter's prompt, max_tokens and temperature), whatever the page's body
says, so a ticket buys exactly one such request and nothing else. The batches come from the server's /metrics
(requests running), read every second while the round runs.
"""
from __future__ import annotations

import html
import json
import threading
import time

import httpx
from fastapi import Request, WebSocket

from .i18n import Refusal, lang_of, t, texts
from .live import PresenterSocket, ask_followers, follower_message
from .panels.room_load import summary_html
from .room_load import TICKET_TTL_S, metrics_batches

MAX_BODY = 64 * 1024


def follow_html(lang: str) -> str:
    """The follower's page in attach mode: the status line and its own request (no lab panels: no engine here)."""
    from .protocol import constants_script

    say, attach = texts("follow", lang), texts("attach", lang)
    table = {**say, "nobody": attach["follow_ready"], "waiting": attach["follow_ready"], "live": attach["follow_ready"]}
    config = json.dumps(table, ensure_ascii=False).replace("</", "<\\/")
    e = html.escape
    return (f'<!doctype html><html lang="{lang}"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<title>{e(say["title"])}</title>{constants_script()}'
            f'<script>window.INFERLAB_FOLLOW = {config};</script>'
            '<link rel="stylesheet" href="/lab-static/lab.css"></head><body class="il-follow">'
            '<header class="il-follow-head"><h1>InferLab</h1>'
            f'<span id="follow-status" class="il-follow-status">{e(say["connecting"])}</span>'
            '<span id="follow-last" class="il-follow-last"></span></header>'
            f'<p class="il-load-note">{e(attach["follow_text"])}</p>'
            '<div id="follow-load" class="il-follow-load" hidden></div>'
            '<script src="/lab-static/follow_load.js"></script>'
            '<script src="/lab-static/follow.js"></script></body></html>')


def mount_room(app, hub, load, attachment) -> None:
    """The follower page and socket, the presenter's send and summary (from the page, or a script on
/ws/present), and the relay of each follower's request."""
    from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse

    reports = follower_message(load)

    @app.get("/follow")
    def follow_page(lang: str = "en"):
        return HTMLResponse(follow_html(lang_of(lang)))

    @app.websocket("/ws/follow")
    async def follow_socket(ws: WebSocket):
        await hub.serve(ws, "viewer", on_message=reports)

    # a script presents as in the lab (auth, then load and load_summary; there is no engine to step here)
    presenter = PresenterSocket(hub, None, None, load, lambda: {"url": "/attach/room/chat",
                                                                 "model": attachment.target.model})

    @app.websocket("/ws/present")
    async def present_socket(ws: WebSocket):
        await hub.serve(ws, "unauthenticated", on_message=presenter.handle)

    @app.post("/attach/room/send")
    async def send(request: Request):
        try:
            body = await _json(request)
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        lang = lang_of(body.get("lang"))
        try:
            check_token(hub, body.get("token"), request)
            out = await ask_followers(hub, load, {"url": "/attach/room/chat", "model": attachment.target.model},
                                      body.get("prompt"), body.get("max_tokens", 32), body.get("temperature", 0))
        except Refusal as exc:
            return JSONResponse({"error": exc.text(lang)}, status_code=403 if "token" in exc.phrase.key else 400)
        return {**out, "note": t("load_sent", lang).format(round=out["round"], n=out["asked"])}

    @app.get("/attach/room/summary")
    def summary(lang: str = "en"):
        s = load.summary()
        return {"html": summary_html(s, lang_of(lang)), "summary": s}

    @app.post("/attach/room/chat")
    async def relay(request: Request):
        _, _, ticket = request.headers.get("authorization", "").partition(" ")
        ticket = ticket.strip()
        rnd = load.round
        try:
            await _json(request)  # the page's body is read (and capped) but the round says what is sent
            load.redeem(ticket)
        except ValueError as exc:
            return JSONResponse({"error": {"message": str(exc), "type": "permission_error", "param": None,
                                           "code": "room_load_ticket"}}, status_code=403)
        target = attachment.target
        out = {"model": target.model, "messages": [{"role": "user", "content": rnd.prompt}],
               "max_tokens": rnd.max_tokens, "temperature": rnd.temperature, "stream": True,
               "stream_options": {"include_usage": True}}
        return StreamingResponse(_relay(target, out, load, ticket), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    app.state.room_load = load


async def _relay(target, body: dict, load, ticket: str):
    """The attached server's stream, line by line as it arrives; the server's token count goes to the round."""
    tokens, chunks, error = None, 0, ""
    try:
        async with target.aopen("POST", "/v1/chat/completions", httpx.Timeout(30, read=600), json=body) as r:
            if r.status_code != 200:
                await r.aread()
                error = f"HTTP {r.status_code}: {r.text[:200]}"
            else:
                async for line in r.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    tokens, chunks = _count(line[5:].strip(), tokens, chunks)
                    yield line + "\n\n"
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"[:200]
    finally:
        load.served(ticket, "", tokens if tokens is not None else chunks, error)
    if error:
        yield f"data: {json.dumps({'error': {'message': error, 'type': 'server_error'}})}\n\n"


def _count(data: str, tokens, chunks: int):
    """(usage's completion tokens if the chunk has them, chunks that carried text so far)."""
    try:
        chunk = json.loads(data)
    except ValueError:
        return tokens, chunks
    if not isinstance(chunk, dict):
        return tokens, chunks
    if chunk.get("usage"):
        tokens = chunk["usage"].get("completion_tokens", tokens)
    if any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or []):
        chunks += 1
    return tokens, chunks


def check_token(hub, token, request) -> None:
    """The presenter token (Refusal "bad_token", which says where to find it; tries limited per address)."""
    try:
        hub.check_token(token, request.client.host if request.client else None)
    except Refusal as exc:
        raise (Refusal("bad_token") if exc.phrase.key == "wrong_token" else exc) from None


def _watch_metrics(target, load, rnd) -> None:
    """The server's /metrics every second while the round runs: the batches the summary shows come from here."""
    while load.round is rnd and time.monotonic() - rnd.started < TICKET_TTL_S:
        target.scrape()
        if rnd.slots and all(s.served_at is not None for s in rnd.slots.values() if s.redeemed) and \
                all(s.redeemed for s in rnd.slots.values()):
            target.scrape()
            return
        time.sleep(0.5)


def room_batches(attachment):
    """RoomLoad's batch source in attach mode: the attached server's requests running at once."""
    return lambda rnd, owners: metrics_batches(attachment.target.series, rnd)


def watch_metrics(attachment, load):
    """RoomLoad's on_start in attach mode: read the server's /metrics while the round runs (however it began)."""
    def start(rnd) -> None:
        threading.Thread(target=_watch_metrics, args=(attachment.target, load, rnd), daemon=True,
                         name="attach-room-metrics").start()
    return start


async def _json(request) -> dict:
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > MAX_BODY:
            raise ValueError(f"the body must be at most {MAX_BODY} bytes")
    try:
        body = json.loads(data or b"{}")
    except ValueError:
        raise ValueError("the body must be JSON") from None
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object")
    return body
