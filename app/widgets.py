"""The Gradio components the lab adjusts: a slider that answers an out-of-range value with a toast alone.

A value typed into a slider's number box past its range (99 for a temperature of at most 2) reaches the server
with the event it fires, before the page clamps the box: Gradio refuses it with a toast, which is right, and
printed a traceback in the server's console, which is not (bad input is the visitor's, not a server fault).
(Gradio writes app/widgets.pyi, a type stub for its event methods, whenever this module is imported: ignored.)
"""
from __future__ import annotations

import logging

import gradio as gr

from .i18n import LANGS, t

log = logging.getLogger("inferlab")


class Slider(gr.Slider):
    def preprocess(self, payload):
        try:
            return super().preprocess(payload)
        except gr.Error:
            low = payload < self.minimum
            limit = self.minimum if low else self.maximum
            # the event carries no language: the toast says it in both
            text = " · ".join(t("range.low" if low else "range.high", lang).format(value=payload, limit=limit)
                              for lang in LANGS)
            log.info("%s: %r is outside %s..%s (the page clamps it)", self.elem_id or "a slider", payload,
                     self.minimum, self.maximum)
            raise gr.Error(text, print_exception=False) from None
