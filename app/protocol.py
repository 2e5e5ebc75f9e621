"""The websocket protocol, and the page's element ids that static/lab.js and static/follow.js use.

Every socket message is a JSON object. The server's carry a "type" (one of the constants below); a client's
carry an "op". Both sides spell them from here: the server through `encode` and `decode`, the page's scripts
through `window.INFERLAB`, which `constants_js()` sets from these same values in both pages' head (app/server.py head_html).
"""
from __future__ import annotations

import json

from engine.records import dumps

# ---- server -> client ("type") ------------------------------------------------------------------------
PAYLOAD = "payload"  # {"payload": a render payload}: a tab's own charts and HTML pieces
FRAME = "frame"  # {"n", "t", "payload"}: the presenter's latest charts, for a lecture viewer
EVENT = "event"  # {"event": a step's summary}: every step of the lecture, in order
HELLO = "hello"  # {"role", "presenting", "viewers"}: a viewer has joined
BOUND = "bound"  # the tab's session exists: the page may send its commands over this socket
UNBOUND = "unbound"  # it has gone: the page's next Step goes through Gradio
RESYNC = "resync"  # a viewer fell behind: its backlog was dropped, the next frame is the current state
ERROR = "error"  # {"error": one line}
OK = "ok"  # {"op", ...}: a presenter command was done
# {"round", "ticket", "follower", "of", "url", "model", "prompt", "max_tokens", "temperature"}: the presenter asks
# this follower's page to send one request now (app/room_load.py); {"round", "skipped": true}: not this one
LOAD = "load"
RUN_END = "run_end"  # a Run the tab started over its socket has ended (Pause, every sequence finished, an error)
TYPES = (PAYLOAD, FRAME, EVENT, HELLO, BOUND, UNBOUND, RESYNC, ERROR, OK, LOAD, RUN_END)

# ---- client -> server ("op") ----------------------------------------------------------------------------
# a tab: {"op": "step", "inputs": {STEP_CONTROLS names...}}, {"op": "run", "inputs": {the same}} (steps until Pause;
# its frames come as payloads, then RUN_END), {"op": "focus", "seq": id, "inputs": {view...}},
# {"op": "view", "inputs": {view...}}: the charts in view changed (or the socket came back); the answer is a
# payload of those charts, and the server keeps the view to send that tab the room's steps (RoomPusher).
# {view...}: VIEW_CONTROLS, and "visible": '{"ids": [chart ids on screen], "near": [just outside it]}'
TAB_OPS = ("step", "run", "focus", "view")
# the presenter's script: {"op": "auth", "token"}, {"op": "start", "prompt", "chat", "system", "params"},
# {"op": "step", "count"}, {"op": "reset"}, {"op": "load", "prompt", "max_tokens", "temperature"} (every follower
# sends one request now), {"op": "load_summary"} (the latest round as the room saw it)
PRESENTER_OPS = ("auth", "start", "step", "reset", "load", "load_summary")
# a follower's page: {"op": "load_report", "round", "ok", "ttft_ms", "tokens", "error"}: how its request went
VIEWER_OPS = ("load_report",)

# ---- the page's elements that the scripts read or press -------------------------------------------------
IDS = {
    "step": "step", "run": "run", "pause": "pause",
    "force_id": "force_id", "force": "force",  # a click on a logits bar forces that token
    "rewind_n": "rewind_n", "rewind": "rewind",  # a click on a generated token rewinds to it
    # the charts in view, which Gradio events read, and their redraw while the socket is down (else the "view" op)
    "visible": "visible", "refresh": "refresh",
    "focus": "html-focus", "focus_select": "focus-select",  # the sequence selector (an HTML piece)
    "focus_pick": "focus_pick", "focus_go": "focus_go",  # its Gradio fallback while the socket is down
    "tokens": "html-tokens",  # the generated token chips
    "panel_prefix": "panel-", "chart_class": "il-chart",
    "follow_status": "follow-status", "follow_last": "follow-last",
    "follow_load": "follow-load",  # the follower's own request of a room load: its answer and TTFT
}
FORCE_CHARTS = ("chart-logits", "chart-sampling")  # charts whose bars name a token id (customdata)

# what lab.js reads off the page for a Step: name -> (element id, kind of control)
STEP_CONTROLS = {
    "prompt": ("prompt", "text"), "chat": ("chat", "check"), "system": ("system", "text"),
    "temperature": ("temperature", "slider"), "top_k": ("top_k", "slider"), "top_p": ("top_p", "slider"),
    "min_p": ("min_p", "slider"), "rep": ("repetition_penalty", "slider"),
    "freq": ("frequency_penalty", "slider"), "pres": ("presence_penalty", "slider"), "seed": ("seed", "text"),
    "max_tokens": ("max_tokens", "text"), "stop": ("stop", "text"), "grammar": ("grammar", "text"),
    "lang": ("lang", "radio"),
    "layer": ("layer", "slider"), "head": ("head", "slider"), "word": ("bpe_word", "text"),
    "npos": ("neighbour_pos", "text"),
}
VIEW_CONTROLS = ("lang", "layer", "head", "word", "npos")  # the part of STEP_CONTROLS a view needs


def encode(type_: str, **fields) -> str:
    """One server message as the text a socket sends."""
    if type_ not in TYPES:
        raise ValueError(f"unknown message type {type_!r}")
    return dumps({"type": type_, **fields})


def decode(data: str, ops: tuple[str, ...]) -> dict:
    """A client message: a JSON object whose "op" is one of `ops`; ValueError with one line otherwise."""
    hint = f"send a JSON object whose \"op\" is one of: {', '.join(ops)}"
    try:
        msg = json.loads(data)
    except (ValueError, RecursionError):
        raise ValueError(hint) from None
    if not isinstance(msg, dict):
        raise ValueError(hint)
    if msg.get("op") not in ops:
        raise ValueError(f"unknown op {str(msg.get('op'))[:40]!r}: use {', '.join(ops)}")
    return msg


def constants_js() -> str:
    """`window.INFERLAB = {...}`: the message types, ops and element ids, for lab.js and follow.js."""
    consts = {"types": {t: t for t in TYPES}, "tabOps": {o: o for o in TAB_OPS}, "ids": IDS,
              "forceCharts": list(FORCE_CHARTS), "stepControls": STEP_CONTROLS, "viewControls": VIEW_CONTROLS}
    return "window.INFERLAB = " + dumps(consts) + ";"


def constants_script() -> str:
    return "<script>" + constants_js() + "</script>"
