// The recording page polls itself every second (htmx) until the server answers with the
// debugger's address (HX-Redirect). From then on the browser is leaving: a poll more would be
// answered with the same address and start the navigation under way again, so none is sent.
// Between polls the seconds count on here, so a slow answer does not freeze them.
(() => {
  let leaving = false;
  let since = performance.now();  // when the server last said how long the run has taken

  document.addEventListener("htmx:beforeOnLoad", (ev) => {
    if (ev.detail.xhr.getResponseHeader("HX-Redirect")) leaving = true;
  });
  document.addEventListener("htmx:beforeRequest", (ev) => {
    if (leaving && ev.detail.elt.closest("#recording")) ev.preventDefault();
  });
  document.addEventListener("htmx:afterSettle", () => { since = performance.now(); });

  setInterval(() => {
    const secs = document.querySelector("#recording .secs[data-seconds]");
    if (secs) secs.textContent = +secs.dataset.seconds + Math.floor((performance.now() - since) / 1000);
  }, 250);
})();
