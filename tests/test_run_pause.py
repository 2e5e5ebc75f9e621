"""Pause during a Run (issue 37): the page's last frame is where the engine stopped, so the next Step adds one
token. A Run's frames are paced (Room.frame_interval) while the engine steps on, and Pause waits for the step
in flight: those steps used to be kept after the last frame and never drawn, so after Pause the counter read
130 and the next Step took it to 133."""
import json
import threading
from types import SimpleNamespace

from app.handlers import LabHandlers
from app.server import ModelHolder
from app.session import LabSession, SessionRegistry
from engine import SamplingParams

PROMPT = "Write a long story about a dragon."


def generated(s: LabSession) -> int:
    v = s.focus_view()
    return len(v.token_ids) - len(v.prompt_ids)


def test_the_last_frame_after_pause_shows_every_step_and_the_next_step_adds_one(base_engine):
    s = LabSession.create(base_engine, kv_memory=64 * 1024 * 1024)
    s.add_request(PROMPT, SamplingParams(max_tokens=200, temperature=0.0), True, None)
    frames: list[int] = []  # the focused sequence's tokens as each frame (what the page draws) found them
    second = threading.Event()

    def page():
        for _ in s.run_steps():
            frames.append(generated(s))
            if len(frames) == 2:
                second.set()

    runner = threading.Thread(target=page)
    runner.start()
    assert second.wait(120)
    # the frame was drawn and the run waits out its frame interval while the engine steps on; Pause now (it
    # also waits for the step in flight, whose event arrives after the frame)
    threading.Event().wait(0.1)
    s.pause()
    runner.join(60)
    assert not runner.is_alive()
    stopped = generated(s)
    assert stopped < 200  # the pause, not max_tokens, ended the run
    assert frames[-1] == stopped, (frames, stopped)  # the page's last frame shows every step that ran
    assert s.events[-1].seq(s.focus).num_tokens == len(s.focus_view().token_ids)  # and the session kept its event
    s.step()
    assert generated(s) == stopped + 1
    s.close()


def test_pause_answers_with_the_page_where_the_engine_stopped(base_engine):
    """Pause is a Gradio event that also cancels a Run going through Gradio (the tab's socket down): its own
    answer is the page after the pause, whichever way the Run went."""
    registry = SessionRegistry(base_engine, kv_memory=32 * 1024 * 1024)
    holder = ModelHolder(ready=True, model_id=base_engine.model_id, spec=base_engine.spec,
                         machine={"bandwidth": 20e9, "peak_flops": 100e9})
    h = LabHandlers(registry, holder)
    request = SimpleNamespace(session_hash="tab-p")
    sampling = [0.0, 0, 1.0, 0.0, 1.0, 0.0, 0.0, 1, 200, ""]
    view = ["en", 0, 0, "", None, ""]
    run = h.run(PROMPT, True, "", *sampling, *view, request=request)
    next(run)
    s = registry.sessions["tab-p"]
    out = json.loads(h.pause(*view, request=request))
    run.close()  # what Gradio's cancel leaves of the Run
    stopped = generated(s)
    assert stopped < 200 and not s.room.running(s.owner)
    # the answer is drawn from the last step that ran: the pipeline names it, and that step's event holds
    # every token the engine generated
    last = s.events[-1]
    assert f"step {last.step} ·" in out["html"]["html-pipeline"]
    assert last.seq(s.focus).num_tokens == len(s.focus_view().token_ids)
    registry.drop("tab-p")
