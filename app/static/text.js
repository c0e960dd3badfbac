// The few sentences the scripts write, in the page's language: the server puts them, translated,
// in <script id="lens-text" type="application/json"> (app/i18n.py JS_TEXT); say() fills {names}.
window.lensSay = (() => {
  const el = document.getElementById("lens-text");
  const text = el ? JSON.parse(el.textContent) : {};
  return (key, vars = {}) => (text[key] || key).replace(/\{(\w+)\}/g, (m, name) => vars[name] ?? m);
})();
