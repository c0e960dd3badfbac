// The DAG: zoom (wheel, buttons), pan (drag), fit, find a tensor by name, a minimap for big
// graphs, and the current node kept in view as steps advance. Graphviz draws the SVG; this only
// moves its viewBox. The drawing's element survives swaps while its key is the same (htmx
// hx-preserve), so the view stays where the learner put it.
(() => {
  const BIG = 1200;  // graph units (pt) wider than this: a minimap, and opened near the current node

  const svgOf = () => document.querySelector("#graph .dag > svg");
  const box = (svg) => svg.viewBox.baseVal;
  const full = (svg) => svg.__full || (svg.__full = {x: box(svg).x, y: box(svg).y, w: box(svg).width, h: box(svg).height});

  function setView(svg, x, y, w, h) {
    const f = full(svg);
    w = Math.min(Math.max(w, 40), f.w * 4); h = Math.min(Math.max(h, 30), f.h * 4);
    svg.setAttribute("viewBox", `${x} ${y} ${w} ${h}`);
    drawMinimap(svg);
  }

  function zoom(svg, factor, cx, cy) {  // factor < 1 zooms in, around (cx, cy) in graph units
    const b = box(svg);
    if (cx === undefined) { cx = b.x + b.width / 2; cy = b.y + b.height / 2; }
    setView(svg, cx - (cx - b.x) * factor, cy - (cy - b.y) * factor, b.width * factor, b.height * factor);
  }

  function fit(svg) { const f = full(svg); setView(svg, f.x, f.y, f.w, f.h); }

  function nodeBox(svg, id) {
    const g = id && svg.querySelector(`g[id="${CSS.escape(id)}"]`);
    return g ? g.getBBox() : null;  // in the graph's units (graphviz's transform is a translate)
  }

  function toGraph(svg, b) {  // graphviz puts everything in a group translated by its height
    const m = svg.querySelector("g.graph").transform.baseVal.consolidate();
    const t = m ? m.matrix : {e: 0, f: 0, a: 1, d: 1};
    return {x: b.x * t.a + t.e, y: b.y * t.d + t.f, w: b.width * t.a, h: b.height * t.d};
  }

  function centre(svg, id, keepIfVisible) {
    const nb = nodeBox(svg, id);
    if (!nb) return;
    const n = toGraph(svg, nb);
    let b = box(svg);
    const over = Math.max(n.w / (b.width * 0.9), n.h / (b.height * 0.9));
    if (over > 1) {  // zoomed in so far the node does not fit: out until it takes 60% of the view
      const k = over * 0.9 / 0.6;
      setView(svg, b.x, b.y, b.width * k, b.height * k);
      b = box(svg);
    }
    const inside = n.x >= b.x && n.y >= b.y && n.x + n.w <= b.x + b.width && n.y + n.h <= b.y + b.height;
    if (keepIfVisible && inside) return;
    setView(svg, n.x + n.w / 2 - b.width / 2, n.y + n.h / 2 - b.height / 2, b.width, b.height);
  }

  function drawMinimap(svg) {
    const dag = svg.parentElement, f = full(svg);
    let mini = dag.querySelector(".minimap");
    if (f.w <= BIG && f.h <= BIG * 1.5) { if (mini) mini.remove(); return; }
    if (!mini) {
      mini = document.createElement("div");
      mini.className = "minimap";
      const copy = svg.cloneNode(true);
      copy.removeAttribute("id");
      copy.setAttribute("viewBox", `${f.x} ${f.y} ${f.w} ${f.h}`);
      copy.querySelectorAll("[id]").forEach((e) => e.removeAttribute("id"));
      copy.querySelectorAll("a").forEach((a) => a.replaceWith(...a.childNodes));  // a picture, no links
      const r = document.createElementNS("http://www.w3.org/2000/svg", "rect");
      r.setAttribute("class", "view");
      copy.appendChild(r);
      mini.appendChild(copy);
      dag.appendChild(mini);
    }
    const b = box(svg), r = mini.querySelector("rect.view");
    r.setAttribute("x", b.x); r.setAttribute("y", b.y); r.setAttribute("width", b.width); r.setAttribute("height", b.height);
  }

  function prepare() {  // after a page load or a swap
    const svg = svgOf();
    if (!svg) return;
    const asked = queued;  // a search typed while the drawing was on its way
    queued = null;
    const current = document.querySelector("#graph").dataset.current;
    if (!svg.__seen) {  // a new drawing: the whole graph, or for a big one a readable part of it
      svg.__seen = true;
      const f = full(svg);
      if (f.w > BIG || f.h > BIG * 1.5) {
        const dag = svg.parentElement, w = Math.min(f.w, 900);
        setView(svg, f.x, f.y, w, w * dag.clientHeight / Math.max(dag.clientWidth, 1));
        centre(svg, current, false);
      } else fit(svg);
    } else centre(svg, current, true);  // the same drawing: move only if the node left the view
    find(document.querySelector("#graph .dagfind"), !!asked, asked && asked.open);
  }

  // A search before the drawing arrives waits for it (prepare runs it), and says so.
  let queued = null;
  function find(input, move, open) {  // open: look in the folded layers too (Enter)
    const svg = svgOf(), out = document.querySelector("#graph .dagfound");
    if (!input) return;
    if (!svg) {
      if (input.value.trim()) {
        queued = {open: open || (queued && queued.open)};
        if (out) out.textContent = document.querySelector("#graph").dataset.waiting;
      }
      return;
    }
    svg.querySelectorAll("g.node.found").forEach((g) => g.classList.remove("found"));
    const q = input.value.trim().toLowerCase();
    if (!q) { if (out) out.textContent = ""; return; }
    const hits = [...svg.querySelectorAll("g.node")].filter((g) => g.textContent.toLowerCase().includes(q));
    hits.forEach((g) => g.classList.add("found"));
    if (out) out.textContent = hits.length ? lensSay("found", {n: hits.length}) : lensSay("none_found");
    if (move && hits.length) {
      input.__next = ((input.__next ?? -1) + 1) % hits.length;
      centre(svg, hits[input.__next].id, false);
    } else if (open && !hits.length && document.querySelector("#graph .layers")) openLayerOf(q);
  }

  // Nothing drawn matches, but the graph has folded layers: ask which one holds a match, open
  // it, and search again in the new drawing (the search box keeps the words across the swap).
  let pending = null, opened = null;
  function openLayerOf(q) {
    const graph = document.querySelector("#graph");
    const url = graph && graph.dataset.find;
    if (!url || pending === q || opened === q) return;  // (asked already, or opened and still none)
    pending = q;
    fetch(`${url}${url.includes("?") ? "&" : "?"}q=${encodeURIComponent(q)}`)
      .then((r) => (r.ok ? r.json() : {url: null}))
      .then((found) => {
        if (found.url && pending === q) htmx.ajax("GET", found.url, {target: "#debugger", swap: "outerHTML"});
        else pending = null;
      })
      .catch(() => { pending = null; });
  }

  function searchAgain() {  // after the swap that opened the layer, once its drawing is in
    if (pending === null || !svgOf()) return;
    const input = document.querySelector("#graph .dagfind");
    if (input) { input.value = opened = pending; input.__next = -1; pending = null; find(input, true); }
  }

  // A drawing that did not come (graphviz stopped at its time limit: the server's message; no
  // answer at all: the panel's own) says so, with a button that asks for it again.
  function failed(ev) {
    const dag = ev.detail.elt;
    if (!dag.matches || !dag.matches("#graph .dag")) return;
    const xhr = ev.detail.xhr;
    const said = xhr && xhr.status === 503 && xhr.responseText.startsWith("<svg")
      ? new DOMParser().parseFromString(xhr.responseText, "image/svg+xml").documentElement.textContent
      : dag.dataset.failed;
    const p = document.createElement("p"), b = document.createElement("button");
    p.className = "drawing failed"; p.setAttribute("role", "alert"); p.textContent = `${said.trim()} `;
    b.type = "button"; b.dataset.dag = "retry"; b.textContent = dag.dataset.retry;
    p.appendChild(b);
    dag.replaceChildren(p);
  }
  ["htmx:responseError", "htmx:timeout", "htmx:sendError"].forEach((e) => document.addEventListener(e, failed));

  function retry(dag) {
    const p = dag.querySelector("p.drawing");
    p.classList.remove("failed"); p.setAttribute("role", "status");
    p.replaceChildren(document.createTextNode(dag.dataset.drawing));
    htmx.ajax("GET", dag.getAttribute("hx-get"), {target: dag, swap: "innerHTML"});
  }

  document.addEventListener("click", (ev) => {
    const b = ev.target.closest("#graph [data-dag]");
    if (b && b.dataset.dag === "retry") return retry(b.closest(".dag"));
    const svg = svgOf();
    if (!b || !svg) return;
    ({in: () => zoom(svg, 0.7), out: () => zoom(svg, 1 / 0.7), fit: () => fit(svg),
      current: () => centre(svg, document.querySelector("#graph").dataset.current, false)})[b.dataset.dag]();
  });
  document.addEventListener("input", (ev) => {
    if (ev.target.matches("#graph .dagfind")) { ev.target.__next = -1; opened = null; find(ev.target, true); }
  });
  document.addEventListener("keydown", (ev) => {  // Enter: the next match
    if (ev.key === "Enter" && ev.target.matches("#graph .dagfind")) { ev.preventDefault(); find(ev.target, true, true); }
  });
  document.addEventListener("wheel", (ev) => {
    const svg = ev.target.closest && ev.target.closest("#graph .dag > svg");
    if (!svg) return;
    ev.preventDefault();
    const p = svg.createSVGPoint(); p.x = ev.clientX; p.y = ev.clientY;
    const g = p.matrixTransform(svg.getScreenCTM().inverse());
    zoom(svg, ev.deltaY > 0 ? 1.15 : 1 / 1.15, g.x, g.y);
  }, {passive: false});

  let drag = null;  // panning: a press that moves more than a few pixels is a drag, not a click
  document.addEventListener("pointerdown", (ev) => {
    const svg = ev.target.closest && ev.target.closest("#graph .dag > svg");
    if (svg && ev.button === 0) drag = {svg, x: ev.clientX, y: ev.clientY, moved: false, b: {...full(svg), ...{x: box(svg).x, y: box(svg).y, w: box(svg).width, h: box(svg).height}}};
  });
  document.addEventListener("pointermove", (ev) => {
    if (!drag) return;
    const dx = ev.clientX - drag.x, dy = ev.clientY - drag.y;
    if (!drag.moved && Math.hypot(dx, dy) < 5) return;
    drag.moved = true;
    drag.svg.classList.add("dragging");
    const k = drag.b.w / drag.svg.clientWidth;
    setView(drag.svg, drag.b.x - dx * k, drag.b.y - dy * k, drag.b.w, drag.b.h);
  });
  document.addEventListener("pointerup", () => {
    if (drag && drag.moved) {
      drag.svg.classList.remove("dragging");
      const stop = (e) => { e.stopPropagation(); e.preventDefault(); };
      window.addEventListener("click", stop, {capture: true, once: true});  // the drag is not a click
      setTimeout(() => window.removeEventListener("click", stop, {capture: true}), 0);
    }
    drag = null;
  });

  document.addEventListener("DOMContentLoaded", prepare);
  document.addEventListener("htmx:afterSwap", prepare);  // before the URL is pushed: no flicker
  document.addEventListener("htmx:afterSettle", prepare);
  document.addEventListener("htmx:afterSettle", searchAgain);
  document.addEventListener("htmx:historyRestore", prepare);  // Back and Forward
  window.lensDag = {svgOf, box, full};  // for the browser tests
})();
