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

  async function metrics() {
    try {
      const r = await fetch(`/attach/metrics?lang=${cfg.lang}`);
      if (r.ok) {
        const frame = await r.json();
        draw(frame);
        state.metrics = frame.points;
      }
    } catch (err) { /* the server went away for a moment: the next poll tries again */ }
  }

  $("attach-send").addEventListener("click", send);
  $("attach-step").addEventListener("input", top);
  metrics();
  setInterval(metrics, 2000);
})();
