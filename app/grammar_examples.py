"""Constrained decoding in the lab: the grammar box's text format and the one-click examples (issue 15).

The grammar box holds `kind: source`, one of
    json: {"type": "object", ...}        a JSON Schema
    regex: \\d{4}-\\d{2}-\\d{2}            the whole answer must match
    ebnf: start: ...                     Lark syntax as llguidance reads it (or GBNF, `root ::= ...`)
    choice: yes | no                     one of these answers
An empty box is no grammar. `parse` turns the box into an engine Grammar, or a Refusal naming the problem.
"""
from __future__ import annotations

import html
import json

from engine import Grammar
from engine.grammar import MAX_GRAMMAR_CHARS

from .i18n import Phrase, Refusal, t

MAX_BOX_CHARS = MAX_GRAMMAR_CHARS + 16  # the grammar and its "kind:" prefix
KINDS = {"json": "json_schema", "json_schema": "json_schema", "regex": "regex", "ebnf": "ebnf", "choice": "choice"}

PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 20},
                         "age": {"type": "integer", "minimum": 0, "maximum": 150}},
          "required": ["name", "age"], "additionalProperties": False}

# name -> the grammar box's text; the buttons' labels are i18n "grammar.ex.<name>", the prompts "grammar.prompt.<name>"
EXAMPLES = {
    "json": "json: " + json.dumps(PERSON, ensure_ascii=False),
    "date": r"regex: \d{4}-\d{2}-\d{2}",
    "yesno": "choice: yes | no",
}

# The prefix-cache pitfall: the same schema sent twice at the start of the system prompt, its keys once in the
# same order and once shuffled. A block is shared only if every token before it and in it is the same, so the
# shuffled copy diverges at its first key and shares no block. (json.dumps keeps dict order: stable output
# needs a stable dict, or sort_keys=True.)
PAIR_SCHEMA = {"type": "object",
               "properties": {"name": {"type": "string", "maxLength": 20},
                              "age": {"type": "integer", "minimum": 0, "maximum": 150},
                              "city": {"type": "string", "maxLength": 20}},
               "required": ["name", "age", "city"], "additionalProperties": False}
PAIR_SHUFFLED = {"additionalProperties": False, "required": ["city", "name", "age"],
                 "properties": {"city": PAIR_SCHEMA["properties"]["city"],
                                "age": PAIR_SCHEMA["properties"]["age"],
                                "name": PAIR_SCHEMA["properties"]["name"]},
                 "type": "object"}
PAIR_MAX_TOKENS = 40  # a JSON object of three short fields; two such requests fit a visitor's share of the pool
# the two requests' user prompts: i18n "grammar.pair_prompt_a" and "grammar.pair_prompt_b"


def after_prompt_example(grammar) -> str:
    """The grammar box once a prompt example (which has no grammar) is picked: a grammar one of EXAMPLES put
    there goes (it was that example's, not the next question's: "List three uses of Python." was answered
    "no"); a grammar the user wrote stays."""
    return "" if str(grammar or "").strip() in {g.strip() for g in EXAMPLES.values()} else str(grammar or "")


NOTICE_CHARS = 36  # of the grammar shown in the notice, one line of the controls column (its title has all)


def notice_html(grammar, lang: str) -> str:
    """The notice by the prompt box while a grammar is set ("" when none): a grammar changes every answer, so
    it must not be set unseen, in a box far from the prompt."""
    whole = " ".join(str(grammar or "").split())
    if not whole:
        return ""
    text = whole if len(whole) <= NOTICE_CHARS else whole[:NOTICE_CHARS - 1] + "…"
    title = t("grammar.notice_title", lang).format(grammar=whole[:300])
    return (f'<div class="il-grammar-notice" role="status" title="{html.escape(title)}">'
            f'<b>{html.escape(t("grammar.notice", lang))}</b> <code>{html.escape(text)}</code></div>')


def pair_system(schema: dict) -> str:
    """The system prompt of the pitfall pair: the schema first (so nothing before it can be shared), then the ask."""
    return json.dumps(schema, ensure_ascii=False) + "\nAnswer with one JSON object that matches this schema."


def parse(text) -> Grammar | None:
    """The grammar box as an engine Grammar (None when empty); a Refusal with the problem otherwise."""
    if text is None or not str(text).strip():
        return None
    if not isinstance(text, str):
        raise Refusal("grammar.type")
    if len(text) > MAX_BOX_CHARS:
        raise Refusal("text_long", name=Phrase("name.grammar"), n=len(text), limit=MAX_BOX_CHARS)
    kind, sep, source = text.partition(":")
    kind = kind.strip().lower()
    if not sep or kind not in KINDS:
        raise Refusal("grammar.kind", got=kind[:20])
    source = source.strip()
    try:
        if KINDS[kind] == "json_schema":
            return Grammar.json_schema(source)
        if KINDS[kind] == "choice":
            return Grammar.choice([o.strip() for o in source.split("|") if o.strip()])
        return Grammar(KINDS[kind], source)
    except ValueError as exc:
        raise Refusal("grammar.bad", detail=str(exc)[:300]) from None
