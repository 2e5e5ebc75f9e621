"""What counts as English on the Russian page: Latin words outside a short list of things Russian text writes
the same way. Shared by the fast check of the payloads (tests/test_i18n.py) and the browser's
(tests/test_e2e_i18n.py)."""
from __future__ import annotations

import re
from html.parser import HTMLParser

# Written the same way in Russian text (compared lower-case). Nothing else Latin may stand on the Russian page.
ALLOWED = {
    # names: the lab, models and their makers, a serving engine, a chat format; the language switch names English
    # in English
    "inferlab", "smollm", "llama", "qwen", "mistral", "huggingfacetb", "hugging", "face", "vllm", "chatml", "english",
    # abbreviations Russian ML texts keep
    "llm", "kv", "bpe", "utf", "gpu", "cpu", "ram", "pca", "eos", "gqa", "gguf", "ttft", "tpot", "sxm", "rtx", "api",
    # terms Russian ML people write in Latin
    "top-k", "top-p", "min-p", "softmax", "roofline", "kl",  # KL-дивергенция
    # abbreviations of measures and mathematical notation, written in Latin in Russian texts too
    "itl", "cow", "cdf", "max", "min", "norm", "log", "argmax",
    # units, formats and code
    "ms", "tok/s", "kib", "mib", "gib", "id", "hex", "mod", "png", "html", "json",
}

# A word: Latin letters, digits and the joiners that keep "top-k", "tok/s" or "UTF-8" whole.
_WORD = re.compile(r"/?[A-Za-z][A-Za-z0-9_'’./-]*[A-Za-z0-9]|/?[A-Za-z]")
# Shown data, not UI text: anything quoted «like this» (token text, prompt words) and bytes ⟨d0 bf⟩.
_QUOTED = re.compile(r"«[^»]*»|⟨[^⟩]*⟩")
_TAG = re.compile(r"<[^>]*>")


def english(text: str) -> list[str]:
    """The Latin words in `text` that Russian text would not write as they are."""
    text = _QUOTED.sub(" ", _TAG.sub(" ", str(text or "")))
    text = text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&").replace("&nbsp;", " ")
    out = []
    for word in _WORD.findall(text):
        if _same_in_russian(word):
            continue
        out.append(word)
    return out


def _same_in_russian(word: str) -> bool:
    if word.startswith("/"):
        return True  # a path on this server: /follow
    w = word.lower().strip(".'’/-")
    if len(w) <= 1 or w in ALLOWED:
        return True  # one letter is a variable: k, p, q, u, α's neighbours
    if any(ch.isdigit() for ch in w) or "_" in w:
        return True  # an identifier: fp32, Q4_1, H100, SmolLM2-135M, max_tokens
    parts = re.split(r"[-/.]", w)
    return len(parts) > 1 and all(len(p) <= 1 or p in ALLOWED or any(c.isdigit() for c in p) for p in parts)


NO_LEGEND = {"heatmap", "table", "contour", "histogram2d"}  # traces Plotly leaves out of the legend by default


def figure_texts(fig: dict) -> list[str]:
    """The words a Plotly figure shows besides its data: title, axis titles, annotations (axis titles and
    legend keys are annotations here, app/charts/common.py), legend entries, colour-bar titles, table headers
    and the text of hover templates."""
    lay = fig.get("layout") or {}
    out = [_text(lay.get("title"))]
    out += [str(a.get("text") or "") for a in lay.get("annotations") or []]
    for key, axis in lay.items():
        if re.fullmatch(r"[xy]axis\d*", key) and isinstance(axis, dict):
            out.append(_text(axis.get("title")))
    out.append(_text(((lay.get("coloraxis") or {}).get("colorbar") or {}).get("title")))
    for trace in fig.get("data") or []:
        in_legend = trace.get("showlegend", trace.get("type", "scatter") not in NO_LEGEND)
        if lay.get("showlegend") and in_legend and trace.get("name"):
            out.append(str(trace["name"]))
        # a hover template is UI text around the data it names (%{...}); <extra> holds the trace's name
        out.append(re.sub(r"%\{[^}]*\}|<extra>.*?</extra>", " ", str(trace.get("hovertemplate") or "")))
        out.append(_text((trace.get("colorbar") or {}).get("title")))
        header = (trace.get("header") or {}).get("values")
        if header:
            out += [str(h) for h in header]
    return [x for x in out if x]


def _text(title) -> str:
    return str(title.get("text") or "") if isinstance(title, dict) else str(title or "")


# HTML the page shows that is data, not UI text: the model's own text and the tokens cut from it
DATA_CLASSES = {"il-template", "il-chips", "il-stream-text", "il-held", "il-sym"}


class _Visible(HTMLParser):
    """The text of an HTML piece as the page shows it, without the data elements (DATA_CLASSES)."""

    def __init__(self):
        super().__init__()
        self.out, self.stack = [], []

    def handle_starttag(self, tag, attrs):
        if tag in ("br", "img", "input", "hr", "wbr"):
            return
        classes = set((dict(attrs).get("class") or "").split())
        self.stack.append(bool(classes & DATA_CLASSES))

    def handle_endtag(self, tag):
        if self.stack and tag not in ("br", "img", "input", "hr", "wbr"):
            self.stack.pop()

    def handle_data(self, data):
        if not any(self.stack):
            self.out.append(data)


def html_text(piece: str) -> str:
    p = _Visible()
    p.feed(piece)
    return " ".join(p.out)
