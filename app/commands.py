"""The lab's commands: one small dataclass per thing that can be done to a session, and one `apply` that does it.

The Gradio buttons, the tab's websocket, the presenter's script socket and the guided tour all build these
commands and call `apply`, so a Step means the same thing wherever it comes from. Client values are checked
once, here, when a command is built from them (`request_from`, `sampling_params`, `number`); `apply` then only
sees typed values. No command reads the engine's sequences: the LabSession methods give what they need.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from engine import SamplingParams

from . import grammar_examples
from .charts.common import token_label
from .i18n import Phrase, Refusal, lang_of, t
from .session import MAX_STOP_CHARS, MAX_VIEW_CHARS, cap_text, start_preemption_demo
from .trace import ReplaySession


# ---- the commands -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Request:
    """A new request as the prompt box and the sliders describe it."""

    prompt: str
    chat: bool
    system: str | None
    params: SamplingParams


@dataclass(frozen=True)
class Step:
    """`count` engine steps. With a request (the page's Step): nothing running starts it, else its sliders
    apply to the focused sequence from this step on."""

    request: Request | None = None
    count: int = 1


@dataclass(frozen=True)
class Force:  # the focused sequence's next token is `token_id`, whatever the sampler would pick
    token_id: int


@dataclass(frozen=True)
class Run:  # step until Pause, or until every sequence has finished (Outcome.steps)
    request: Request | None = None


@dataclass(frozen=True)
class Rewind:  # cut the focused sequence back to its first `n` generated tokens (later KV slots are released)
    n: int


@dataclass(frozen=True)
class Branch(Rewind):  # a new sequence sharing the focused one's first `n` generated tokens and their KV blocks
    pass


@dataclass(frozen=True)
class Focus:  # show sequence `seq_id` in the per-sequence panels
    seq_id: int


@dataclass(frozen=True)
class WhatIf:  # the focused sequence's last sampling chain, recomputed for `params` (no engine step)
    params: SamplingParams


@dataclass(frozen=True)
class Add:
    """Queue another request; `focus`: show it (the tour's start)."""

    request: Request
    focus: bool = False


@dataclass(frozen=True)
class Pause:  # stop a Run after its current step, keeping every step that ran
    pass


@dataclass(frozen=True)
class Preview:
    """The prompt box changed: panel 1 draws its template and tokens before any step (the first screen)."""

    prompt: str
    chat: bool
    system: str | None


@dataclass(frozen=True)
class PreemptionDemo:
    """One click to watch preemption: the tab gets a small engine of its own with a short and a long request
    queued (app/session.py start_preemption_demo); Reset returns it to the shared room."""


@dataclass(frozen=True)
class Reset:  # forget every request and step (with a tab's Context: a fresh session)
    pass


@dataclass(frozen=True)
class SchemaPair:
    """The prefix-cache pitfall in one click: two requests whose system prompts start with the same JSON schema,
    its keys in the same order (`shuffled` False) or not; the first is prefilled before the second arrives, so
    the second's prefill finds whatever blocks the two share in the prefix cache. Both answer under the schema."""

    params: SamplingParams
    shuffled: bool = False


@dataclass
class Context:
    """What a command may need besides the session. With `registry` and `key` (a tab's), Reset gives the tab
    a fresh session; without them (the tour, the presenter's script) it resets the session in place."""

    lang: str = "en"
    registry: object = None  # app.session.SessionRegistry
    key: str | None = None
    lecture: object = None  # app.live.Lecture: a presenting tab's fresh session goes on the air


@dataclass
class Outcome:
    session: object  # the session after the command (Reset may make a new one)
    message: str = ""  # one line for the page, in the context's language
    value: object = None  # the new sequence's id (Add, Branch), the step numbers taken (Step), a what-if
    steps: object = None  # Run: an iterator that takes one engine step per item
    changed: bool = True  # False: nothing to show (a what-if on a replay, or before anything was sampled)


# ---- apply ----------------------------------------------------------------------------------------------
def apply(session, cmd, ctx: Context | None = None) -> Outcome:
    """Do `cmd` to `session`; a ValueError when it cannot be done (a Refusal, shown in the tab's language,
    where the refusal is the app's own)."""
    ctx = ctx or Context()
    if isinstance(cmd, Reset):
        return _reset(session, ctx)
    if isinstance(cmd, PreemptionDemo):
        return _preemption_demo(ctx)
    if isinstance(cmd, Pause):
        session.pause()
        if not isinstance(session, ReplaySession):
            session.settle()  # the steps that ran since the Run's last frame: the page is drawn from them next
        return Outcome(session)
    if isinstance(cmd, Run):  # a replay's run_steps shows its recorded frames one by one
        with session.lock:
            message = _start_or_update(session, cmd.request, ctx)
        return Outcome(session, message, steps=session.run_steps())
    with session.lock:  # one command at a time per session, even if a Run loop or another click races it
        return _APPLY[type(cmd)](session, cmd, ctx)


def _step(s, cmd: Step, ctx: Context) -> Outcome:
    message = _start_or_update(s, cmd.request, ctx)
    steps = []
    for _ in range(cmd.count):
        event = s.step()
        if event is None:
            break
        steps.append(event.step)
    return Outcome(s, message, value=steps)


def _add(s, cmd: Add, ctx: Context) -> Outcome:
    _live(s)
    r = cmd.request
    rid = s.add_request(r.prompt, r.params, r.chat, r.system)
    s.example_next = False  # the prompt box's example is queued: Step steps the batch
    if cmd.focus:
        s.focus = rid
    return Outcome(s, t("queued", ctx.lang).format(rid=rid), value=rid)


def _force(s, cmd: Force, ctx: Context) -> Outcome:
    _focused(s)
    text = s.force(cmd.token_id)
    return Outcome(s, t("forced", ctx.lang).format(id=cmd.token_id, text=token_label(text)))


def _rewind(s, cmd: Rewind, ctx: Context) -> Outcome:
    _focused(s)
    s.rewind(cmd.n)
    return Outcome(s, t("rewound", ctx.lang).format(sid=s.focus, n=cmd.n))


def _branch(s, cmd: Branch, ctx: Context) -> Outcome:
    _focused(s)
    rid = s.branch(cmd.n)
    return Outcome(s, t("branched", ctx.lang).format(rid=rid, n=cmd.n), value=rid)


def _focus(s, cmd: Focus, ctx: Context) -> Outcome:
    if cmd.seq_id in s.requests and cmd.seq_id != s.focus:
        s.focus, s.what_if = cmd.seq_id, None  # a what-if belongs to the sequence it was made for
    return Outcome(s)


def _what_if(s, cmd: WhatIf, ctx: Context) -> Outcome:
    """The focused sequence's last sampling chain recomputed for new slider values (no engine step)."""
    if isinstance(s, ReplaySession):
        return Outcome(s, changed=False)  # a recorded trace keeps its recorded sampling
    v = s.focus_view()
    if v is None or not v.has_sampled:
        return Outcome(s, changed=False)  # nothing sampled yet: the sliders simply apply to the first step
    if same_chain(cmd.params, v.params):
        # the sliders equal what the last step sampled with: a Step (over the websocket, faster than this
        # event) already applied them, or the user moved a slider back. That is no what-if.
        s.what_if = None
        return Outcome(s)
    s.what_if = s.what_if_trace(cmd.params)
    return Outcome(s, value=s.what_if)


def _preview(s, cmd: Preview, ctx: Context) -> Outcome:
    """Keep the prompt box's preview; the page redraws only when no sequence fills the panels (changed)."""
    if isinstance(s, ReplaySession):
        return Outcome(s, changed=False)  # a recorded trace shows its own prompt
    s.set_preview(cmd.prompt, cmd.chat, cmd.system)
    return Outcome(s, changed=s.focus is None)


def _schema_pair(s, cmd: SchemaPair, ctx: Context) -> Outcome:
    _live(s)
    s.reset()  # a fresh pair: the tab's earlier requests are released (their prompts' blocks stay in the cache)
    ex = grammar_examples
    first, second = t("grammar.pair_prompt_a", ctx.lang), t("grammar.pair_prompt_b", ctx.lang)
    schema_b = ex.PAIR_SHUFFLED if cmd.shuffled else ex.PAIR_SCHEMA
    # the answers are short JSON objects: two requests' worth of KV must fit a visitor's share of the room's pool
    params = replace(cmd.params, max_tokens=min(cmd.params.max_tokens, ex.PAIR_MAX_TOKENS))
    try:  # both or neither: a pair cut short (the room's pool full, say) would show nothing of the pitfall
        a = s.add_request(first, params, True, ex.pair_system(ex.PAIR_SCHEMA))
        s.step()  # a's prompt blocks are computed and registered in the prefix cache
        b = s.add_request(second, params, True, ex.pair_system(schema_b))
        s.focus = b
        event = s.step()
    except Exception:
        s.reset()
        raise
    ev = event.seq(b) if event is not None else None
    cached = ev.num_cached_tokens if ev is not None else 0
    key = "grammar.pair_shuffled" if cmd.shuffled else "grammar.pair_stable"
    return Outcome(s, t(key, ctx.lang).format(a=a, b=b, n=cached, blocks=cached // s.engine.block_size),
                   value=(a, b))


_APPLY = {Step: _step, Add: _add, Force: _force, Rewind: _rewind, Branch: _branch, Focus: _focus,
          WhatIf: _what_if, Preview: _preview, SchemaPair: _schema_pair}


def _preemption_demo(ctx: Context) -> Outcome:
    if ctx.registry is None or ctx.key is None:
        raise Refusal("demo_tab_only")
    s, pool = start_preemption_demo(ctx.registry, ctx.key, t("demo.short", ctx.lang), t("demo.long", ctx.lang))
    if ctx.lecture is not None and ctx.lecture.is_presenter(ctx.key):
        ctx.lecture.session = s  # the viewers follow the demo
    a, b = s.seq_ids()
    return Outcome(s, t("demo_started", ctx.lang).format(blocks=pool, tokens=pool * s.engine.block_size, a=a, b=b),
                   value=(a, b))


def _reset(s, ctx: Context) -> Outcome:
    """A tab's Reset renews its session (`s` may be None: it had none yet); anyone else's resets in place."""
    if ctx.registry is None or ctx.key is None:
        with s.lock:
            s.reset()
        return Outcome(s)
    fresh = ctx.registry.renew(ctx.key)
    if ctx.lecture is not None and ctx.lecture.is_presenter(ctx.key):
        ctx.lecture.session = fresh  # the viewers follow the fresh session
    return Outcome(fresh)


def _start_or_update(s, request: Request | None, ctx: Context) -> str:
    """Nothing running: the prompt box starts a new request. An example picked since (LabSession.example_next):
    it starts as a new request and the tab's unfinished ones stop (a Step after an example continued the old
    answer under the example's grammar). Otherwise the sliders apply from this step. Returns the page's line."""
    if request is None or isinstance(s, ReplaySession):
        return ""  # a replay's Step shows the next recorded frame; the controls cannot change the past
    if s.example_next:
        s.example_next = False
        stopped = s.stop_unfinished()
        try:
            sid = s.add_request(request.prompt, request.params, request.chat, request.system)
        except Exception:
            s.example_next = True  # refused (an empty prompt, a cap): the next try still starts afresh
            raise
        s.focus = sid
        return t("example.started", ctx.lang).format(sid=sid, ids=", #".join(map(str, stopped))) if stopped else ""
    if not s.has_unfinished():
        s.add_request(request.prompt, request.params, request.chat, request.system)
    else:
        s.updated_params(request.params)
    return ""


def _live(s) -> None:
    if isinstance(s, ReplaySession):
        raise Refusal("replay_only_live")


def _focused(s) -> None:
    _live(s)
    if s.focus is None:
        raise Refusal("no_focus")


CHAIN_FIELDS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "frequency_penalty",
                "presence_penalty")


def same_chain(a: SamplingParams, b: SamplingParams) -> bool:
    """Whether two parameter sets run the same sampling chain on the same logits (seed, max tokens and stop
    strings do not change a step's chain)."""
    return all(getattr(a, f) == getattr(b, f) for f in CHAIN_FIELDS)


# ---- building commands from client values ----------------------------------------------------------------
def number(name: str, value, integer: bool = False, optional: bool = False):
    """A number from a client value (a text box's string, a slider's number); a Refusal naming the control
    (i18n "name.<name>")."""
    if value in (None, "") and optional:
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise Refusal("not_number", name=Phrase(f"name.{name}"), value=repr(str(value)[:20])) from None
    if integer:
        if not x.is_integer():
            raise Refusal("not_whole", name=Phrase(f"name.{name}"), value=value)
        return int(x)
    return x


def sampling_params(temperature, top_k, top_p, min_p, rep, freq, pres, seed, max_tokens, stop,
                    grammar="") -> SamplingParams:
    """SamplingParams from the sliders and boxes (SamplingParams itself checks the ranges); `grammar` is the
    grammar box's text (app/grammar_examples.py)."""
    grammar = grammar_examples.parse(grammar)  # checked (and capped) before anything else
    stop = cap_text("stop", stop, MAX_STOP_CHARS)
    stops = tuple(x for x in (stop or "").split(",") if x.strip()) if stop else ()
    stops = tuple(x.replace("\\n", "\n") for x in stops)
    seed = None if seed in (None, "") else int(seed)
    top_k = int(top_k) if top_k is not None and float(top_k).is_integer() else top_k
    max_tokens = int(max_tokens) if max_tokens is not None and float(max_tokens).is_integer() else max_tokens
    return SamplingParams(max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                          min_p=min_p, repetition_penalty=rep, frequency_penalty=freq,
                          presence_penalty=pres, seed=seed, stop=stops, grammar=grammar)


def request(prompt, chat, system, *sampling) -> Request:
    """A Request from the prompt box, the chat switch, the system box and the sliders (SAMPLING_FIELDS)."""
    return Request(prompt, chat, system, sampling_params(*sampling))


# the names lab.js sends a Step's control values under (protocol.STEP_INPUTS lists them for the page)
SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p", "rep", "freq", "pres", "seed", "max_tokens", "stop",
                   "grammar")
VIEW_FIELDS = ("lang", "layer", "head", "word", "npos", "visible")
REQUEST_FIELDS = ("prompt", "chat", "system")


def socket_inputs(inputs: dict) -> dict:
    """The values lab.js read off the page's controls, typed as Gradio would pass them (numbers as numbers,
    an empty number box as None, the chat switch as a bool)."""
    get = inputs.get
    return {"prompt": str(get("prompt") or ""), "chat": get("chat", True) in (True, "true", "True", 1, "1"),
            "system": str(get("system") or ""),
            "temperature": number("temperature", get("temperature")), "top_k": number("top_k", get("top_k")),
            "top_p": number("top_p", get("top_p")), "min_p": number("min_p", get("min_p")),
            "rep": number("rep", get("rep")), "freq": number("freq", get("freq")), "pres": number("pres", get("pres")),
            "seed": number("seed", get("seed"), integer=True, optional=True),
            "max_tokens": number("max_tokens", get("max_tokens"), integer=True, optional=True),
            "stop": str(get("stop") or ""), "grammar": str(get("grammar") or ""), **view_inputs(inputs)}


def view_inputs(inputs: dict) -> dict:
    """The view controls and the charts in view (a Refusal for a view state longer than lab.js ever writes)."""
    get = inputs.get
    return {"lang": lang_of(get("lang")),
            "layer": number("layer", get("layer") or 0, integer=True),
            "head": number("head", get("head") or 0, integer=True), "word": str(get("word") or ""),
            "npos": number("position", get("npos"), integer=True, optional=True),
            "visible": cap_text("visible", get("visible") or "", MAX_VIEW_CHARS)}


def token_id(value) -> int:
    if value in (None, ""):
        raise Refusal("need_token")
    return int(value)


def kept_tokens(value) -> int:
    if value in (None, ""):
        raise Refusal("need_position")
    return int(value)


def seq_id(label) -> int | None:
    """The sequence a selector's value names ("#3 · running", "3" or 3); None for an empty choice."""
    if label in (None, ""):
        return None
    return int(str(label).split()[0].lstrip("#"))
