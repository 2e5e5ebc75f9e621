"""Examples in Chromium (issue 37): a grammar example's grammar is visibly set by the prompt and cleared by a
keyboard-reachable button; a prompt example (no grammar) clears the grammar an earlier example set; an example
picked while a sequence runs starts a new request at the next Step instead of continuing the old one. And the
page's `<html lang>` follows the language switch."""
import time

import pytest

from e2e_util import chromium_available, click_and_wait, open_lab, served_lab

pytestmark = pytest.mark.skipif(not chromium_available(), reason="Debian chromium is not installed")

YESNO = "choice: yes | no"


@pytest.fixture(scope="module")
def lab(base_engine):
    with served_lab(base_engine) as lab:
        yield lab


def grammar_box(page) -> str:
    return page.input_value("#grammar textarea")


def notice(page) -> str:
    """The grammar notice's text ("" when it shows nothing)."""
    return page.evaluate("() => { const el = document.querySelector('#grammar-notice .il-grammar-notice');"
                         " return el && el.checkVisibility() ? el.innerText : ''; }")


def pick_grammar_example(page, name: str) -> None:
    if not page.is_visible(f"#grammar_ex_{name}"):
        page.click("#grammar-box button, #grammar-box .label-wrap")  # open the accordion
    page.click(f"#grammar_ex_{name}")


def session_of(app, page):
    """The tab's session: the one whose requests the page's sequence selector lists."""
    for s in app.state.registry.sessions.values():
        if s.requests:
            return s
    return None


def test_a_grammar_example_is_visibly_set_and_cleared(lab):
    url, app, b = lab
    page = open_lab(b, url, height=1100)
    assert grammar_box(page) == "" and notice(page) == "" and not page.is_visible("#grammar_clear")

    pick_grammar_example(page, "yesno")
    page.wait_for_function("g => document.querySelector('#grammar textarea').value === g", arg=YESNO)
    page.wait_for_function("() => document.querySelector('#grammar-notice .il-grammar-notice')", timeout=30000)
    assert "Grammar set" in notice(page) and YESNO in notice(page)
    assert YESNO in page.get_attribute("#grammar-notice .il-grammar-notice", "title")
    # by the prompt: the notice sits right under the prompt box, wherever the grammar box itself is
    prompt, box = page.locator("#prompt").bounding_box(), page.locator("#grammar-notice").bounding_box()
    assert 0 <= box["y"] - (prompt["y"] + prompt["height"]) < 80, (prompt, box)
    assert page.is_visible("#grammar_clear")

    # cleared from the keyboard: Tab from the prompt box reaches the Clear button, Enter presses it
    page.focus("#prompt textarea")
    for _ in range(6):
        page.keyboard.press("Tab")
        if page.evaluate("() => !!document.activeElement.closest('#grammar_clear')"):
            break
    assert page.evaluate("() => !!document.activeElement.closest('#grammar_clear')"), "Clear is not reachable by Tab"
    page.keyboard.press("Enter")
    page.wait_for_function("() => document.querySelector('#grammar textarea').value === ''", timeout=30000)
    page.wait_for_function("() => !document.querySelector('#grammar-notice .il-grammar-notice')", timeout=30000)
    assert not page.is_visible("#grammar_clear")

    # a prompt example has no grammar: it clears the one the yes/no example set, and the Step runs without it
    pick_grammar_example(page, "yesno")
    page.wait_for_function("g => document.querySelector('#grammar textarea').value === g", arg=YESNO)
    page.click("#examples >> text=List three uses of Python.")
    page.wait_for_function("() => document.querySelector('#prompt textarea').value === 'List three uses of Python.'")
    page.wait_for_function("() => document.querySelector('#grammar textarea').value === ''", timeout=30000)
    page.wait_for_function("() => !document.querySelector('#grammar-notice .il-grammar-notice')", timeout=30000)
    click_and_wait(page, "#step")
    s = session_of(app, page)
    seq = s.engine.sequences[s.focus]
    assert seq.params.grammar is None and s.requests[s.focus].prompt == "List three uses of Python."

    # a grammar the user wrote is theirs: a prompt example leaves it, and the notice shows it too
    page.fill("#grammar textarea", "regex: [a-z ]+")
    page.wait_for_function("() => (document.querySelector('#grammar-notice') || {}).innerText"
                           "?.includes('regex: [a-z ]+')", timeout=30000)
    page.click("#examples >> text=Write a haiku about the Moon.")
    page.wait_for_function("() => document.querySelector('#prompt textarea').value.includes('haiku')")
    time.sleep(0.5)
    assert grammar_box(page) == "regex: [a-z ]+" and "regex: [a-z ]+" in notice(page)

    # in Russian: the notice and its button, the page's lang, and milliseconds as «мс»
    page.click("#lang label:has-text('Русский')")
    page.wait_for_function("() => document.documentElement.lang === 'ru'", timeout=30000)
    page.wait_for_function("() => (document.querySelector('#grammar-notice') || {}).innerText"
                           "?.includes('Задана грамматика')", timeout=30000)
    assert "Убрать грамматику" in page.inner_text("#grammar_clear")
    page.wait_for_function("() => document.querySelector('#html-pipeline').innerText.includes('шаг')",
                           timeout=30000)
    summary = page.inner_text("#html-pipeline")
    assert " мс" in summary and " ms" not in summary, summary
    page.click("#lang label:has-text('English')")
    page.wait_for_function("() => document.documentElement.lang === 'en'", timeout=30000)
    page.close()


def test_an_example_picked_while_a_sequence_runs_starts_a_new_request(lab):
    url, app, b = lab
    page = open_lab(b, url, height=1100)
    page.fill("#max_tokens input", "200")
    click_and_wait(page, "#step")
    s = session_of(app, page)
    old = s.focus
    page.click("#run")
    page.wait_for_function(f"() => window.inferlab.state.renders > {page.evaluate('() => window.inferlab.state.renders')} + 2",
                           timeout=60000)
    pick_grammar_example(page, "yesno")
    # the Run pauses and the page says what the next Step does
    page.wait_for_function("() => document.querySelector('#html-message').innerText.includes('new request')",
                           timeout=60000)
    assert f"#{old}" in page.inner_text("#html-message")
    deadline = time.time() + 30
    while s.running and time.time() < deadline:
        time.sleep(0.1)
    assert not s.running and not s.engine.seq_view(old).finished  # paused, not finished

    click_and_wait(page, "#step")
    new = s.focus
    assert new != old and s.requests[new].prompt == "Is the sky blue? Answer yes or no."
    assert s.engine.seq_view(old).finish_reason == "abort"  # the old answer stopped, it did not go on
    assert s.engine.sequences[new].params.grammar is not None
    page.wait_for_function("n => document.querySelector('#html-message').innerText.includes('New request #' + n)",
                           arg=new, timeout=30000)
    # the selector shows the new request, and the old one as stopped
    options = page.eval_on_selector_all("#focus-select option, select option", "els => els.map(e => e.textContent)")
    assert any(o.startswith(f"#{new}") for o in options) and any(o.startswith(f"#{old}") and "abort" in o
                                                                    for o in options), options
    page.close()


def test_an_out_of_range_value_is_a_toast_and_no_traceback(lab, capfd):
    """A value typed past a slider's range: the page clamps it and says so in a toast (EN and RU); the server's
    console gets one line, not a traceback (issue 37)."""
    url, app, b = lab
    page = open_lab(b, url, height=1100)
    capfd.readouterr()
    for box, typed, limit in (("#temperature", "99", "2"), ("#top_k", "-5", "0"), ("#layer", "77", "29")):
        page.fill(f"{box} input[type=number]", typed)
        page.keyboard.press("Enter")
        page.click("body", position={"x": 5, "y": 5})
        page.wait_for_function("t => [...document.querySelectorAll('.toast-body, [data-testid=toast-body]')]"
                               ".some(e => e.innerText.includes(t))", arg=f"{typed} is ", timeout=30000)
        page.wait_for_function("([b, l]) => Number(document.querySelector(b + ' input[type=number]').value) === l",
                               arg=[box, float(limit)], timeout=30000)
    time.sleep(1)
    err = capfd.readouterr().err
    assert "Traceback" not in err and "gradio.exceptions.Error" not in err, err[-3000:]
    toasts = page.evaluate("() => [...document.querySelectorAll('.toast-body, [data-testid=toast-body]')]"
                           ".map(e => e.innerText).join(' ')")
    assert "99 is above the slider's maximum 2" in toasts and "99 больше максимума ползунка 2" in toasts
    page.close()
