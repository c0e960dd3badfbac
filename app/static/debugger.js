// The few things htmx cannot do: keys, the step scrubber, keeping the current line in view.

// Every key press counts. Arrow keys move a target step: presses that arrive while a step is
// loading move the target further, and when the swap lands the debugger goes straight to it (a
// held key scrubs). Other keys (next call, next node, layer jumps) are queued and replayed in
// order, each from the step the one before it reached.
const keys = {busy: false, target: null, queue: []};

function currentStep() {
  const r = document.querySelector("#stepnav input[type=range]");
  return r ? {index: +r.value, max: +r.max} : null;
}

function stepUrl(k) {  // the arrow buttons' link with the step number changed (keeps t, threads, file)
  const a = document.querySelector('#stepnav a[data-key="ArrowRight"][href], #stepnav a[data-key="ArrowLeft"][href]');
  return a && a.getAttribute("href").replace(/\/steps\/\d+/, `/steps/${k}`);
}

function go(url) {
  keys.busy = true;
  htmx.ajax("GET", url, {target: "#debugger", swap: "outerHTML"})
    .then(() => history.pushState({}, "", url))
    .finally(() => { keys.busy = false; pump(); });
}

function pump() {
  if (keys.busy) return;
  const cur = currentStep();
  if (keys.target !== null && cur && keys.target !== cur.index) return go(stepUrl(keys.target));
  keys.target = null;
  while (keys.queue.length) {
    const key = keys.queue.shift();
    const btn = document.querySelector(`#stepnav a[data-key="${key}"][href]:not([aria-disabled]), #steps a[data-key="${key}"][href]:not([aria-disabled])`);
    if (btn) return go(btn.getAttribute("href"));
  }
}

document.addEventListener("keydown", (ev) => {
  if (ev.target.closest("input, select, textarea") || ev.altKey || ev.ctrlKey || ev.metaKey) return;
  const cur = currentStep();
  if (cur && (ev.key === "ArrowRight" || ev.key === "ArrowLeft")) {
    ev.preventDefault();
    const from = keys.target !== null ? keys.target : cur.index;
    keys.target = Math.min(cur.max, Math.max(0, from + (ev.key === "ArrowRight" ? 1 : -1)));
    return pump();
  }
  if (document.querySelector(`#stepnav a[data-key="${ev.key}"], #steps a[data-key="${ev.key}"]`)) {
    ev.preventDefault();
    keys.queue.push(ev.key);
    pump();
  }
});

document.addEventListener("change", (ev) => {
  const r = ev.target.closest("#stepnav input[type=range]");
  if (!r) return;
  const q = r.dataset.query ? `?${r.dataset.query}` : "";
  keys.target = null;
  go(r.dataset.base + r.value + q);
});
document.addEventListener("input", (ev) => {
  const r = ev.target.closest("#stepnav input[type=range]");
  if (r) r.closest("form").querySelector("output").textContent = `${r.value} / ${r.max}`;
});

// keep the current source line in view (inside the code panel, not the page)
function showCurrentLine() {
  const line = document.querySelector("#source .line.current");
  const pre = line && line.closest("pre");
  if (pre) pre.scrollTop = line.offsetTop - pre.offsetTop - pre.clientHeight / 2;
  const step = document.querySelector("#steps li.current");  // and the current step in the list
  const list = step && step.closest("ul.groups");
  if (list) list.scrollTop = step.offsetTop - list.offsetTop - list.clientHeight / 2;
}
document.addEventListener("DOMContentLoaded", showCurrentLine);
document.addEventListener("htmx:afterSettle", showCurrentLine);

// The panels under the DAG are tabs; the learner's choice is remembered (this browser), and a
// link that asks for a tensor's bytes opens the Bytes tab.
function showTab(id, remember) {
  const box = document.querySelector("#debugger .tabbed");
  if (!box) return;
  if (!box.querySelector(`:scope > section#${id}`)) id = "struct";
  box.dataset.tab = id;
  box.querySelectorAll(".tab").forEach((t) => t.setAttribute("aria-selected", String(t.dataset.panel === id)));
  if (remember) try { localStorage.setItem("lens-tab", id); } catch (e) { /* private mode */ }
}
function restoreTab() {
  let id = null;
  try { id = localStorage.getItem("lens-tab"); } catch (e) { /* private mode */ }
  if (new URLSearchParams(location.search).get("hex") === "data") id = "hexview";
  showTab(id || "struct", false);
}
document.addEventListener("click", (ev) => {
  const t = ev.target.closest("#debugger .tabs .tab");
  if (t) showTab(t.dataset.panel, true);
});
document.addEventListener("DOMContentLoaded", restoreTab);
document.addEventListener("htmx:afterSwap", restoreTab);
