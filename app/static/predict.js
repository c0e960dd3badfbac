// Prediction mode, on any trace: with the step bar's "Predict" on, the next step (its button or
// the → key) first asks the server what that step adds to the pools (…/steps/<n>/next.json). If
// it adds an object, the learner predicts where it lands — a click on the pool bar, or its data
// offset, size or shape typed — and only then steps on; the truth is drawn over the guess on the
// new step's pool bar, with a sentence saying how far off the guess was.
(() => {
  const KEY = "lens-predict";  // "on" while prediction mode is on (this browser)
  let asking = null;  // {url, next, landed}: a prediction being made
  let guess = null;  // {step, landed, click, typed}: the prediction made, drawn after the step

  const on = () => { try { return localStorage.getItem(KEY) === "on"; } catch (e) { return false; } };
  const say = (key, vars = {}) => {
    const el = document.querySelector(".predicttoggle");
    const text = (el && el.dataset["say" + key[0].toUpperCase() + key.slice(1).replace(/-(\w)/g, (m, c) => c.toUpperCase())]) || key;
    return text.replace(/\{(\w+)\}/g, (m, k) => vars[k] ?? m);
  };
  const hex = (n) => "0x" + n.toString(16);

  function sync() {  // the switch shows the mode (after every swap of the debugger)
    document.querySelectorAll("[data-predict-toggle]").forEach((x) => { x.checked = on(); });
  }
  document.addEventListener("DOMContentLoaded", () => { sync(); draw(); });
  document.addEventListener("htmx:afterSettle", () => {
    if (asking && !document.querySelector("#pool .predict-box")) asking = null;  // (moved on another way)
    sync();
    draw();
  });
  document.addEventListener("change", (ev) => {
    if (!ev.target.matches("[data-predict-toggle]")) return;
    try { localStorage.setItem(KEY, ev.target.checked ? "on" : "off"); } catch (e) { /* private mode */ }
    if (!ev.target.checked) cancel();
  });

  function nextButton() { return document.querySelector('#stepnav a[data-key="ArrowRight"][href]'); }
  function stepBase() {  // the current step's own URL (its query kept), from the scrubber
    const r = document.querySelector("#stepnav input[type=range]");
    return r && {path: r.dataset.base + r.value, query: r.dataset.query ? `?${r.dataset.query}` : ""};
  }
  function go(url) { htmx.ajax("GET", url, {target: "#debugger", swap: "outerHTML"}); }

  // the next step, held back while prediction mode is on (before debugger.js sees the press)
  async function intercept(ev) {
    const btn = nextButton();
    if (!on() || !btn || asking) return;
    ev.preventDefault();
    ev.stopImmediatePropagation();
    const url = btn.getAttribute("href"), base = stepBase();
    let found = null;
    try { found = await (await fetch(`${base.path}/next.json${base.query}`)).json(); } catch (e) { /* step on */ }
    const landed = found && found.objects.find((o) => document.querySelector(`#pool .poolbar[data-ctx="${o.ctx}"]`));
    if (!landed) return go(url);
    asking = {url, next: found.step, landed};
    ask();
  }
  window.addEventListener("click", (ev) => {
    if (ev.button === 0 && ev.target.closest && ev.target.closest('#stepnav a[data-key="ArrowRight"]')) intercept(ev);
  }, true);
  window.addEventListener("keydown", (ev) => {
    if (ev.key !== "ArrowRight" || ev.altKey || ev.ctrlKey || ev.metaKey) return;
    if (ev.target.closest && ev.target.closest("input, select, textarea")) return;
    if (asking) { ev.preventDefault(); ev.stopImmediatePropagation(); return; }
    intercept(ev);
  }, true);

  function ask() {  // the question, above the pool bars
    const o = asking.landed, pool = document.getElementById("pool");
    const kind = o.type === "TENSOR" ? say("tensor") : o.type === "GRAPH" ? say("graph") : say("work");
    const box = document.createElement("div");
    box.className = "predict-box";
    box.setAttribute("role", "region");
    box.setAttribute("aria-label", say("region"));
    const p = document.createElement("p");
    p.textContent = say("ask", {step: asking.next, kind, ctx: o.ctx});
    box.append(p);
    const fields = document.createElement("p");
    fields.className = "predict-fields";
    for (const [name, what] of o.type === "TENSOR" ? [["offset", "offset"], ["nbytes", "nbytes"], ["shape", "shape"]] : []) {
      const label = document.createElement("label");
      label.append(say(what) + " ", Object.assign(document.createElement("input"), {name, type: "text", autocomplete: "off"}));
      fields.append(label);
    }
    for (const [act, text] of [["go", say("go")], ["skip", say("skip")]]) {
      const b = Object.assign(document.createElement("button"), {type: "button", className: "btn", textContent: text});
      b.dataset.predict = act;
      fields.append(b);
    }
    box.append(fields);
    pool.insertBefore(box, pool.querySelector(".poolhead"));
    pool.classList.add("predicting");
  }

  function cancel() {
    asking = null;
    document.querySelectorAll("#pool .predict-box").forEach((b) => b.remove());
    document.querySelectorAll("#pool.predicting").forEach((p) => p.classList.remove("predicting"));
  }

  function typed() {  // what the learner typed, read as numbers and a shape
    const box = document.querySelector("#pool .predict-box"), out = {};
    if (!box) return out;
    for (const name of ["offset", "nbytes"]) {
      const v = (box.querySelector(`input[name=${name}]`) || {}).value || "";
      const t = v.replace(/[\s_,]/g, "");
      if (/^(0x[0-9a-f]+|\d+)$/i.test(t)) out[name] = Number(t);
    }
    const shape = (box.querySelector("input[name=shape]") || {}).value || "";
    const ne = (shape.match(/\d+/g) || []).map(Number);
    while (ne.length > 1 && ne[ne.length - 1] === 1) ne.pop();
    if (ne.length) out.shape = ne;
    return out;
  }

  function commit(click) {
    guess = {step: asking.next, landed: asking.landed, click, typed: typed()};
    const url = asking.url;
    cancel();
    go(url);
  }

  // while asking: a click on the pool bar is the guess (the byte under the pointer), not a link
  document.addEventListener("click", (ev) => {
    if (!asking) return;
    const seg = ev.target.closest && ev.target.closest("#pool .poolbar [data-start]");
    const act = ev.target.closest && ev.target.closest("#pool .predict-box [data-predict]");
    if (seg) {
      ev.preventDefault();
      ev.stopPropagation();
      const r = seg.getBoundingClientRect(), frac = Math.min(1, Math.max(0, (ev.clientX - r.left) / r.width));
      commit({ctx: +seg.closest(".poolbar").dataset.ctx, offset: offsetAt(seg, frac)});
    } else if (act) {
      if (act.dataset.predict === "go") commit(null);
      else { const url = asking.url; cancel(); go(url); }
    }
  }, true);

  // A byte under the pointer: a segment's width is the square root of its size (pool.py's
  // bar_weight), so across the free space the bytes grow as the square of the distance from its
  // start; the first pixels after the last object are a few bytes each, where objects land.
  function offsetAt(seg, frac) {
    const a = +seg.dataset.start, n = +seg.dataset.size;
    return Math.min(a + n - 1, Math.floor(a + (seg.classList.contains("seg-free") ? frac * frac : frac) * n));
  }
  function fracOf(seg, offset) {
    const f = (offset - +seg.dataset.start) / +seg.dataset.size;
    return seg.classList.contains("seg-free") ? Math.sqrt(f) : f;
  }
  function xOf(bar, offset) {  // where a byte offset lies on a pool bar (to its segments' scale)
    const segs = [...bar.querySelectorAll("[data-start]")];
    for (const s of segs) {
      const a = +s.dataset.start, n = +s.dataset.size;
      if (offset >= a && offset < a + n) {
        const r = s.getBoundingClientRect();
        return r.left + fracOf(s, offset + 0.5) * r.width;
      }
    }
    const last = segs[segs.length - 1].getBoundingClientRect();
    return last.right;
  }

  function draw() {  // the truth over the guess, once the step predicted is shown
    const r = document.querySelector("#stepnav input[type=range]");
    if (!guess || !r || +r.value !== guess.step) return;
    const o = guess.landed, pool = document.getElementById("pool");
    const bar = pool && pool.querySelector(`.poolbar[data-ctx="${o.ctx}"]`);
    if (!bar) return;
    const home = pool.getBoundingClientRect(), br = bar.getBoundingClientRect();
    const left = xOf(bar, o.header), right = xOf(bar, o.end - 1);
    const truth = Object.assign(document.createElement("div"), {className: "predict-truth"});
    Object.assign(truth.style, {left: `${left - home.left}px`, top: `${br.top - home.top - 4}px`,
                                width: `${Math.max(4, right - left)}px`, height: `${br.height + 8}px`});
    pool.append(truth);
    const lines = [o.data === null ? say("landed-nodata", {start: hex(o.header), end: hex(o.end)})
      : say("landed", {start: hex(o.header), end: hex(o.end), data: hex(o.data)})];
    let right_ = null;
    if (guess.click && guess.click.ctx === o.ctx) {
      const g = guess.click.offset, x = xOf(bar, g);
      const mark = Object.assign(document.createElement("div"), {className: "predict-guess", title: say("guess")});
      Object.assign(mark.style, {left: `${x - home.left - 1}px`, top: `${br.top - home.top - 10}px`,
                                 height: `${br.height + 20}px`});
      pool.append(mark);
      right_ = g >= o.header && g < o.end;
      lines.push(right_ ? say("inside", {guess: hex(g)})
        : g < o.header ? say("before", {guess: hex(g), n: o.header - g}) : say("after", {guess: hex(g), n: g - o.end + 1}));
    }
    const t = guess.typed, truths = {offset: o.data, nbytes: o.nbytes, shape: o.ne};
    for (const [name, what] of [["offset", "offset"], ["nbytes", "nbytes"], ["shape", "shape"]]) {
      if (!(name in t) || truths[name] === null) continue;
      const same = name === "shape" ? JSON.stringify(t[name]) === JSON.stringify(truths[name]) : t[name] === truths[name];
      const show = (v) => name === "shape" ? `[${v.join(", ")}]` : name === "offset" ? hex(v) : String(v);
      lines.push(say(same ? "typed-right" : "typed-wrong", {what: say(what), guess: show(t[name]), truth: show(truths[name])}));
      right_ = right_ === null ? same : right_ && same;
    }
    const out = Object.assign(document.createElement("div"), {className: "predict-verdict " + (right_ ? "right" : "wrong")});
    out.setAttribute("role", "status");
    out.textContent = lines.join(" ");
    bar.after(out);
    guess = null;
  }
  window.lensPredict = {xOf};  // for the browser tests
})();
