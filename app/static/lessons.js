// Lessons in the browser: the learner's progress (localStorage, no account), the map and the home
// page marked with it, and a lesson page that walks its questions: the debugger loaded at each
// question's step (the step before it while the question is open, the step itself once answered),
// the panel that shows the answer opened, and the server's verdicts followed.
(() => {
  const KEY = "lens-lessons";  // {lesson id: {at: question shown, done: [questions answered or revealed]}}
  const LEARNER = "lens-learner";  // a random id a class's tally counts answers by (no name)

  function load() {
    try { return JSON.parse(localStorage.getItem(KEY)) || {}; } catch (e) { return {}; }
  }
  function save(all) {
    try { localStorage.setItem(KEY, JSON.stringify(all)); } catch (e) { /* private mode: progress is not kept */ }
  }
  function learner() {
    let id = null;
    try { id = localStorage.getItem(LEARNER); } catch (e) { /* private mode */ }
    if (!id) {
      id = Array.from(crypto.getRandomValues(new Uint8Array(12)), (b) => b.toString(16).padStart(2, "0")).join("");
      try { localStorage.setItem(LEARNER, id); } catch (e) { /* private mode */ }
    }
    return id;
  }
  const fill = (text, vars) => text.replace(/\{(\w+)\}/g, (m, k) => vars[k] ?? m);

  // --- the map and the home page: what this browser has done ----------------------------------
  function markMap() {
    const all = load();
    const list = document.querySelector(".lessonmap");
    document.querySelectorAll(".lessonitem[data-lesson]").forEach((li) => {
      const mine = all[li.dataset.lesson], n = +li.dataset.stops;
      const done = mine ? new Set(mine.done).size : 0;
      li.classList.toggle("done", done >= n);
      li.classList.toggle("started", done > 0 && done < n);
      const out = li.querySelector("[data-progress]");
      if (out && list) out.textContent = done >= n ? list.dataset.sayDone
        : done ? fill(list.dataset.sayProgress, {done, n}) : "";
    });
    const cont = document.querySelector("a[data-continue]");  // the home page: where to go on
    const order = document.getElementById("lesson-order");
    if (cont && order) {
      const lessons = [...order.children].map((li) => ({id: li.dataset.id, concept: li.dataset.concept, n: +li.dataset.n}));
      const started = lessons.some((x) => all[x.id]);
      const next = lessons.find((x) => !all[x.id] || new Set(all[x.id].done).size < x.n);
      if (started && next) {
        cont.href = `/lessons/${next.id}`;
        cont.textContent = fill(cont.dataset.continue, {concept: next.concept});
      }
    }
  }
  document.addEventListener("DOMContentLoaded", markMap);

  // --- a lesson page --------------------------------------------------------------------------
  const root = () => document.querySelector(".lesson[data-lesson]");
  function progress() {
    const all = load(), id = root().dataset.lesson;
    all[id] = all[id] || {at: 0, done: []};
    return {all, mine: all[id]};
  }
  function stopEl(i) { return document.getElementById(`stop-${i}`); }
  function current() { return +(document.querySelector(".stop:not([hidden])") || {dataset: {index: 0}}).dataset.index; }

  function loadDebugger(url, panel) {
    const slot = document.getElementById("debugger");
    if (!slot) return;
    slot.dataset.panel = panel || "";
    htmx.ajax("GET", url, {target: "#debugger", swap: "outerHTML"});
  }

  function show(i) {
    const n = +root().dataset.stops;
    i = Math.max(0, Math.min(n - 1, i));
    const {all, mine} = progress();
    mine.at = i;
    save(all);
    document.querySelectorAll(".lesson .stop").forEach((s) => { s.hidden = +s.dataset.index !== i; });
    document.querySelector(".lesson-done").hidden = true;
    const stop = stopEl(i), done = mine.done.includes(i);
    const verdict = stop.querySelector(".verdict");
    if (done && !verdict.children.length) verdict.replaceChildren(document.getElementById("answered-note").content.cloneNode(true));
    dots();
    loadDebugger(done ? stop.dataset.stepUrl : stop.dataset.askedUrl, stop.dataset.panel);
    const input = stop.querySelector("input[type=text]");
    if (input && !done) input.focus({preventScroll: true});
  }

  function dots() {
    const {mine} = progress();
    document.querySelectorAll(".stopdots button[data-goto]").forEach((b) => {
      const i = +b.dataset.goto;
      b.classList.toggle("done", mine.done.includes(i));
      b.setAttribute("aria-current", String(i === mine.at));
    });
  }

  function finish() {
    document.querySelectorAll(".lesson .stop").forEach((s) => { s.hidden = true; });
    document.querySelector(".lesson-done").hidden = false;
  }

  function openPanel(id, scroll) {  // the panel that shows the answer: its tab chosen, outlined
    const box = document.querySelector("#debugger .tabbed");
    if (box && box.querySelector(`.tab[data-panel="${id}"]`)) {
      box.dataset.tab = id;
      box.querySelectorAll(".tab").forEach((t) => t.setAttribute("aria-selected", String(t.dataset.panel === id)));
    }
    document.querySelectorAll("#debugger .lesson-focus").forEach((el) => el.classList.remove("lesson-focus"));
    const el = document.querySelector(`#debugger #${id}`);
    if (el) {
      el.classList.add("lesson-focus");
      if (scroll) el.scrollIntoView({block: "center", behavior: "smooth"});
    }
  }

  function start() {
    const r = root();
    if (!r) return;
    const me = learner();
    document.querySelectorAll(".answerform input[name=learner]").forEach((x) => { x.value = me; });
    const asked = new URLSearchParams(location.search).get("stop");  // a link to a question: ?stop=3
    show(asked ? +asked - 1 : progress().mine.at || 0);
  }
  document.addEventListener("DOMContentLoaded", start);

  // the debugger swapped in: the lesson keeps its own address and title, and the panel is opened
  document.addEventListener("htmx:beforeHistoryUpdate", (ev) => {
    if (!root()) return;
    ev.detail.history.type = "replace";
    ev.detail.history.path = location.pathname + location.search;
  });
  document.addEventListener("htmx:afterSettle", (ev) => {
    const r = root();
    if (!r) return;
    if (r.dataset.title) document.title = r.dataset.title;
    const dbg = document.getElementById("debugger");
    if (dbg && (ev.target === dbg || dbg.contains(ev.target))) {
      dbg.removeAttribute("aria-busy");
      const stop = stopEl(current());
      if (stop) openPanel(stop.dataset.panel, false);
    }
  });

  // a verdict arrived: right or revealed moves the debugger to the step itself
  document.addEventListener("htmx:afterSwap", (ev) => {
    const body = ev.target.querySelector && ev.target.querySelector(".verdict-body");
    if (!root() || !body || !ev.target.classList.contains("verdict")) return;
    const stop = ev.target.closest(".stop"), i = +stop.dataset.index;
    if (body.dataset.right === "true" || body.dataset.revealed === "true") {
      const {all, mine} = progress();
      if (!mine.done.includes(i)) mine.done.push(i);
      save(all);
      dots();
      loadDebugger(stop.dataset.stepUrl, stop.dataset.panel);
      const next = body.querySelector('[data-act="next"]');
      if (next) next.focus({preventScroll: true});
    } else {
      openPanel(stop.dataset.panel, false);  // (debugger.js put the learner's own tab back)
      const input = stop.querySelector("input[type=text]");
      if (input) { input.focus({preventScroll: true}); input.select(); }
    }
  });

  document.addEventListener("click", (ev) => {
    if (!root()) return;
    const dot = ev.target.closest(".stopdots button[data-goto]");
    if (dot) return show(+dot.dataset.goto);
    const act = ev.target.closest("[data-act]");
    if (!act) return;
    const i = current(), n = +root().dataset.stops;
    if (act.dataset.act === "show") openPanel(stopEl(i).dataset.panel, true);
    if (act.dataset.act === "next") (i + 1 < n ? show(i + 1) : finish());
  });
})();
