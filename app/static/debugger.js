// The few things htmx cannot do: keys and clicks on the step buttons, the step scrubber, the
// address bar and title following the step shown, keeping the current line in view.
// It runs once per page (loaded in the head: htmx restoring history after Back swaps the body,
// and would run the body's scripts again); after such a restore `restored` puts the panels back.
(() => {

  // Every key press and every click on a step button counts. Arrow keys (and the previous and
  // next step buttons) move a target step: presses that arrive while a step is loading move the
  // target further, and when the swap lands the debugger goes straight to it (a held key scrubs).
  // Other keys and buttons (next call, next node, layer jumps) are queued and replayed in order,
  // each from the step the one before it reached.
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

  function press(key) {  // true if the key is a step key (then it is queued)
    const cur = currentStep();
    if (cur && (key === "ArrowRight" || key === "ArrowLeft")) {
      const from = keys.target !== null ? keys.target : cur.index;
      keys.target = Math.min(cur.max, Math.max(0, from + (key === "ArrowRight" ? 1 : -1)));
      pump();
      return true;
    }
    if (document.querySelector(`#stepnav a[data-key="${key}"], #steps a[data-key="${key}"]`)) {
      keys.queue.push(key);
      pump();
      return true;
    }
    return false;
  }

  document.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey) && ev.target.matches(".promptform textarea")) {
      ev.preventDefault();  // Enter is a new line of the prompt; Ctrl+Enter runs it
      ev.target.form.requestSubmit();
      return;
    }
    if (ev.target.closest("input, select, textarea") || ev.altKey || ev.ctrlKey || ev.metaKey) return;
    if (press(ev.key)) ev.preventDefault();
  });

  // A click on a step button is its key: captured before htmx's boost sees it, so a click while
  // the page is loading is not lost (the button still on screen is the step before).
  document.addEventListener("click", (ev) => {
    const btn = ev.target.closest('#stepnav a[data-key], #steps a[data-key]');
    if (!btn || ev.button !== 0 || ev.ctrlKey || ev.metaKey || ev.shiftKey || ev.altKey) return;
    ev.preventDefault();
    ev.stopImmediatePropagation();
    if (!btn.hasAttribute("aria-disabled") || keys.busy) press(btn.dataset.key);
  }, true);

  // The address bar is the step shown, whatever showed it (a key, a button, the scrubber, a link):
  // the server names it in HX-Push-Url, so htmx's own history (Back, Forward) knows every step.
  // The title follows it here.
  function followStep() {
    const root = document.getElementById("debugger");
    if (root && root.dataset.title) document.title = root.dataset.title;
  }
  document.addEventListener("htmx:afterSettle", followStep);

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

  // keep the current source line in view (inside the code panel, not the page), and the current
  // step and the selected tensor in their lists
  function showCurrentLine() {
    const line = document.querySelector("#source .line.current");
    const pre = line && line.closest("pre");
    if (pre) pre.scrollTop = line.offsetTop - pre.offsetTop - pre.clientHeight / 2;
    const step = document.querySelector("#steps li.current");  // and the current step in the list
    const list = step && step.closest("ul.groups");
    if (list) list.scrollTop = step.offsetTop - list.offsetTop - list.clientHeight / 2;
    showSelectedTensor();
  }
  function showSelectedTensor() {  // in the page of the tensor list that holds it (a shown tab)
    const row = document.querySelector("#tensors tr.selected");
    const rows = row && row.closest(".tscroll");
    if (!rows || !rows.clientHeight) return;
    rows.scrollTop += row.getBoundingClientRect().top - rows.getBoundingClientRect().top - rows.clientHeight / 2;
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
    if (id === "tensors") showSelectedTensor();
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

  // Back and Forward: htmx puts the step's page back without the swap events above
  document.addEventListener("htmx:historyRestore", () => {
    keys.target = null;
    keys.queue.length = 0;
    restoreTab();
    followStep();
    showCurrentLine();
  });
})();
