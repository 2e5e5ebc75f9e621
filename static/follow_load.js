// A room load on a follower's page (app/room_load.py): the presenter asked every follower's page to send one
// request at the same moment. This page sends it from the browser — a streaming chat request with the one-time
// ticket the server handed this page's socket (never an API key) — shows its answer as it streams and the time to
// its first token measured here, and reports both back over the socket. follow.js hands it the "load" messages.
(function () {
  const T = window.INFERLAB_FOLLOW;  // app/i18n.py "follow.*", in the page's language
  const st = { rounds: 0, done: 0, last: null };
  window.inferlabLoad = { state: st, handle };

  const fill = (text, fields) => text.replace(/\{(\w+)\}/g, (m, k) => (k in fields ? String(fields[k]) : m));

  function draw(r) {
    const box = document.getElementById(window.INFERLAB.ids.follow_load);
    box.hidden = false;
    box.replaceChildren();
    const add = (tag, cls, text, id) => {
      const el = document.createElement(tag);
      el.className = cls;
      el.textContent = text;
      if (id) el.id = id;
      box.appendChild(el);
      return el;
    };
    if (r.skipped) { add("p", "il-load-note", T.load_skipped); return; }
    add("h3", "il-load-title", fill(T.load_title, { round: r.round, of: r.of }));
    let line = T.load_sending;
    if (r.ttft_ms !== null) line = fill(T.load_ttft, { ms: Math.round(r.ttft_ms) });
    if (r.ok === true) line += " · " + fill(T.load_done, { tokens: r.tokens, s: (r.elapsed_ms / 1000).toFixed(1) });
    if (r.ok === false) line = fill(T.load_failed, { why: r.error });
    const status = add("p", r.ok === false ? "il-load-note il-load-error" : "il-load-note", line, "follow-load-status");
    if (r.ttft_ms !== null) status.dataset.ttftMs = String(r.ttft_ms);
    add("div", "il-load-answer", r.text, "follow-load-answer");
  }

  // one server-sent "data:" line of an OpenAI chat stream into the round's record
  function take(r, data, now) {
    if (data === "[DONE]") return;
    const chunk = JSON.parse(data);
    if (chunk.error) throw new Error(chunk.error.message || JSON.stringify(chunk.error));
    if (chunk.usage) r.tokens = chunk.usage.completion_tokens;
    for (const c of chunk.choices || []) {
      const text = (c.delta && c.delta.content) || "";
      if ((text || c.finish_reason) && r.ttft_ms === null) r.ttft_ms = now - r.t0;
      r.text += text;
      if (text) r.chunks += 1;
    }
  }

  async function send(msg, base, r) {
    const body = { model: msg.model, stream: true, stream_options: { include_usage: true },
                   max_tokens: msg.max_tokens, temperature: msg.temperature,
                   messages: [{ role: "user", content: msg.prompt }] };
    r.t0 = performance.now();
    const resp = await fetch(base + msg.url, { method: "POST", body: JSON.stringify(body),
      headers: { "Content-Type": "application/json", "Authorization": "Bearer " + msg.ticket } });
    if (!resp.ok) {
      let why = `HTTP ${resp.status}`;
      try { why += ": " + (await resp.json()).error.message; } catch (e) { /* not OpenAI's error body */ }
      throw new Error(why);
    }
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let nl;
      while ((nl = buffer.indexOf("\n")) >= 0) {
        const line = buffer.slice(0, nl).trim();
        buffer = buffer.slice(nl + 1);
        if (line.startsWith("data:")) take(r, line.slice(5).trim(), performance.now());
      }
      draw(r);
    }
    if (r.tokens === 0) r.tokens = r.chunks;  // a server that sends no usage: count the chunks
    // a stream that ended before any token (a server that dropped it) is no answer
    if (r.ttft_ms === null) throw new Error("the stream ended before its first token");
  }

  async function handle(msg, ws, base) {
    if (msg.skipped) { draw({ skipped: true }); return; }
    const r = { round: msg.round, of: msg.of, text: "", ttft_ms: null, tokens: 0, chunks: 0, ok: null, error: "",
                t0: 0, elapsed_ms: 0 };
    st.last = r;
    st.rounds += 1;
    draw(r);
    try {
      await send(msg, base, r);
      r.ok = true;
    } catch (err) {
      r.ok = false;
      r.error = String((err && err.message) || err).slice(0, 200);
    }
    r.elapsed_ms = performance.now() - r.t0;
    draw(r);
    st.done += 1;
    if (ws.readyState === WebSocket.OPEN) {
      ws.send(JSON.stringify({ op: "load_report", round: r.round, ok: r.ok, ttft_ms: r.ttft_ms, tokens: r.tokens,
                               error: r.error }));
    }
  }
})();
