"""The eight-stage strip at the top of the lab: which stages of inference the last step went through.

CSS classes: il-pipeline (container), il-stages (the row), il-stage (one stage; data-stage = its key),
il-lit (added to the stages the step used), il-stage-num, il-stage-name, il-arrow (the → between stages),
il-pipeline-summary ("step N · prefill 48 tok / decode 2 seqs · 35 ms").
"""
from __future__ import annotations

import html
from ..i18n import t, texts

STAGES = ("template", "tokens", "embeddings", "layers", "logits", "sampling", "detokenizer", "stream")


def lit_stages(event) -> set[str]:
    """The stages a step went through.

    template+tokens: a sequence was admitted or a prefill chunk ran; embeddings+layers+logits: a forward ran;
    sampling+detokenizer+stream: a token was sampled.
    """
    if event is None:
        return set()
    seqs = event.seqs
    lit: set[str] = set()
    if event.admitted or any(s.phase == "prefill" for s in seqs):
        lit |= {"template", "tokens"}
    if any(s.num_processed > 0 for s in seqs):
        lit |= {"embeddings", "layers", "logits"}
    if any(s.new_token is not None for s in seqs):
        lit |= {"sampling", "detokenizer", "stream"}
    return lit


def pipeline_summary(event, lang: str = "en") -> str:
    tx = texts("pipeline", lang)
    if event is None:
        return tx["none"]
    seqs = event.seqs
    parts = []
    pre = sum(s.num_processed for s in seqs if s.phase == "prefill")
    dec = sum(1 for s in seqs if s.phase == "decode")
    if pre:
        parts.append(tx["prefill"].format(n=pre))
    if dec:
        parts.append(tx["decode1"] if dec == 1 else tx["decode"].format(n=dec))
    work = " / ".join(parts) if parts else tx["idle"]
    out = f"{tx['step']} {event.step} · {work} · {event.timing.step_ms:.0f} {t('time_units', lang)[1]}"
    tm = event.timing
    if getattr(tm, "grammar_ms", 0.0) > tm.forward_ms:  # constrained decoding where the masks, not the model, cost most
        out += " · " + tx["grammar_dominates"].format(ms=tm.grammar_ms, fwd=tm.forward_ms)
    for key in ("preempted", "finished"):
        ids = getattr(event, key)
        if ids:  # "seq #0 finished": a bare "finished 0" read as a count of zero
            out += " · " + tx[key if len(ids) > 1 else key + "1"].format(ids=", ".join(f"#{i}" for i in ids))
    return out


def pipeline_html(event, lang: str = "en") -> str:
    tx = texts("pipeline", lang)
    lit = lit_stages(event)
    cells = []
    for i, key in enumerate(STAGES, 1):
        cls = "il-stage il-lit" if key in lit else "il-stage"
        cells.append(f'<div class="{cls}" data-stage="{key}"><span class="il-stage-num">{i}</span>'
                     f'<span class="il-stage-name">{html.escape(tx["names"][key])}</span></div>')
    strip = '<span class="il-arrow">→</span>'.join(cells)
    return (f'<div class="il-pipeline"><div class="il-stages">{strip}</div>'
            f'<div class="il-pipeline-summary">{html.escape(pipeline_summary(event, lang))}</div></div>')
