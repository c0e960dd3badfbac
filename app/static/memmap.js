// The memory map: each context's pool drawn to scale over a window of byte offsets [lo, hi)
// that the learner zooms (wheel, buttons) and pans (drag), from the whole pool down to single
// bytes. Objects are labelled when wide enough; hover shows one, a click selects its tensor.
// The objects come from the pool bar above it (the server's segments); the window of each
// context is kept across steps.
(() => {
  const windows = {};  // context id -> [lo, hi]
  const MIN_SPAN = 16;  // bytes: the deepest zoom shows 16 bytes across

  const fmt = (n) => "0x" + Math.round(n).toString(16);

  function segsOf(map) {
    const bar = map.previousElementSibling;
    return {size: +bar.dataset.size, segs: [...bar.querySelectorAll("[data-start]")]};
  }

  function draw(map) {
    const {size, segs} = segsOf(map);
    const ctx = map.dataset.ctx;
    let [lo, hi] = windows[ctx] || [0, size];
    lo = Math.max(0, lo); hi = Math.min(size, Math.max(hi, lo + MIN_SPAN));
    windows[ctx] = [lo, hi];
    const track = map.querySelector(".memtrack"), w = track.clientWidth || 1, k = w / (hi - lo);
    track.replaceChildren();
    for (const s of segs) {
      const a = +s.dataset.start, b = a + +s.dataset.size;
      if (b <= lo || a >= hi) continue;
      const left = (Math.max(a, lo) - lo) * k, width = (Math.min(b, hi) - Math.max(a, lo)) * k;
      const el = document.createElement(s.tagName === "A" ? "a" : "span");
      el.className = s.className;
      if (s.tagName === "A") el.href = s.getAttribute("href");
      el.title = s.title;
      el.style.left = `${left}px`; el.style.width = `${Math.max(width, 1)}px`;
      if (width > 70) el.textContent = s.dataset.label;
      track.appendChild(el);
    }
    if ((hi - lo) * 1 <= w / 14) {  // a tick per byte once bytes are wide enough
      for (let x = Math.ceil(lo); x < hi; x++) {
        const t = document.createElement("i");
        t.className = "bytetick"; t.style.left = `${(x - lo) * k}px`;
        track.appendChild(t);
      }
    }
    map.querySelector(".memrange").textContent = lensSay("bytes_range", {
      lo: fmt(lo), hi: fmt(hi), n: Math.round(hi - lo).toLocaleString(), size: size.toLocaleString()});
  }

  function zoom(map, factor, at) {  // at: the byte offset that stays put
    const {size} = segsOf(map), [lo, hi] = windows[map.dataset.ctx] || [0, size];
    if (at === undefined) at = (lo + hi) / 2;
    let span = Math.min(size, Math.max(MIN_SPAN, (hi - lo) * factor));
    let nlo = at - (at - lo) * (span / (hi - lo));
    nlo = Math.min(Math.max(0, nlo), size - span);
    windows[map.dataset.ctx] = [nlo, nlo + span];
    draw(map);
  }

  function showStep(map) {  // the window around the bytes this step changed
    const {size, segs} = segsOf(map);
    const ch = segs.filter((s) => s.classList.contains("changed"));
    if (!ch.length) return;
    const a = Math.min(...ch.map((s) => +s.dataset.start));
    const b = Math.max(...ch.map((s) => +s.dataset.start + +s.dataset.size));
    const pad = Math.max((b - a) * 0.15, 8);
    windows[map.dataset.ctx] = [Math.max(0, a - pad), Math.min(size, b + pad)];
    draw(map);
  }

  const drawAll = () => document.querySelectorAll("#pool .memmap").forEach((m) => {
    m.classList.toggle("zoomed", m.dataset.ctx in windows);  // shown once the learner zooms
    if (m.dataset.ctx in windows) draw(m);
  });
  document.addEventListener("DOMContentLoaded", drawAll);
  document.addEventListener("htmx:afterSettle", drawAll);
  document.addEventListener("htmx:historyRestore", drawAll);  // Back and Forward
  window.addEventListener("resize", drawAll);

  document.addEventListener("click", (ev) => {
    const b = ev.target.closest("#pool [data-mem]");
    if (!b) return;
    const map = document.querySelector(`#pool .memmap[data-ctx="${b.closest(".memtools").dataset.ctx}"]`);
    map.classList.add("zoomed");
    ({in: () => zoom(map, 0.5), out: () => zoom(map, 2),
      all: () => { delete windows[map.dataset.ctx]; map.classList.remove("zoomed"); },
      step: () => showStep(map)})[b.dataset.mem]();
  });
  document.addEventListener("wheel", (ev) => {
    const track = ev.target.closest && ev.target.closest("#pool .memtrack");
    if (!track) return;
    ev.preventDefault();
    const map = track.closest(".memmap"), {size} = segsOf(map);
    const [lo, hi] = windows[map.dataset.ctx] || [0, size];
    const r = track.getBoundingClientRect();
    zoom(map, ev.deltaY > 0 ? 1.25 : 0.8, lo + (ev.clientX - r.left) / r.width * (hi - lo));
  }, {passive: false});

  let drag = null;
  document.addEventListener("pointerdown", (ev) => {
    const track = ev.target.closest && ev.target.closest("#pool .memtrack");
    if (!track || ev.button !== 0) return;
    const map = track.closest(".memmap");
    drag = {map, x: ev.clientX, win: windows[map.dataset.ctx] || [0, segsOf(map).size], moved: false};
  });
  document.addEventListener("pointermove", (ev) => {
    if (!drag) return;
    const dx = ev.clientX - drag.x;
    if (!drag.moved && Math.abs(dx) < 5) return;
    drag.moved = true;
    const {size} = segsOf(drag.map), [lo, hi] = drag.win, track = drag.map.querySelector(".memtrack");
    const shift = -dx / track.clientWidth * (hi - lo);
    const nlo = Math.min(Math.max(0, lo + shift), size - (hi - lo));
    windows[drag.map.dataset.ctx] = [nlo, nlo + hi - lo];
    draw(drag.map);
  });
  document.addEventListener("pointerup", () => {
    if (drag && drag.moved) {
      const stop = (e) => { e.stopPropagation(); e.preventDefault(); };
      window.addEventListener("click", stop, {capture: true, once: true});
      setTimeout(() => window.removeEventListener("click", stop, {capture: true}), 0);
    }
    drag = null;
  });
  window.lensMemmap = {windows, zoom, draw};  // for the browser tests
})();
