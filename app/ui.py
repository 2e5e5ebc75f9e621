"""The Gradio page's layout and the events that tie the controls to the callbacks (app/handlers.py,
app/ui_tools.py). Three columns (static/lab.css lays them out): the request with Step; the stage panels, each
with its own controls between its text and its charts (the sampling sliders beside the chain they move); the
other controls. Wide windows put the request above the other controls on the left and the panels on the right;
narrow ones put the panels right after Step.

Charts are not Gradio components: each handler returns one JSON payload (app/render.py) into a hidden
textbox, or sends it over the tab's websocket, and static/lab.js draws it with Plotly.react into persistent
divs, so user zoom survives every step (gr.Plot would rebuild the figure and lose it). The element ids the
script needs come from app/protocol.py, emitted once into the page's head as `window.INFERLAB`
(app/server.py head_html).
"""
from __future__ import annotations

import html
from types import SimpleNamespace

import gradio as gr

from . import calculators as calc
from . import render
from .handlers import LabHandlers
from . import formats_tool, grammar_examples
from .i18n import EXAMPLES, PANEL_KEYS, lang_of, t
from .live import Hub, Lecture
from .protocol import IDS
from .session import SessionRegistry, request_key as _key
from .ui_tools import ToolHandlers
from .widgets import Slider

__all__ = ["build_demo", "panels_html"]

RENDER_JS = "(payload) => { if (window.inferlab) { window.inferlab.render(payload); } return []; }"
HIDDEN = "il-hidden"  # rendered but hidden with CSS: Gradio drops invisible components from the DOM
# each language is named in itself, so a reader finds theirs whichever language the page is in
LANG_CHOICES = [("English", "en"), ("Русский", "ru")]
CALC_INPUTS = ("model", "dtype", "context", "batch", "gpu", "alpha", "k", "draft_cost")
DEFAULT_PROMPT = "What is gravity?"
SPEC_METHODS = ("ngram", "early_exit", "draft")  # engine.SpeculativeConfig's methods, named by "spec_method.<m>"


# ---- static HTML ---------------------------------------------------------------------------------------
def spec_methods(lang: str) -> list[tuple[str, str]]:
    """The drafter radio's choices: (what the page shows, the method the engine takes)."""
    return [(t(f"spec_method.{m}", lang), m) for m in SPEC_METHODS]


def chart_names(lang: str) -> list[tuple[str, str]]:
    """The export picker's choices: (the chart's name, its container id)."""
    return [(t(f"chart_name.{cid}", lang), cid) for cid in render.CHART_IDS]


def header_html(lang: str) -> str:
    return (f'<h1 class="il-title">{html.escape(t("title", lang))}</h1>'
            f'<p class="il-sub">{html.escape(t("subtitle", lang))}</p>')


def calc_header_html(lang: str) -> str:
    return (f'<h3 id="html-title-calculators">{html.escape(t("calc.title", lang))}</h3>'
            f'<p class="il-explain">{html.escape(t("calc.text", lang))}</p>')


def calc_charts_html() -> str:
    divs = "".join(f'<div id="{hid}" class="il-html {hid}"></div>' for hid in calc.HTML_IDS)
    charts = "".join(f'<div id="{cid}" class="il-chart {cid}"></div>' for cid in calc.CHART_IDS)
    return f'{divs}<div class="il-charts il-calc-charts">{charts}</div>'


PANELS_TOP = '<div id="html-pipeline" class="il-pipeline"></div><div id="html-message"></div>'


def panel_head_html(key: str) -> str:
    """A stage panel's title, its explanation and its HTML pieces (filled by lab.js)."""
    parts = [f'<h3 id="html-title-{key}">{html.escape(t(f"panel.{key}.title", "en"))}</h3>',
             f'<p class="il-explain" id="html-text-{key}">{html.escape(t(f"panel.{key}.text", "en"))}</p>']
    parts += [f'<div id="{hid}" class="il-html {hid}"></div>' for hid in render.PANEL_HTML.get(key, [])]
    return "".join(parts)


def panel_charts_html(key: str) -> str:
    """A stage panel's chart containers (drawn by lab.js)."""
    charts = "".join(f'<div id="{cid}" class="il-chart {cid}"></div>' for cid in render.PANEL_CHARTS[key])
    return f'<div class="il-charts">{charts}</div>'


def panels_html() -> str:
    """The follower page's panels (/follow serves this HTML as is): one section per stage, without controls.
    The page constants they need come with the head."""
    parts = [PANELS_TOP, '<div class="il-panels">']
    for key in PANEL_KEYS:
        wide = "" if key in ("logits", "sampling") else " il-wide"
        parts.append(f'<section class="il-panel{wide}" id="{IDS["panel_prefix"]}{key}">'
                     f'{panel_head_html(key)}{panel_charts_html(key)}</section>')
    parts.append("</div>")
    return "".join(parts)


# ---- the page ------------------------------------------------------------------------------------------
def build_demo(registry: SessionRegistry, holder, hub: Hub | None = None, lecture: Lecture | None = None) -> gr.Blocks:
    h = LabHandlers(registry, holder, hub, lecture)
    tools = ToolHandlers(h)
    # delete_cache: Gradio keeps a copy of every download and upload in its cache; files older than 15 min go
    # (checked every 5 min), so a room's exports and uploaded traces cannot fill the disk
    with gr.Blocks(title="InferLab", delete_cache=(300, 900)) as demo:
        c = SimpleNamespace()
        _header(c)
        with gr.Row(elem_classes="il-layout"):  # static/lab.css places the three columns by the window's width
            with gr.Column(scale=1, min_width=300, elem_classes="il-controls"):
                _tour_box(c)
                _request_controls(c)
            with gr.Column(scale=3, elem_classes="il-main"):
                _panels(c)
                _formats(c)
                _calculators(c)
            with gr.Column(scale=1, min_width=300, elem_classes="il-more"):
                _speculative_box(c)
                _grammar_controls(c)
                _lecture_box(c)
                _trace_box(c)
        _hidden(c)
        c.sampling = [c.temperature, c.top_k, c.top_p, c.min_p, c.rep, c.freq, c.pres, c.seed, c.max_tokens, c.stop]
        c.view = [c.lang, c.layer, c.head, c.word, c.npos, c.visible]
        _wire_engine(c, h)
        _wire_view(c, h)
        _wire_lecture(c, h)
        _wire_tools(c, tools)
        _wire_formats(c, formats_tool.FormatsHandlers(h))
        _wire_language(c, h, tools)
        _wire_page(demo, c, h, tools, registry)
    # other events: several visitors' renders at once (Gradio's default is one per listener for the whole
    # server, so one slow render queued everyone's); tensor work still runs one call at a time (engine/compute.py)
    demo.queue(default_concurrency_limit=8)
    demo.lab_handlers = h  # the server routes the tabs' websocket messages to the same handlers
    return demo


# ---- layout sections (each adds its components to the namespace `c`) ------------------------------------
def _header(c) -> None:
    with gr.Row(elem_classes="il-header"):
        c.header = gr.HTML(header_html("en"), elem_id="il-title")
        # wide enough for both choices on one line: the header stays two lines tall, Step in the first screen
        with gr.Column(scale=0, min_width=290):  # under the language: the title keeps the row's width
            c.lang = gr.Radio(LANG_CHOICES, value="en", label=t("language", "en"), elem_id="lang")
            # larger type for a room's shared screen (static/lab.js projector); a checkbox: Tab and Space reach it
            c.projector = gr.Checkbox(value=False, label=t("projector", "en"), elem_id="projector")
    c.status = gr.HTML(elem_id="model-status")
    c.timer = gr.Timer(0.5)


def _tour_box(c) -> None:
    with gr.Accordion(t("tour", "en"), open=False, elem_id="tour") as c.tour_acc:
        c.tour_box = gr.HTML(f'<p class="il-tour-intro">{html.escape(t("tour_intro", "en"))}</p>',
                             elem_id="tour-box")
        with gr.Row():
            c.tour_start = gr.Button(t("tour_start", "en"), elem_id="tour_start", size="sm")
            c.tour_back = gr.Button(t("tour_back", "en"), elem_id="tour_back", size="sm")
            c.tour_next = gr.Button(t("tour_next", "en"), elem_id="tour_next", size="sm", variant="primary")


def _request_controls(c) -> None:
    # English by default: SmolLM2-135M was trained on English and answers it sensibly at the default T = 0.7 (every
    # seed tried); its Russian answers are mostly nonsense at any temperature (the preview says so for Cyrillic)
    c.prompt = gr.Textbox(value=DEFAULT_PROMPT, label=t("prompt", "en"), lines=3, elem_id="prompt")
    _grammar_notice(c)
    c.chat = gr.Checkbox(value=True, label=t("chat", "en"), elem_id="chat")
    c.system = gr.Textbox(value="", label=t("system", "en"), lines=1, elem_id="system")
    with gr.Row(elem_id="step-row"):  # one row in the controls column (Gradio's 160 px minimum stacked them)
        c.step_btn = gr.Button(t("step", "en"), variant="primary", elem_id=IDS["step"], min_width=60)
        c.run_btn = gr.Button(t("run", "en"), elem_id=IDS["run"], min_width=60)
        c.pause_btn = gr.Button(t("pause", "en"), elem_id=IDS["pause"], min_width=60)
        c.reset_btn = gr.Button(t("reset", "en"), variant="stop", elem_id="reset", min_width=60)
    c.add_btn = gr.Button(t("add", "en"), elem_id="add_request", size="sm")
    c.demo_btn = gr.Button(t("demo_preempt", "en"), elem_id="preempt_demo", size="sm")
    # below Step, so that Step is in a wide window's first screen; a narrow window shows this row above Step, so
    # that the panels follow Step closely (static/lab.css)
    with gr.Row(elem_id="request-settings"):
        c.seed = gr.Number(value=0, precision=0, label=t("seed", "en"), elem_id="seed", min_width=90)
        c.max_tokens = gr.Number(value=64, precision=0, label=t("max_tokens", "en"), elem_id="max_tokens",
                                 min_width=90)
        c.stop = gr.Textbox(value="", label=t("stop", "en"), elem_id="stop", min_width=160)
    c.examples = gr.Dataset(components=[c.prompt], samples=[[e] for e in EXAMPLES["en"] + EXAMPLES["ru"][:2]],
                            label=t("examples", "en"), elem_id="examples")


def _grammar_notice(c) -> None:
    """By the prompt: whether a grammar is set (it changes every answer, and its box is elsewhere on the page),
    with a button that clears it (app/grammar_examples.py notice_html)."""
    with gr.Row(elem_id="grammar-notice-row", elem_classes="il-grammar-row"):
        c.grammar_notice = gr.HTML("", elem_id="grammar-notice")
        c.grammar_clear = gr.Button(t("grammar.clear", "en"), elem_id="grammar_clear", size="sm", visible=False,
                                    scale=0, min_width=130)


def _speculative_box(c) -> None:
    with gr.Accordion(t("spec_box", "en"), open=False, elem_id="speculative") as c.spec_acc:
        c.spec_on = gr.Checkbox(value=False, label=t("spec_on", "en"), elem_id="spec_on")
        c.spec_method = gr.Radio(spec_methods("en"), value="ngram", label=t("spec_method", "en"),
                                 elem_id="spec_method")
        with gr.Row():
            c.spec_k = Slider(1, 8, value=4, step=1, label=t("spec_k", "en"), elem_id="spec_k")
            # SmolLM2 was not trained for early exit: only its last layers agree with the full model
            c.spec_exit = Slider(1, 29, value=29, step=1, label=t("spec_exit", "en"), elem_id="spec_exit")
        c.spec_adaptive = gr.Checkbox(value=False, label=t("spec_adaptive", "en"), elem_id="spec_adaptive")
        c.spec_measure = gr.Button(t("spec_measure", "en"), elem_id="spec_measure", size="sm")


def _sampling_sliders(c) -> None:
    """The sampling panel's own controls, beside the chain chart they change (a what-if redraws it)."""
    c.temperature = Slider(0, 2, value=0.7, step=0.05, label=t("temperature", "en"), elem_id="temperature")
    c.top_k = Slider(0, 200, value=0, step=1, label=t("top_k", "en"), elem_id="top_k")
    c.top_p = Slider(0.01, 1, value=1.0, step=0.01, label=t("top_p", "en"), elem_id="top_p")
    c.min_p = Slider(0, 1, value=0.0, step=0.01, label=t("min_p", "en"), elem_id="min_p")
    c.rep = Slider(0.5, 2, value=1.0, step=0.05, label=t("repetition_penalty", "en"),
                      elem_id="repetition_penalty")
    c.freq = Slider(-2, 2, value=0.0, step=0.1, label=t("frequency_penalty", "en"), elem_id="frequency_penalty")
    c.pres = Slider(-2, 2, value=0.0, step=0.1, label=t("presence_penalty", "en"), elem_id="presence_penalty")


def _grammar_controls(c) -> None:
    """Constrained decoding (issue 15): the grammar box (app/grammar_examples.py), an example per click, and the
    prefix-cache pitfall pair."""
    # the box itself stays outside the collapsed accordion: Gradio does not put a closed accordion's children in
    # the page, and lab.js's socket Step reads every step control off the page (a missing one sends the Step
    # through Gradio instead)
    c.grammar = gr.Textbox(value="", label=t("grammar.label", "en"), lines=2, elem_id="grammar",
                           max_length=grammar_examples.MAX_BOX_CHARS)
    with gr.Accordion(t("grammar.box", "en"), open=False, elem_id="grammar-box") as c.grammar_acc:
        with gr.Row():
            c.grammar_ex = {name: gr.Button(t(f"grammar.ex.{name}", "en"), elem_id=f"grammar_ex_{name}", size="sm")
                            for name in grammar_examples.EXAMPLES}
        with gr.Row():
            c.pair_stable = gr.Button(t("grammar.pair_stable_btn", "en"), elem_id="grammar_pair_stable", size="sm")
            c.pair_shuffled = gr.Button(t("grammar.pair_shuffled_btn", "en"), elem_id="grammar_pair_shuffled",
                                        size="sm")


def _panels(c) -> None:
    """The sequence selector (HTML drawn by the server, driven by lab.js), the pipeline, and one panel per stage:
    its text, its own controls, its charts (issue 37: a sampling slider and the chain it moves were never on
    screen together)."""
    gr.HTML(f'<div id="{IDS["focus"]}" class="il-html"></div>', elem_id="focus-box")
    gr.HTML(PANELS_TOP, elem_id="panels-top")
    controls = {"template": _word_box, "embeddings": _neighbour_box, "layers": _layer_head, "logits": _force_box,
                "detok": _rewind_box}
    with gr.Column(elem_id="panels"):
        for key in PANEL_KEYS:
            with gr.Column(elem_id=f'{IDS["panel_prefix"]}{key}', elem_classes=["il-panel", "il-wide"]):
                gr.HTML(panel_head_html(key))
                if key == "sampling":  # the sliders beside the chain: both in view at every width
                    with gr.Row(elem_classes="il-panel-body"):
                        with gr.Column(scale=0, min_width=230, elem_classes="il-panel-controls"):
                            _sampling_sliders(c)
                        gr.HTML(panel_charts_html(key), scale=1, min_width=400)
                    continue
                if key in controls:
                    controls[key](c)
                gr.HTML(panel_charts_html(key))


def _word_box(c) -> None:
    c.word = gr.Textbox(value="", label=t("word", "en"), elem_id="bpe_word")


def _neighbour_box(c) -> None:
    c.npos = gr.Number(value=-1, precision=0, label=t("neighbour", "en"), elem_id="neighbour_pos")


def _layer_head(c) -> None:
    with gr.Row():
        c.layer = Slider(0, 29, value=0, step=1, label=t("layer", "en"), elem_id="layer")
        c.head = Slider(0, 8, value=0, step=1, label=t("head", "en"), elem_id="head")


def _force_box(c) -> None:
    with gr.Row():
        c.force_id = gr.Number(value=None, precision=0, label=t("force", "en"), elem_id=IDS["force_id"])
        c.force_btn = gr.Button(t("force_btn", "en"), elem_id=IDS["force"], size="sm")


def _rewind_box(c) -> None:
    with gr.Row():
        c.rewind_n = gr.Number(value=None, precision=0, label=t("rewind", "en"), elem_id=IDS["rewind_n"])
        c.branch = gr.Checkbox(value=False, label=t("branch_btn", "en"), elem_id="branch")
        c.rewind_btn = gr.Button(t("rewind_btn", "en"), elem_id=IDS["rewind"], size="sm")


def _lecture_box(c) -> None:
    with gr.Accordion(t("lecture", "en"), open=False, elem_id="lecture") as c.lecture_box:
        c.lecture_info = gr.HTML(elem_id="lecture-status")
        c.token = gr.Textbox(value="", type="password", label=t("token", "en"), elem_id="presenter_token")
        with gr.Row():
            c.present_btn = gr.Button(t("present", "en"), elem_id="present", size="sm")
            c.unpresent_btn = gr.Button(t("unpresent", "en"), elem_id="unpresent", size="sm")
        # every follower's page sends the prompt above once, at the same moment (app/room_load.py)
        c.load_btn = gr.Button(t("load_btn", "en"), elem_id="room-load", size="sm")


def _trace_box(c) -> None:
    with gr.Accordion(t("trace_box", "en"), open=False, elem_id="trace") as c.trace_acc:
        with gr.Row():
            c.trace_export = gr.Button(t("trace_export", "en"), elem_id="trace_export", size="sm")
            c.trace_load = gr.UploadButton(t("trace_load", "en"), file_types=[".json", ".gz"], elem_id="trace_load",
                                           size="sm")
        # the chart's name takes the column's width (beside the format it was cut: "Логиты и веро")
        c.export_chart = gr.Dropdown(chart_names("en"), value="chart-logits", label=t("chart", "en"),
                                     elem_id="export_chart")
        c.export_fmt = gr.Radio(["png", "html"], value="png", label=t("format", "en"), elem_id="export_fmt")
        c.export_btn = gr.Button(t("export_btn", "en"), elem_id="export_btn", size="sm")
        c.download = gr.File(label=t("download", "en"), elem_id="download", interactive=False)


def _calculators(c) -> None:
    """The whiteboard calculators: their own inputs, charts drawn by lab.js like every panel's."""
    # a Column, not a Group: Gradio writes a Group's elem_id on two nested divs (the page's ids must be unique)
    with gr.Column(elem_id="panel-calculators", elem_classes="il-calc"):
        c.calc_head = gr.HTML(calc_header_html("en"), elem_id="calc-head")
        cc, d = calc.choices("en", None, None), calc.DEFAULTS

        def label(name):
            return t(f"calc.label.{name}", "en")

        with gr.Row():
            c.c_model = gr.Dropdown(cc["model"], value=d["model"], label=label("model"), elem_id="calc_model",
                                    allow_custom_value=True)
            c.c_dtype = gr.Dropdown(cc["dtype"], value=d["dtype"], label=label("dtype"), elem_id="calc_dtype")
            c.c_gpu = gr.Dropdown(cc["gpu"], value=d["gpu"], label=label("gpu"), elem_id="calc_gpu",
                                  allow_custom_value=True)
        with gr.Row():
            c.c_context = gr.Number(value=d["context"], precision=0, label=label("context"), elem_id="calc_context")
            c.c_batch = gr.Number(value=d["batch"], precision=0, label=label("batch"), elem_id="calc_batch")
        with gr.Row():
            c.c_alpha = Slider(0, 1, value=d["alpha"], step=0.01, label=label("alpha"), elem_id="calc_alpha")
            c.c_k = Slider(1, 16, value=d["k"], step=1, label=label("k"), elem_id="calc_k")
            c.c_cost = Slider(0, 1, value=d["draft_cost"], step=0.01, label=label("draft_cost"),
                                 elem_id="calc_draft_cost")
        gr.HTML(calc_charts_html(), elem_id="calc-charts")
    c.calc_inputs = [c.c_model, c.c_dtype, c.c_context, c.c_batch, c.c_gpu, c.c_alpha, c.c_k, c.c_cost]


def _formats(c) -> None:
    """Weight formats side by side (app/formats_tool.py): which formats, how many tokens, one button."""
    with gr.Column(elem_id="panel-formats", elem_classes="il-formats"):
        c.f_head = gr.HTML(formats_tool.header_html("en"), elem_id="formats-head")
        with gr.Row():
            c.f_pick = gr.CheckboxGroup(formats_tool.format_choices(), value=formats_tool.format_choices(),
                                        label=t("formats.pick", "en"), elem_id="formats_pick")
            c.f_tokens = Slider(2, formats_tool.MAX_COMPARE_TOKENS, value=formats_tool.DEFAULT_TOKENS, step=1,
                                   label=t("formats.tokens", "en"), elem_id="formats_tokens")
        c.f_run = gr.Button(t("formats.run", "en"), elem_id="formats_run", size="sm")
        gr.HTML(formats_tool.charts_html(), elem_id="formats-charts")


def _wire_formats(c, f) -> None:
    # the status line says which format runs and how far it is; then the charts come
    c.f_run.click(f.compare_live, [c.f_pick, c.f_tokens, c.prompt, c.chat, c.system, c.lang], c.payload)

    def relabel(lang):
        return (formats_tool.header_html(lang), gr.update(label=t("formats.pick", lang)),
                gr.update(label=t("formats.tokens", lang)), gr.update(value=t("formats.run", lang)))

    c.lang.change(relabel, c.lang, [c.f_head, c.f_pick, c.f_tokens, c.f_run], show_progress="hidden")
    c.lang.change(f.redraw, c.lang, c.payload, show_progress="hidden")


def _hidden(c) -> None:
    """What lab.js writes and presses: the payload box, the charts in view, refresh, the socket ticket."""
    c.payload = gr.Textbox(visible=False, elem_id="payload")
    # set by lab.js: the chart containers in view (only those are built and sent)
    c.visible = gr.Textbox(value="", elem_id=IDS["visible"], elem_classes=HIDDEN, container=False)
    # the charts in view redrawn while the tab's socket is down (over the socket it is the "view" op)
    c.refresh = gr.Button("refresh", elem_id=IDS["refresh"], elem_classes=HIDDEN)
    # the sequence selector's way in while the tab's socket is down (it normally sends Focus over the socket)
    c.focus_pick = gr.Textbox(value="", elem_id=IDS["focus_pick"], elem_classes=HIDDEN, container=False)
    c.focus_go = gr.Button("focus", elem_id=IDS["focus_go"], elem_classes=HIDDEN)
    # the tab's socket ticket (a server-made secret, see SessionRegistry.ticket), handed to lab.js
    c.ticket = gr.Textbox(value="", elem_id="tab_ticket", elem_classes=HIDDEN, container=False)


# ---- events --------------------------------------------------------------------------------------------
def _wire_engine(c, h: LabHandlers) -> None:
    full = [c.prompt, c.chat, c.system, *c.sampling, *c.view, c.grammar]  # the grammar last: an optional argument
    c.payload.change(None, [c.payload], None, js=RENDER_JS)
    # every click is one step: the payload arrives over the websocket before Gradio finishes the event, so the
    # default trigger_mode ("once") would drop a quick second click. The sequence selector rides in the payload.
    c.step_btn.click(h.step, full, c.payload, concurrency_limit=None, show_progress="hidden",
                     trigger_mode="multiple")
    # no per-listener limit on Run: with Gradio's default of 1, one visitor's Run held every other visitor's
    # Run in the queue until it finished; the engine's steps interleave on the compute thread anyway
    run_ev = c.run_btn.click(h.run, full, c.payload, show_progress="hidden", concurrency_limit=None)
    c.pause_btn.click(h.pause, c.view, c.payload, cancels=[run_ev], queue=False, show_progress="hidden")
    c.add_btn.click(h.add, full, c.payload, show_progress="hidden")
    c.demo_btn.click(h.preemption_demo, c.view, [c.payload, c.temperature, c.max_tokens], cancels=[run_ev],
                     show_progress="hidden")
    # the first screen teaches before any step: the prompt box's template and tokens, redrawn as it changes
    for ctl in (c.prompt, c.chat, c.system):
        ctl.change(h.preview, [c.prompt, c.chat, c.system, *c.view], c.payload, trigger_mode="always_last",
                   show_progress="hidden")
    c.reset_btn.click(h.reset, [c.lang, c.visible], c.payload, cancels=[run_ev])
    for slider in (c.temperature, c.top_k, c.top_p, c.min_p, c.rep, c.freq, c.pres):
        slider.change(h.what_if, [*c.sampling, c.lang, c.visible, c.grammar], c.payload, trigger_mode="always_last",
                      show_progress="hidden")
    c.focus_go.click(h.focus, [c.focus_pick, *c.view], c.payload, show_progress="hidden")
    c.force_btn.click(h.force, [c.force_id, *c.view], c.payload, show_progress="hidden")
    c.rewind_btn.click(h.rewind, [c.rewind_n, c.branch, *c.view], c.payload, show_progress="hidden")
    # an example is a new question: its prompt (in the page's language) and grammar, or a prompt example's
    # prompt without an earlier example's grammar; a Run pauses, and the next Step starts it afresh
    for name, btn in c.grammar_ex.items():
        btn.click(_grammar_example(h, name), c.lang, [c.prompt, c.grammar, c.payload], cancels=[run_ev],
                  show_progress="hidden")
    c.examples.click(h.prompt_example, [c.examples, c.grammar, c.lang], [c.prompt, c.grammar, c.payload],
                     cancels=[run_ev], show_progress="hidden")
    # the notice by the prompt says whenever a grammar is set, wherever it came from; its button clears it
    for ctl in (c.grammar, c.lang):
        ctl.change(_notice, [c.grammar, c.lang], [c.grammar_notice, c.grammar_clear], show_progress="hidden",
                   trigger_mode="always_last")
    c.grammar_clear.click(lambda: "", None, c.grammar, show_progress="hidden")
    c.pair_stable.click(h.pair_stable, [*c.sampling, *c.view], c.payload, show_progress="hidden")
    c.pair_shuffled.click(h.pair_shuffled, [*c.sampling, *c.view], c.payload, show_progress="hidden")


def _grammar_example(h: LabHandlers, name: str):
    # a signature of its own (not functools.partial): Gradio injects `request` only into signatures it reads
    def pick(lang, request: gr.Request = None):
        return h.grammar_example(name, lang, request)
    return pick


def _notice(grammar, lang):
    """The grammar notice by the prompt, and its Clear button shown only while a grammar is set."""
    lang = lang_of(lang)
    return (grammar_examples.notice_html(grammar, lang),
            gr.update(visible=bool(str(grammar or "").strip()), value=t("grammar.clear", lang)))


def _wire_view(c, h: LabHandlers) -> None:
    for ctl in (c.layer, c.head):
        ctl.release(h.view, c.view, c.payload, show_progress="hidden", trigger_mode="always_last")
    c.word.submit(h.view, c.view, c.payload, show_progress="hidden")
    c.npos.submit(h.view, c.view, c.payload, show_progress="hidden")
    c.refresh.click(h.view, c.view, c.payload, show_progress="hidden", trigger_mode="always_last")


def _wire_lecture(c, h: LabHandlers) -> None:
    c.present_btn.click(h.present, [c.token, *c.view], c.payload, show_progress="hidden").then(
        h.lecture_status, c.lang, c.lecture_info)
    c.unpresent_btn.click(h.stop_presenting, c.lang, c.payload, show_progress="hidden").then(
        h.lecture_status, c.lang, c.lecture_info)
    c.load_btn.click(h.room_load, [c.prompt, c.max_tokens, c.temperature, c.lang], c.lecture_info,
                     show_progress="hidden")
    # polled only while the lecture box is open: an idle page should not cost the engine CPU time
    timer = gr.Timer(3.0, active=False)
    timer.tick(h.lecture_status, c.lang, c.lecture_info, show_progress="hidden")
    c.lecture_box.expand(lambda: gr.Timer(active=True), None, timer, show_progress="hidden").then(
        h.lecture_status, c.lang, c.lecture_info, show_progress="hidden")
    c.lecture_box.collapse(lambda: gr.Timer(active=False), None, timer, show_progress="hidden")


def _wire_tools(c, tools: ToolHandlers) -> None:
    tour_inputs = [*c.sampling, *c.view, c.grammar]
    for btn, fn in ((c.tour_start, tools.tour_start), (c.tour_next, tools.tour_next),
                    (c.tour_back, tools.tour_back)):
        btn.click(fn, tour_inputs, [c.payload, c.tour_box], show_progress="hidden")
    c.trace_export.click(tools.export_trace_live, c.lang, [c.download, c.payload])
    c.trace_load.upload(tools.load_trace, [c.trace_load, *c.view], c.payload)
    c.export_btn.click(tools.export_chart_live,
                       [c.export_chart, c.export_fmt, c.lang, c.layer, c.head, c.word, c.npos],
                       [c.download, c.payload])
    spec_inputs = [c.spec_on, c.spec_method, c.spec_k, c.spec_exit, c.spec_adaptive, c.lang]
    for ctl in (c.spec_on, c.spec_method, c.spec_adaptive, c.spec_k, c.spec_exit):
        ctl.change(tools.spec_settings, spec_inputs, c.payload, show_progress="hidden", trigger_mode="always_last")
    c.spec_measure.click(tools.spec_measure_live, c.view, c.payload)  # its status line says how far it is
    calc_inputs = [*c.calc_inputs, c.lang, c.visible]
    for ctl in (c.c_model, c.c_dtype, c.c_gpu):
        ctl.input(tools.calculators, calc_inputs, c.payload, show_progress="hidden")
    for ctl in (c.c_context, c.c_batch):
        ctl.submit(tools.calculators, calc_inputs, c.payload, show_progress="hidden")
    for ctl in (c.c_alpha, c.c_k, c.c_cost):
        ctl.release(tools.calculators, calc_inputs, c.payload, show_progress="hidden")


def _wire_language(c, h: LabHandlers, tools: ToolHandlers) -> None:
    """Every label follows the language switch; the panels redraw in it (their texts come with the payload),
    and so do the lines the server wrote into the page: the model's status, the tour's step, the lecture box."""
    c.lang.change(tools.calc_choices, [c.lang, c.c_model, c.c_gpu], [c.c_model, c.c_dtype, c.c_gpu]).then(
        tools.calculators, [*c.calc_inputs, c.lang, c.visible], c.payload, show_progress="hidden")
    keyed = [(ctl, "label", f"calc.label.{name}") for ctl, name in zip(c.calc_inputs, CALC_INPUTS)]
    keyed += [(c.lang, "label", "language"), (c.projector, "label", "projector"), (c.prompt, "label", "prompt"),
              (c.chat, "label", "chat"),
              (c.system, "label", "system"), (c.temperature, "label", "temperature"), (c.top_k, "label", "top_k"),
              (c.top_p, "label", "top_p"), (c.min_p, "label", "min_p"), (c.rep, "label", "repetition_penalty"),
              (c.freq, "label", "frequency_penalty"), (c.pres, "label", "presence_penalty"),
              (c.seed, "label", "seed"), (c.max_tokens, "label", "max_tokens"), (c.stop, "label", "stop"),
              (c.layer, "label", "layer"), (c.head, "label", "head"), (c.force_id, "label", "force"),
              (c.rewind_n, "label", "rewind"), (c.branch, "label", "branch_btn"), (c.word, "label", "word"),
              (c.npos, "label", "neighbour"), (c.step_btn, "value", "step"), (c.run_btn, "value", "run"),
              (c.pause_btn, "value", "pause"), (c.reset_btn, "value", "reset"), (c.add_btn, "value", "add"),
              (c.demo_btn, "value", "demo_preempt"),
              (c.force_btn, "value", "force_btn"), (c.rewind_btn, "value", "rewind_btn"),
              (c.lecture_box, "label", "lecture"), (c.token, "label", "token"), (c.present_btn, "value", "present"),
              (c.unpresent_btn, "value", "unpresent"), (c.load_btn, "value", "load_btn"),
              (c.spec_acc, "label", "spec_box"),
              (c.spec_on, "label", "spec_on"),
              (c.spec_k, "label", "spec_k"), (c.spec_exit, "label", "spec_exit"),
              (c.spec_adaptive, "label", "spec_adaptive"), (c.spec_measure, "value", "spec_measure"),
              (c.tour_acc, "label", "tour"), (c.tour_start, "value", "tour_start"),
              (c.tour_back, "value", "tour_back"), (c.tour_next, "value", "tour_next"),
              (c.trace_acc, "label", "trace_box"), (c.trace_export, "value", "trace_export"),
              (c.trace_load, "label", "trace_load"),
              (c.export_fmt, "label", "format"), (c.export_btn, "value", "export_btn"),
              (c.download, "label", "download"), (c.grammar_acc, "label", "grammar.box"),
              (c.grammar, "label", "grammar.label"), (c.pair_stable, "value", "grammar.pair_stable_btn"),
              (c.pair_shuffled, "value", "grammar.pair_shuffled_btn")]
    keyed += [(btn, "value", f"grammar.ex.{name}") for name, btn in c.grammar_ex.items()]

    def relabel(lang):
        return ([gr.update(**{attr: t(key, lang)}) for _, attr, key in keyed]
                + [gr.update(label=t("examples", lang), samples=[[e] for e in EXAMPLES[lang]]),
                   gr.update(label=t("spec_method", lang), choices=spec_methods(lang)),
                   gr.update(label=t("chart", lang), choices=chart_names(lang)),
                   header_html(lang), calc_header_html(lang)])

    choosers = [c.examples, c.spec_method, c.export_chart]  # their choices change language too
    c.lang.change(relabel, c.lang, [ctl for ctl, _, _ in keyed] + choosers + [c.header, c.calc_head])
    c.lang.change(h.language, c.view, c.payload, show_progress="hidden")
    c.lang.change(h.status, c.lang, [c.status, c.timer, c.layer, c.head], show_progress="hidden")
    c.lang.change(tools.tour_box, c.lang, c.tour_box, show_progress="hidden")
    c.lang.change(h.lecture_status, c.lang, c.lecture_info, show_progress="hidden")
    # the page's own language for the browser, screen readers and hyphenation (it stayed "en" in Russian)
    c.lang.change(None, c.lang, None, js="(lang) => { document.documentElement.lang = lang; return []; }")


def _wire_page(demo, c, h: LabHandlers, tools: ToolHandlers, registry: SessionRegistry) -> None:
    """Page load and unload: the model's status, the socket ticket, the calculators once the model is known."""
    preview = [c.prompt, c.chat, c.system, *c.view]
    c.projector.change(None, c.projector, None,
                       js="(on) => { if (window.inferlab) window.inferlab.projector(on); return []; }")
    # the status poll's last tick comes when the model is ready: the first screen's preview then
    c.timer.tick(h.status, c.lang, [c.status, c.timer, c.layer, c.head], show_progress="hidden").then(
        h.preview, preview, c.payload, show_progress="hidden")
    demo.load(h.status, c.lang, [c.status, c.timer, c.layer, c.head])
    demo.load(h.preview, preview, c.payload, show_progress="hidden")
    demo.load(h.hello, c.lang, [c.ticket, c.payload], show_progress="hidden", api_name="hello").then(
        None, c.ticket, None, js="(t) => { if (window.inferlab && t) window.inferlab.connect(t); return []; }")
    # the calculators once the model and this machine's numbers are known (the loaded model joins the list)
    calc_timer = gr.Timer(1.0)
    calc_timer.tick(tools.calc_ready, [*c.calc_inputs, c.lang, c.visible],
                    [c.c_model, c.c_dtype, c.c_gpu, c.payload, calc_timer], show_progress="hidden")

    def free_session(request: gr.Request):
        registry.drop(_key(request))  # also stops the lecture if this tab presented (registry.on_drop)

    demo.unload(free_session)
