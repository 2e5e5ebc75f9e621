// InferLab page glue: draws the server's payload into persistent divs with Plotly.react, which keeps each
// chart's zoom/pan (layout.uirevision) across steps, and wires clicks on charts/tokens to the controls.
// The element ids, message types and ops come from the server (app/protocol.py) as window.INFERLAB, set by a
// script in the page's head (Gradio may add its head scripts in any order): read them through K() when needed.
(function () {
  const K = () => window.INFERLAB || { ids: {}, types: {}, tabOps: {}, forceCharts: [], stepControls: {},
                                       viewControls: [] };
  const state = { renders: 0, lastRender: 0, lastPayloadTime: 0, bound: new Set(), timings: {}, renderStart: 0,
                  pending: {}, drawn: {}, stale: {}, ops: {}, figs: {}, projector: false };

  function setGradioValue(elemId, value) {
    // Gradio listens to 'input' events on its own <input>/<textarea>; set the value the way a user would.
    const root = document.getElementById(elemId);
    if (!root) return false;
    const input = root.querySelector("input, textarea");
    if (!input) return false;
    const proto = input.tagName === "TEXTAREA" ? HTMLTextAreaElement.prototype : HTMLInputElement.prototype;
    Object.getOwnPropertyDescriptor(proto, "value").set.call(input, String(value));
    input.dispatchEvent(new Event("input", { bubbles: true }));
    input.dispatchEvent(new Event("change", { bubbles: true }));
    return true;
  }

  function click(elemId) {
    const el = document.getElementById(elemId);
    const btn = el && (el.tagName === "BUTTON" ? el : el.querySelector("button"));
    if (btn) btn.click();
  }

  function bindChartClicks(el) {
    if (state.bound.has(el.id) || !el.on) return;
    state.bound.add(el.id);
    const ids = K().ids;
    if (K().forceCharts.includes(el.id)) {
      // click a token's bar: force it at the next step
      el.on("plotly_click", (ev) => {
        const pt = ev.points && ev.points[0];
        const id = pt && (Array.isArray(pt.customdata) ? pt.customdata[0] : pt.customdata);
        if (id === undefined || id === null || isNaN(Number(id))) return;
        if (setGradioValue(ids.force_id, Number(id))) setTimeout(() => click(ids.force), 150);
      });
    }
  }

  function bindTokenClicks() {
    // click a generated token chip: rewind to just before it
    const ids = K().ids;
    const box = document.getElementById(ids.tokens);
    if (!box || box.dataset.ilBound) return;
    box.dataset.ilBound = "1";
    box.addEventListener("click", (e) => {
      const chip = e.target.closest("[data-gen-index]");
      if (!chip) return;
      if (setGradioValue(ids.rewind_n, Number(chip.dataset.genIndex))) setTimeout(() => click(ids.rewind), 150);
    });
  }

  const CONFIG = { responsive: true, displaylogo: false, modeBarButtonsToRemove: ["select2d", "lasso2d"] };

  function isVisible(el, margin = 200) {
    const r = el.getBoundingClientRect();
    return r.bottom > -margin && r.top < window.innerHeight + margin && r.width > 0;
  }

  // Projector mode: larger type for a shared screen. The page's text grows by CSS (static/lab.css) and every
  // chart is drawn with each of its pixel sizes (fonts, margins, offsets, heights, line widths) times
  // PROJECTOR_SCALE, in a panel at least that much wider (one chart per row, the controls above the panels): the
  // chart a reader sees is the usual one magnified, so what fitted still fits.
  const PROJECTOR_SCALE = 1.4;
  const SCALED = new Set(["size", "height", "l", "r", "t", "b", "pad", "xshift", "yshift", "borderpad", "ax", "ay",
                          "thickness", "ticklen", "standoff", "ticklabelstandoff", "tracegroupgap"]);
  function magnify(v, key, parent) {
    if (typeof v === "number") {
      const px = SCALED.has(key) || (key === "width" && parent === "line");  // a bar's width is in data units
      return px ? v * PROJECTOR_SCALE : v;
    }
    if (typeof v === "string") {  // a title's inline "font-size:11px"
      return v.replace(/font-size:\s*(\d+(?:\.\d+)?)px/g, (_, n) => `font-size:${(n * PROJECTOR_SCALE).toFixed(1)}px`);
    }
    if (Array.isArray(v)) return v.map((x) => magnify(x, key, parent));
    if (v && typeof v === "object") {
      const out = {};
      // an annotation's ax/ay are pixels unless they are axis coordinates
      const keep = new Set([v.axref && v.axref !== "pixel" ? "ax" : "", v.ayref && v.ayref !== "pixel" ? "ay" : ""]);
      for (const [k, x] of Object.entries(v)) out[k] = keep.has(k) ? x : magnify(x, k, key);
      return out;
    }
    return v;
  }
  // a colour bar's title beside it: above it, the larger title met the top tick's label
  const titleBeside = (bar) => ({ ...bar, title: { ...(bar.title || {}), side: "right" } });
  function shown(fig, el) {
    if (!state.projector) return fig;
    const data = (fig.data || []).map((t) => {  // a trace's pixel sizes (its text, markers, lines), not its data
      const out = { ...t };
      for (const k of ["textfont", "marker", "line", "insidetextfont", "outsidetextfont", "header", "cells",
                       "colorbar", "hoverlabel"]) if (t[k]) out[k] = magnify(t[k], k, "");
      if (out.colorbar) out.colorbar = titleBeside(out.colorbar);
      return out;
    });
    const layout = magnify(fig.layout || {}, "", "");
    if (layout.coloraxis && layout.coloraxis.colorbar) {  // one colour bar for several heatmaps
      layout.coloraxis = { ...layout.coloraxis, colorbar: titleBeside(layout.coloraxis.colorbar) };
    }
    // a figure without a height takes its container's (static/lab.css): magnified too
    if (!layout.height) layout.height = PROJECTOR_SCALE * (parseFloat(getComputedStyle(el).minHeight) || 450);
    return { data, layout };
  }
  function projector(on) {
    state.projector = !!on;
    document.documentElement.classList.toggle("il-projector", state.projector);
    try { localStorage.setItem("inferlab.projector", state.projector ? "1" : ""); } catch (err) { /* private mode */ }
    // every chart drawn so far is drawn again at the new scale (the others will be when they come into view)
    for (const [id, fig] of Object.entries(state.figs)) if (!state.pending[id]) state.pending[id] = fig;
    flush();
  }

  function draw(id) {
    const given = state.pending[id];
    const el = document.getElementById(id);
    if (!given || !el || !window.Plotly) return;
    delete state.pending[id];
    state.figs[id] = given;  // kept for a redraw at another scale
    const fig = shown(given, el);
    const t0 = performance.now();
    // the container takes the figure's own height: on a window resize Plotly's responsive mode sizes the chart
    // to its container, and a tall figure (the sampling chain) was squashed to the container's minimum
    el.style.height = fig.layout && fig.layout.height ? fig.layout.height + "px" : "";
    window.Plotly.react(el, fig.data, fig.layout, CONFIG);
    state.timings[id] = performance.now() - t0;
    state.drawn[id] = (state.drawn[id] || 0) + 1;
    bindChartClicks(el);
  }

  // Drawing every chart after every step would make the browser, not the engine, the bottleneck: charts
  // below the fold keep only their latest figure and are drawn when they scroll into view.
  // The server builds and sends only the figures of charts in view (a payload's size is most of a step's
  // latency); the others are marked stale and fetched when they scroll into view.
  const visible = new Set();
  let syncTimer = null;
  const staleInView = () => [...visible].some((id) => state.stale[id]);
  function syncVisible() {
    clearTimeout(syncTimer);
    syncTimer = setTimeout(() => {
      // what the page's Gradio events (Reset, a what-if, the tour...) tell the server is in view
      setGradioValue(K().ids.visible, JSON.stringify({ ids: [...visible].sort() }));
      if (sendView()) return;
      // the socket is down: a hidden Gradio button asks for the charts in view
      if (staleInView()) setTimeout(() => click(K().ids.refresh), 60);
    }, 80);
  }
  const observer = "IntersectionObserver" in window ? new IntersectionObserver((entries) => {
    for (const e of entries) {
      if (e.isIntersecting) { visible.add(e.target.id); draw(e.target.id); }
      else visible.delete(e.target.id);
    }
    syncVisible();
  }, { rootMargin: "200px" }) : null;
  function observeAll() {
    document.querySelectorAll("." + K().ids.chart_class).forEach((el) => observe(el));
  }
  const observed = new Set();
  function observe(el) {
    if (!observer || observed.has(el.id)) return;
    observed.add(el.id);
    observer.observe(el);
  }

  function flush() {  // draw everything now (screenshots, tests)
    for (const id of Object.keys(state.pending)) {
      try { draw(id); } catch (err) { console.error("inferlab: drawing " + id + " failed", err); }
    }
  }

  function render(payload) {
    if (!payload) return;
    const tStart = performance.now();
    const p = typeof payload === "string" ? JSON.parse(payload) : payload;
    if (!p || p.t === state.lastPayloadTime) return;
    state.lastPayloadTime = p.t;
    for (const [id, html] of Object.entries(p.html || {})) {
      const el = document.getElementById(id);
      if (!el) continue;
      // a fold the user opened (a long prompt's chips) stays open when its HTML is redrawn after a step
      // (and keeps the keyboard focus on its control)
      const open = [...el.querySelectorAll("details[data-il-fold][open]")].map((d) => d.dataset.ilFold);
      const a = document.activeElement;
      const focused = a && el.contains(a) && a.matches("details[data-il-fold] > summary") ?
        a.parentElement.dataset.ilFold : null;
      el.innerHTML = html;
      for (const key of open) {
        const d = el.querySelector(`details[data-il-fold="${key}"]`);
        if (d) d.open = true;
      }
      const f = focused && el.querySelector(`details[data-il-fold="${focused}"] > summary`);
      if (f) f.focus({ preventScroll: true });
    }
    state.timings = { html: performance.now() - tStart };
    for (const id of p.stale || []) state.stale[id] = true;
    for (const id of p.same || []) delete state.stale[id];  // built, and equal to what this page has (not resent)
    observeAll();
    // charts on screen are drawn now; those just outside it (about to scroll in) right after this task, so
    // they never delay what the user is looking at; off-screen charts are drawn when scrolled into view.
    // All positions are read before any drawing: a read after a draw would lay out the whole page again.
    const now = [], near = [];
    const tPos = performance.now();
    for (const [id, fig] of Object.entries(p.figs || {})) {
      delete state.stale[id];
      const el = document.getElementById(id);
      if (!el) continue;
      state.pending[id] = fig;
      observe(el);
      if (isVisible(el, 0)) now.push(id);
      else if (isVisible(el)) near.push(id);
    }
    state.timings.positions = performance.now() - tPos;  // the first read after the HTML lays the page out
    now.forEach(draw);
    if (near.length) setTimeout(() => near.forEach((id) => { if (state.pending[id]) draw(id); }), 0);
    if (p.tour && p.tour.at !== state.tourAt) { state.tourAt = p.tour.at; showTourPanel(p.tour.panel); }
    state.renderStart = tStart;
    bindTokenClicks();
    // a payload built while the view was changing may leave a chart in view stale: ask for it (bounded, so a
    // server that cannot build a chart does not cause a request loop)
    const missing = staleInView();
    state.refreshes = missing ? (state.refreshes || 0) + 1 : 0;
    if (missing && state.refreshes <= 3) syncVisible();
    if (p.kind === "calc") { state.calcRenders = (state.calcRenders || 0) + 1; return; }
    if (p.op) {  // what a click's own payload cost (bench/ui_latency.py); a follow-up payload resets timings
      state.ops[p.op] = (state.ops[p.op] || 0) + 1;
      Object.assign(state, { opDrawn: performance.now(), opStart: tStart, opTimings: { ...state.timings } });
    }
    state.renders += 1;
    state.lastRender = performance.now();
    document.body.dataset.ilRenders = String(state.renders);
  }

  // This page's own websocket: the server pushes each step's payload here instead of through a Gradio
  // component (which cost ~250 ms per large payload). Without it (closed, or an old server) the payloads
  // still arrive through the hidden Gradio textbox. The socket presents a ticket the server gave this page
  // over its own Gradio event (page load): the server alone decides which session a socket belongs to.
  let socket = null;
  let ticket = null;
  let retryMs = 1500;
  function connect(newTicket) {
    if (newTicket) {
      if (newTicket === ticket && socket && socket.readyState <= 1) return;
      ticket = newTicket;
      if (socket) { socket.onclose = null; socket.close(); }
    }
    if (window.INFERLAB_ROLE === "viewer" || !("WebSocket" in window) || !ticket) return;
    const proto = location.protocol === "https:" ? "wss:" : "ws:";
    const base = location.pathname.replace(/\/[^/]*$/, "");
    socket = new WebSocket(`${proto}//${location.host}${base}/ws/lab?ticket=${encodeURIComponent(ticket)}`);
    socket.onopen = () => {
      retryMs = 1500;
      state.socket = "open";
    };
    socket.onmessage = (m) => {
      const msg = JSON.parse(m.data);
      const types = K().types;
      if (msg.type === types.payload) render(msg.payload);
      else if (msg.type === types.bound) {  // our session exists: commands may take this socket
        state.tied = true;
        // tell the server what is in view; on a new socket it sends all of it again (a payload may have been
        // lost with the old one)
        sentView = null;
        syncVisible();
      }
      else if (msg.type === types.unbound) state.tied = false;  // it has gone: the next Step goes through Gradio
      else if (msg.type === types.error) state.socketError = msg.error;  // e.g. an expired ticket: Gradio carries on
    };
    // reconnect with a growing pause: a refused ticket (the tab's session ended) is not hammered
    socket.onclose = () => {
      state.socket = "closed"; state.tied = false;
      setTimeout(() => connect(), retryMs);
      retryMs = Math.min(retryMs * 2, 30000);
    };
  }

  // Step over this page's websocket: Gradio's round trip (queue, event stream, busy indicators) costs about
  // as much CPU as the engine step on a small machine, and both share its cores. The server runs the very
  // same Step handler with the values read off the controls below. Until the socket is tied to this tab's
  // session (after its first Gradio event), or if a control cannot be read, the click goes to Gradio.
  function controlValue(id, kind) {
    const root = document.getElementById(id);
    if (!root) return undefined;
    if (kind === "check") { const el = root.querySelector("input[type=checkbox]"); return el ? el.checked : undefined; }
    if (kind === "radio") { const el = root.querySelector("input[type=radio]:checked"); return el ? el.value : undefined; }
    const el = kind === "slider" ? root.querySelector("input[type=number]") : root.querySelector("textarea, input");
    return el ? el.value : undefined;
  }
  function controlInputs(names) {
    // charts on screen are built and sent first; those within the observer's margin follow in a second payload
    const ids = [...visible].sort();
    const onScreen = ids.filter((id) => { const el = document.getElementById(id); return el && isVisible(el, 0); });
    const near = ids.filter((id) => !onScreen.includes(id));
    const inputs = { visible: JSON.stringify({ ids: onScreen, near }) };
    for (const name of names) {
      const [id, kind] = K().stepControls[name];
      const v = controlValue(id, kind);
      if (v === undefined) return null;
      inputs[name] = v;
    }
    return inputs;
  }
  function socketReady() { return state.tied && socket && socket.readyState === 1; }
  // The charts in view, over the socket: the server answers with their payload and keeps the view, so the
  // room's steps reach this page while it does not step itself (app/delivery.py RoomPusher).
  let sentView = null;
  function sendView(always) {
    if (!socketReady()) return false;
    const inputs = controlInputs(K().viewControls);
    if (!inputs) return false;
    const text = JSON.stringify({ op: K().tabOps.view, inputs });
    if (text === sentView && !always && !staleInView()) return true;  // nothing new to tell, nothing to draw
    sentView = text;
    socket.send(text);
    state.socketViews = (state.socketViews || 0) + 1;
    return true;
  }
  // Run goes the same way (its frames come over the socket, then a run_end message); Pause stays a Gradio
  // event, which ends the run on the server whichever way it started.
  document.addEventListener("click", (e) => {
    const near = (id) => e.target && e.target.closest && e.target.closest("#" + id);
    const op = near(K().ids.step) ? K().tabOps.step : near(K().ids.run) ? K().tabOps.run : null;
    if (!op || !socketReady()) return;
    const inputs = controlInputs(Object.keys(K().stepControls));
    if (!inputs) return;
    e.preventDefault();
    e.stopImmediatePropagation();  // capture phase on document: Gradio's own handler never sees this click
    socket.send(JSON.stringify({ op, inputs }));
    if (op === K().tabOps.run) state.socketRuns = (state.socketRuns || 0) + 1;
    else state.socketSteps = (state.socketSteps || 0) + 1;
  }, true);
  // The sequence selector is HTML the server sends with each payload: choosing a sequence sends a Focus
  // command over the socket (through a hidden Gradio control while the socket is down).
  document.addEventListener("change", (e) => {
    const ids = K().ids;
    if (!e.target || e.target.id !== ids.focus_select) return;
    const seq = e.target.value;
    const inputs = controlInputs(K().viewControls);
    if (socketReady() && inputs) {
      socket.send(JSON.stringify({ op: K().tabOps.focus, seq, inputs }));
      state.socketFocus = (state.socketFocus || 0) + 1;
    } else if (setGradioValue(ids.focus_pick, seq)) setTimeout(() => click(ids.focus_go), 150);
  });

  function showTourPanel(key) {
    // the guided tour: bring the step's panel into view and outline it
    document.querySelectorAll(".il-tour-focus").forEach((el) => el.classList.remove("il-tour-focus"));
    const el = document.getElementById(K().ids.panel_prefix + key);
    if (!el) return;
    el.classList.add("il-tour-focus");
    el.scrollIntoView({ behavior: "smooth", block: "start" });
  }

  function keyboard(e) {
    // Alt+S: step, Alt+R: run, Alt+P: pause (keyboard-friendly lecturing)
    if (!e.altKey) return;
    const ids = K().ids;
    const map = { s: ids.step, r: ids.run, p: ids.pause };
    const target = map[e.key.toLowerCase()];
    if (target) { e.preventDefault(); click(target); }
  }
  document.addEventListener("keydown", keyboard);
  // A layer or head typed into its slider's number box and confirmed with Enter: Gradio's slider sends the
  // "release" that redraws the attention charts only on blur or pointer-up, so Enter leaves the box as a click
  // elsewhere would (the slider clamps the value, then releases it).
  document.addEventListener("keydown", (e) => {
    if (e.key !== "Enter" || !e.target || e.target.type !== "number") return;
    const sliders = ["layer", "head"].map((name) => "#" + K().stepControls[name][0]).join(", ");
    if (e.target.closest(sliders)) e.target.blur();
  });
  // Gradio renders the page after this script runs: start observing the chart containers once they exist.
  const boot = setInterval(() => {
    if (window.INFERLAB && document.querySelector("." + K().ids.chart_class)) { observeAll(); clearInterval(boot); }
  }, 200);
  // projector mode stays on across reloads: its checkbox is ticked again once the page has it
  const projectorBoot = setInterval(() => {
    const box = document.querySelector("#projector input[type=checkbox]");
    if (!box) return;
    clearInterval(projectorBoot);
    let stored = "";
    try { stored = localStorage.getItem("inferlab.projector"); } catch (err) { /* private mode */ }
    if (stored && !box.checked) box.click();
  }, 300);

  // the charts in view drawn afresh (tests; the page itself asks when a chart in view is stale)
  function refresh() { if (!sendView(true)) click(K().ids.refresh); }

  window.inferlab = { render, flush, state, visible, connect, refresh, projector };
})();
