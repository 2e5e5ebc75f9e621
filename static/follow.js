// Follower view of lecture mode: read-only. Step events arrive in order (a line of text per step); chart frames
// arrive as the latest state (a slow screen skips frames rather than slowing the lecture) and are drawn by
// lab.js's render(), the same code the presenter's page uses.
// Message types and element ids come from app/protocol.py (window.INFERLAB, set in the page's head).
(function () {
  const { ids, types } = window.INFERLAB;
  const T = window.INFERLAB_FOLLOW;  // the status line's texts in the page's language (app/i18n.py "follow.*")
  const status = document.getElementById(ids.follow_status);
  const last = document.getElementById(ids.follow_last);
  const st = { frames: 0, events: 0, lastStep: -1 };
  window.inferlabFollow = st;

  function say(text, cls) {
    status.textContent = text;
    status.className = "il-follow-status " + (cls || "");
  }

  function connect() {
    const proto = location.protocol === "https:" ? "wss:" : "ws:";
    const base = location.pathname.replace(/\/follow\/?$/, "");
    const ws = new WebSocket(`${proto}//${location.host}${base}/ws/follow`);
    ws.onopen = () => say(T.waiting, "ok");
    ws.onmessage = (m) => {
      const msg = JSON.parse(m.data);
      if (msg.type === types.hello) {
        say(msg.presenting ? T.live : T.nobody, "ok");
      } else if (msg.type === types.event) {
        const ev = msg.event;
        if (ev.reset) { last.textContent = ""; return; }
        st.events += 1;
        st.lastStep = ev.step;
        const toks = (ev.seqs || []).filter((s) => s.new_token !== null)
          .map((s) => `#${s.seq_id} ${JSON.stringify(s.new_token_text)}`);
        // sequences by "#id" (a bare "finished 0" read as a count of zero)
        const done = (ev.finished || []).map((id) => T.finished.replace("{id}", id));
        last.textContent = T.step.replace("{n}", ev.step) + (toks.length ? " · " + toks.join(" ") : "") +
          (done.length ? " · " + done.join(" · ") : "");
        say(T.live, "ok");
      } else if (msg.type === types.frame) {
        st.frames += 1;
        st.frame = msg.n;
        st.frameStep = msg.payload.step;  // the presenter's step this frame shows
        window.inferlab.render(msg.payload);
        document.body.dataset.followFrames = String(st.frames);
      } else if (msg.type === types.resync) {
        say(T.catching_up, "warn");
      } else if (msg.type === types.load && window.inferlabLoad) {
        window.inferlabLoad.handle(msg, ws, base);  // the presenter asks this page to send one request now
      }
    };
    ws.onclose = () => { say(T.disconnected, "warn"); setTimeout(connect, 2000); };
  }
  connect();
})();
