// The few sentences the scripts write, in the page's language: the server puts them, translated,
// in <script id="lens-text" type="application/json"> (app/i18n.py JS_TEXT); say() fills {names}.
window.lensSay = (() => {
  const el = document.getElementById("lens-text");
  const text = el ? JSON.parse(el.textContent) : {};
  return (key, vars = {}) => (text[key] || key).replace(/\{(\w+)\}/g, (m, name) => vars[name] ?? m);
})();

// The language switch keeps the page the learner is on, even after htmx moved to another step
// without redrawing the header.
document.addEventListener("click", (ev) => {
  const a = ev.target.closest("a.lang[data-lang]");
  if (!a) return;
  const here = new URL(location.href);
  here.searchParams.set("lang", a.dataset.lang);
  a.href = here.pathname + here.search;
});
