// The perplexity page's heat map: the "Colour by" radios switch the map (and its legend) between
// −log p and the KL divergence; a click on a token shows its figures (its title) in the detail
// line, for touch screens and for copying. Delegated, so a map swapped in by the poll works too.
// On the form, typing a text of one's own chooses it.
(() => {
  document.addEventListener("input", (ev) => {
    if (ev.target.id !== "ppl-text") return;
    const own = document.querySelector("#ppl-form input[name='source'][value='own']");
    if (own && ev.target.value.trim()) own.checked = true;
  });
  document.addEventListener("change", (ev) => {
    const radio = ev.target.closest("input[name='heat-by']");
    const heat = document.getElementById("heat");
    if (!radio || !heat) return;
    heat.classList.toggle("by-kld", radio.value === "kld");
    heat.classList.toggle("by-nll", radio.value !== "kld");
    document.body.classList.toggle("heat-kld", radio.value === "kld");
  });
  document.addEventListener("click", (ev) => {
    const t = ev.target.closest("#heat .t");
    const detail = document.getElementById("ppl-detail");
    if (!t || !detail) return;
    document.querySelectorAll("#heat .t.picked").forEach((x) => x.classList.remove("picked"));
    t.classList.add("picked");
    detail.textContent = t.title;
  });
})();
