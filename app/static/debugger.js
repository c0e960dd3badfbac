// The few things htmx cannot do: arrow keys and the step scrubber.
document.addEventListener("keydown", (ev) => {
  if (ev.target.closest("input, select, textarea") || ev.altKey || ev.ctrlKey || ev.metaKey) return;
  const btn = document.querySelector(`#stepnav a[data-key="${ev.key}"]:not([aria-disabled]), #steps a[data-key="${ev.key}"]:not([aria-disabled])`);
  if (btn) { ev.preventDefault(); btn.click(); }
});
document.addEventListener("change", (ev) => {
  const r = ev.target.closest("#stepnav input[type=range]");
  if (!r) return;
  const q = r.dataset.query ? `?${r.dataset.query}` : "";
  const url = r.dataset.base + r.value + q;
  htmx.ajax("GET", url, {target: "#debugger", swap: "outerHTML"}).then(() => history.pushState({}, "", url));
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
