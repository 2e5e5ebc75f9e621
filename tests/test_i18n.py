"""The translation table (app/i18n.py) is whole, it is the only one, and nothing the server draws for a
Russian page is English (tests/i18n_check.py says what counts)."""
import ast
import json
import re
import string
from pathlib import Path
from types import SimpleNamespace

import pytest

from app import calculators as calc
from app import render
from app.delivery import Delivery
from app.handlers import LabHandlers
from app.i18n import LANGS, PANEL_KEYS, UI, Phrase, Refusal, t, texts
from app.server import ModelHolder
from app.session import LabFull, SessionRegistry
from app.ui import CALC_INPUTS, SPEC_METHODS
from engine import SpeculativeConfig
from i18n_check import english, figure_texts, html_text

APP = Path(__file__).resolve().parent.parent / "app"
MACHINE = {"bandwidth": 20e9, "peak_flops": 100e9}
# plural forms: English has two (1 token, 2 tokens), Russian three (1 токен, 2 токена, 5 токенов)
PLURALS = {k for k in UI if k.startswith("calc_word.")}


def _fields(text: str) -> set[str]:
    return {f for _, f, _, _ in string.Formatter().parse(text) if f}


def _same_shape(key, en, ru) -> None:
    assert type(en) is type(ru), key
    if isinstance(en, str):
        assert en.strip() and ru.strip(), f"{key}: empty text"
        assert _fields(en) == _fields(ru), f"{key}: the languages format different fields"
    elif isinstance(en, dict):
        assert en.keys() == ru.keys(), key
        for k in en:
            _same_shape(f"{key}.{k}", en[k], ru[k])
    else:
        assert key in PLURALS or len(en) == len(ru), key
        for a, b in zip(en, ru):
            assert a.strip() and b.strip(), f"{key}: empty text"


def test_every_key_has_both_languages_and_the_same_fields():
    for key, entry in UI.items():
        assert isinstance(entry, dict) and set(entry) == set(LANGS), key
        _same_shape(key, entry["en"], entry["ru"])


def _app_sources():
    return {p: p.read_text(encoding="utf-8") for p in APP.rglob("*.py")}


def test_every_key_the_code_names_is_in_the_table():
    named = set()
    for src in _app_sources().values():
        named |= set(re.findall(r'\b(?:t|Refusal|Phrase)\(\s*"([\w.]+)"', src))
        named |= {f"{s}." for s in re.findall(r'\btexts\(\s*"(\w+)"', src)}
    # keys the code builds from a name: the panels, the calculators' inputs, the sequence states
    named |= {f"panel.{k}.{part}" for k in PANEL_KEYS for part in ("title", "text")}
    named |= {f"calc.label.{k}" for k in CALC_INPUTS}
    named |= {f"spec_method.{m}" for m in SPEC_METHODS}
    named |= {f"chart_name.{cid}" for cid in render.CHART_IDS}
    named |= {f"seq_status.{s}" for s in ("waiting", "running", "finished", "eos", "stop", "length", "abort")}
    missing = {k for k in named if not (k in UI or k.endswith(".") and any(u.startswith(k) for u in UI))}
    assert not missing


def test_there_is_no_second_translation_table():
    """No {"en": ..., "ru": ...} dict and no per-language TEXT table outside app/i18n.py."""
    found = []
    for path, src in _app_sources().items():
        if path.name == "i18n.py":
            continue
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Dict):
                keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
                if "ru" in keys:
                    found.append(f"{path.name}:{node.lineno}")
    assert not found


def test_refusals_speak_the_tabs_language():
    d = Delivery(SimpleNamespace(max_sessions=3), SimpleNamespace(error=""))

    def shown(exc, lang):
        return json.loads(d.error(exc, lang))["html"]["html-message"]

    assert "Запрос не должен быть пустым" in shown(Refusal("empty_prompt"), "ru")
    assert "prompt must not be empty" in shown(Refusal("empty_prompt"), "en")
    assert "3" in shown(LabFull(3), "ru") and "заполнена" in shown(LabFull(3), "ru")
    nested = Refusal("text_long", name=Phrase("name.system"), n=9000, limit=4000)
    assert str(nested) == "system prompt is 9000 characters; the lab accepts up to 4000"
    assert nested.text("ru") == "Поле «системный промпт»: 9000 символов, а лаборатория принимает не больше 4000."
    assert t("seed", "junk") == t("seed", "en")  # anything but "ru" a client sends is English
    with pytest.raises(KeyError):
        t("no such key", "ru")


@pytest.fixture(scope="module")
def russian_page(base_engine):
    """The payloads of a Russian page: before any step, and after steps of an English prompt (so tokens in
    titles are English words: they must be quoted as data) with speculative decoding on, and calculators."""
    registry = SessionRegistry(base_engine, kv_memory=32 * 1024 * 1024)
    holder = ModelHolder(ready=True, model_id=base_engine.model_id, spec=base_engine.spec, machine=MACHINE)
    h = LabHandlers(registry, holder)
    tab = SimpleNamespace(session_hash="ru-tab")
    view = ["ru", 3, 2, "", None, ""]
    before = json.loads(h.view(*view, request=tab))
    registry.sessions["ru-tab"].speculative = SpeculativeConfig("ngram", num_tokens=3)
    sampling = [0.7, 0, 1.0, 0.0, 1.0, 0.0, 0.0, 1, 12, ""]
    for _ in range(4):
        h.step("What is gravity? Gravity is", True, "", *sampling, *view, request=tab)
    h.add("Name a fruit.", True, "", *sampling, *view, request=tab)
    s = registry.sessions["ru-tab"]
    after = render.build_payload(s, "ru", 3, 2, "", None, MACHINE)
    calcs = calc.calculator_payload(lang="ru", live=calc.live_model_preset_from_engine(base_engine), machine=MACHINE)
    empty = render.build_payload(s.__class__.create(s.room), "ru", 0, 0, "", None, None)
    return [before, after, calcs, empty]


def test_no_chart_or_panel_of_a_russian_page_is_english(russian_page):
    bad = {}
    for payload in russian_page:
        for cid, fig in payload["figs"].items():
            for text in figure_texts(fig):
                if english(text):
                    bad.setdefault(cid, []).append(text)
        for hid, piece in payload["html"].items():
            text = html_text(piece)
            if english(text):
                bad.setdefault(hid, []).append(text)
    assert not bad, json.dumps(bad, ensure_ascii=False, indent=1)


def test_russian_texts_of_the_table_are_russian():
    """The table's own Russian texts, with the fields they are formatted with left out."""
    def walk(v):
        if isinstance(v, str):
            yield v
        else:
            for x in (v.values() if isinstance(v, dict) else v):
                yield from walk(x)

    bad = {key: words for key, entry in UI.items() for text in walk(entry["ru"])
           if (words := english(re.sub(r"%?\{[^}]*\}", " ", text)))}
    assert not bad
