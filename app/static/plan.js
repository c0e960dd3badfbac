// The memory plan page: the context slider and its number box move together (the form sends the
// box, named c), and a refused setting's answer (422, llama.cpp's words) is swapped in like a plan.
(function () {
  "use strict";
  document.addEventListener("input", function (e) {
    var t = e.target;
    if (t.id === "plan-c-range") {
      document.getElementById("plan-c").value = t.value;
    } else if (t.id === "plan-c" && Number(t.value) > 0) {
      document.getElementById("plan-c-range").value = t.value;
    }
  }, true);
  document.addEventListener("htmx:beforeSwap", function (e) {
    var target = e.detail.target;
    if (e.detail.xhr.status === 422 && target && (target.id === "plan-figures" || target.id === "plan-fit")) {
      e.detail.shouldSwap = true;
      e.detail.isError = false;
    }
  });
})();
