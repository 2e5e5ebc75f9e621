"""Browser test of constrained decoding (issue 15): pick the JSON example, Run, and the sampling chain shows the
grammar stage with masked tokens while the answer parses under the schema; the prefix-cache pitfall pair shows
shared blocks for a stable schema and none for a shuffled one."""
import json
import re
import time

import jsonschema
import pytest

from app.grammar_examples import PERSON
from e2e_util import TEST_SHOTS, chromium_available, ensure_drawn, open_lab, served_lab

pytestmark = pytest.mark.skipif(not chromium_available(), reason="Debian chromium is not installed")
SHOTS = TEST_SHOTS


def pair_cached(page, button: str, says: str) -> int:
    """Click a pitfall-pair button; the prompt tokens its second request found in the prefix cache."""
    page.click(button)
    try:
        page.wait_for_function("txt => document.querySelector('#html-message').innerText.includes(txt)", arg=says,
                               timeout=120000)
    except Exception as exc:  # say what the page said instead
        raise AssertionError(f"{button}: {page.inner_text('#html-message')!r}") from exc
    return int(re.search(r"found (\d+) prompt tokens", page.inner_text("#html-message")).group(1))


def test_json_example_runs_under_the_grammar(base_engine):
    with served_lab(base_engine) as (url, app, b):
        page = open_lab(b, url, height=1400)
        page.click("#grammar-box button, #grammar-box .label-wrap")  # open the accordion
        page.click("#grammar_ex_json")
        page.wait_for_function("() => document.querySelector('#grammar textarea').value.startsWith('json:')",
                               timeout=30000)
        assert "JSON" in page.input_value("#prompt textarea")
        page.click("#run")
        registry = app.state.registry
        deadline = time.time() + 300
        session = seq = None
        while time.time() < deadline:
            session = next((s for s in registry.sessions.values() if s.requests), None)
            seq = session.engine.sequences.get(session.focus) if session is not None else None
            if seq is not None and seq.finish_reason is not None:
                break
            time.sleep(0.2)
        assert seq is not None and seq.finish_reason == "grammar", seq and (seq.finish_reason, seq.detok.text)
        answer = json.loads(seq.detok.text)
        jsonschema.validate(answer, PERSON)
        assert seq.params.grammar is not None and seq.params.grammar.kind == "json_schema"
        # the page shows that state: the stream holds the answer; the chain has the grammar stage, masked rows grey
        page.evaluate("() => window.inferlab.refresh()")
        page.wait_for_function("txt => document.querySelector('#html-stream').innerText.includes(txt)",
                               arg=seq.detok.text[:12], timeout=60000)
        ensure_drawn(page, "chart-sampling")
        page.wait_for_function("""() => { const el = document.getElementById('chart-sampling');
            return el.data.some(t => t.name === 'grammar'); }""", timeout=60000, polling=250)
        stage = page.evaluate("""() => document.getElementById('chart-sampling').data
            .find(t => t.name === 'grammar')""")
        last = session.events[-1].seq(seq.seq_id).sampling
        grammar = next(s for s in last.stages if s.name == "grammar")
        assert stage["x"] == pytest.approx(grammar.probs, abs=1e-9)
        masked = [i for i, k in enumerate(grammar.kept) if not k]
        assert masked and all(stage["text"][i] == "✕" for i in masked)  # the masked tracked tokens, greyed
        title = page.evaluate("() => JSON.stringify(document.getElementById('chart-sampling').layout.title)")
        assert re.search(r"grammar: [\d,]+ of 49,152 tokens allowed", title)
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.locator("#chart-sampling").screenshot(path=str(SHOTS / "grammar.png"))

        # the prefix-cache pitfall, one click each: the stable schema shares its blocks, the shuffled one none
        stable = pair_cached(page, "#grammar_pair_stable", "keys in the same order")
        shuffled = pair_cached(page, "#grammar_pair_shuffled", "keys shuffled")
        assert stable >= 3 * base_engine.block_size and shuffled == 0
        page.close()
