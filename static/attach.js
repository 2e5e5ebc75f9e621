// Attach mode's page (app/attach_server.py): sends the prompt, draws each frame the server streams back (one JSON
// object per line: figures for Plotly.react, HTML for the panels), polls the attached server's metrics.
(function () {
  const cfg = window.ATTACH || {lang: "en"};
  const $ = (id) => document.getElementById(id);
  const state = {frames: 0, metrics: 0, done: false, tokens: 0};
  window.attach = {state};

  function draw(frame) {
    for (const [id, fig] of Object.entries(frame.figs || {})) {
      const el = $(id);
      if (el) Plotly.react(el, fig.data, fig.layout, {displaylogo: false, responsive: true});
    }
    for (const [id, html] of Object.entries(frame.html || {})) {
      const el = $(id);
      if (el) el.innerHTML = html;
    }
  }

  function value(id) { return $(id).value; }

  async function send() {
    const button = $("attach-send");
    button.disabled = true;
    button.textContent = cfg.sending;
    $("attach-status").textContent = "";
    state.done = false;
    const body = {prompt: value("attach-prompt"), system: value("attach-system"), lang: cfg.lang,
                  temperature: value("attach-temperature"), max_tokens: value("attach-max-tokens"),
                  top_n: value("attach-top-n"), seed: value("attach-seed")};
    try {
      const r = await fetch("/attach/ask", {method: "POST", headers: {"Content-Type": "application/json"},
                                           body: JSON.stringify(body)});
      if (!r.ok) {
        $("attach-status").textContent = (await r.json()).error || r.statusText;
        return;
      }
      const reader = r.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const {value: chunk, done} = await reader.read();
        if (done) break;
        buffer += decoder.decode(chunk, {stream: true});
        let nl;
        while ((nl = buffer.indexOf("\n")) >= 0) {
          const frame = JSON.parse(buffer.slice(0, nl));
          buffer = buffer.slice(nl + 1);
          draw(frame);
          state.frames += 1;
          state.tokens = frame.tokens;
          const slider = $("attach-step");
          slider.max = Math.max(0, frame.tokens - 1);
          slider.value = slider.max;
          if (frame.done) state.done = true;
        }
      }
    } catch (err) {
      $("attach-status").textContent = String(err);
    } finally {
      button.disabled = false;
      button.textContent = cfg.send;
    }
  }

  async function top() {
    const r = await fetch(`/attach/top?i=${value("attach-step")}&lang=${cfg.lang}`);
    if (r.ok) draw(await r.json());
  }

  // Every 2 s while the server has metrics; after it answered that it has none (a 404: llama-cpp-python's server)
  // as often as this page's server says it asks again (2 s, doubling to a minute); when this page's own server
  // does not answer, doubling too. state.polls and state.delay let tests read the pace.
  const POLL_MS = 2000, MAX_POLL_MS = 60000;
  state.polls = 0;
  state.delay = POLL_MS;
  async function metrics() {
    let delay = POLL_MS;
    try {
      state.polls += 1;
      const r = await fetch(`/attach/metrics?lang=${cfg.lang}`);
      if (r.ok) {
        const frame = await r.json();
        draw(frame);
        state.metrics = frame.points;
        state.absent = frame.absent;
        if (frame.absent) delay = Math.min(MAX_POLL_MS, Math.max(POLL_MS, 1000 * frame.retry_s));
      } else {
        delay = Math.min(MAX_POLL_MS, 2 * state.delay);
      }
    } catch (err) {  // this page's server went away for a moment: ask again, less and less often
      delay = Math.min(MAX_POLL_MS, 2 * state.delay);
    }
    state.delay = delay;
    setTimeout(metrics, delay);
  }

  $("attach-send").addEventListener("click", send);
  $("attach-step").addEventListener("input", top);
  metrics();
})();

// Lecture mode's room load and the field that points the page at another server (app/attach_room.py,
// app/attach_server.py). The presenter token goes to this page's own server only.
(function () {
  const cfg = window.ATTACH || {lang: "en"};
  const $ = (id) => document.getElementById(id);
  const room = {sent: 0, summaries: 0, summary: null};
  window.attach.room = room;

  async function post(path, body) {
    const r = await fetch(path, {method: "POST", headers: {"Content-Type": "application/json"},
                                 body: JSON.stringify({...body, lang: cfg.lang})});
    const data = await r.json();
    if (!r.ok) throw new Error(data.error || r.statusText);
    return data;
  }

  async function summary() {
    const r = await fetch(`/attach/room/summary?lang=${cfg.lang}`);
    if (!r.ok) return;
    const data = await r.json();
    $("attach-room-summary").innerHTML = data.html;
    room.summary = data.summary;
    room.summaries += 1;
  }

  async function sendRoom() {
    $("attach-room-status").textContent = "";
    try {
      const out = await post("/attach/room/send", {token: $("attach-token").value, prompt: $("attach-prompt").value,
                                                   max_tokens: Number($("attach-max-tokens").value),
                                                   temperature: Number($("attach-temperature").value)});
      $("attach-room-status").textContent = out.note;
      room.sent += 1;
    } catch (err) {
      $("attach-room-status").textContent = String(err.message || err);
    }
    summary();
  }

  async function switchTarget() {
    $("attach-switch-status").textContent = "";
    try {
      const out = await post("/attach/target", {url: $("attach-url").value, api_key: $("attach-key").value,
                                                model: $("attach-model").value, token: $("attach-token").value});
      $("attach-switch-status").textContent = cfg.switched.replace("{url}", out.url).replace("{model}", out.model);
      setTimeout(() => location.reload(), 500);
    } catch (err) {
      $("attach-switch-status").textContent = String(err.message || err);
    }
  }

  $("attach-room-send").addEventListener("click", sendRoom);
  $("attach-switch").addEventListener("click", switchTarget);
  summary();
  setInterval(summary, 2000);
})();
