// InferLab page glue: draws the server's payload into persistent divs with Plotly.react, which keeps each
// chart's zoom/pan (layout.uirevision) across steps, and wires clicks on charts/tokens to the controls.
(function () {
  const state = { renders: 0, lastRender: 0, lastPayloadTime: 0, bound: new Set() };

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
    if (el.id === "chart-logits" || el.id === "chart-sampling") {
      // click a token's bar: force it at the next step
      el.on("plotly_click", (ev) => {
        const pt = ev.points && ev.points[0];
        const id = pt && (Array.isArray(pt.customdata) ? pt.customdata[0] : pt.customdata);
        if (id === undefined || id === null || isNaN(Number(id))) return;
        if (setGradioValue("force_id", Number(id))) setTimeout(() => click("force"), 150);
      });
    }
  }

  function bindTokenClicks() {
    // click a generated token chip: rewind to just before it
    const box = document.getElementById("html-tokens");
    if (!box || box.dataset.ilBound) return;
    box.dataset.ilBound = "1";
    box.addEventListener("click", (e) => {
      const chip = e.target.closest("[data-gen-index]");
      if (!chip) return;
      if (setGradioValue("rewind_n", Number(chip.dataset.genIndex))) setTimeout(() => click("rewind"), 150);
    });
  }

  function render(payload) {
    if (!payload) return;
    const p = typeof payload === "string" ? JSON.parse(payload) : payload;
    if (!p || p.t === state.lastPayloadTime) return;
    state.lastPayloadTime = p.t;
    for (const [id, html] of Object.entries(p.html || {})) {
      const el = document.getElementById(id);
      if (el) el.innerHTML = html;
    }
    const config = { responsive: true, displaylogo: false, modeBarButtonsToRemove: ["select2d", "lasso2d"] };
    for (const [id, fig] of Object.entries(p.figs || {})) {
      const el = document.getElementById(id);
      if (!el || !window.Plotly) continue;
      window.Plotly.react(el, fig.data, fig.layout, config);
      bindChartClicks(el);
    }
    bindTokenClicks();
    state.renders += 1;
    state.lastRender = performance.now();
    document.body.dataset.ilRenders = String(state.renders);
  }

  function keyboard(e) {
    // Alt+S: step, Alt+R: run, Alt+P: pause (keyboard-friendly lecturing)
    if (!e.altKey) return;
    const map = { s: "step", r: "run", p: "pause" };
    const target = map[e.key.toLowerCase()];
    if (target) { e.preventDefault(); click(target); }
  }
  document.addEventListener("keydown", keyboard);

  window.inferlab = { render, state };
})();
