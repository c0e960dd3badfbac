// Compare: a second file chosen from the disk is sent as the raw body to /compare/upload (the
// server caps and checks it), then picked in the "Against" list and the form sent.
(() => {
  document.addEventListener("change", async (ev) => {
    const input = ev.target;
    if (input.id !== "cmp-upload" || !input.files.length) return;
    const status = document.getElementById("cmp-upload-status");
    status.textContent = status.dataset.uploading;
    let answer;
    try {
      const r = await fetch("/compare/upload", { method: "POST", body: input.files[0] });
      answer = await r.json();
    } catch (e) {
      answer = { error: String(e) };
    }
    if (!answer.digest) {
      status.textContent = answer.error || "?";
      return;
    }
    const select = document.getElementById("cmp-b");
    const option = new Option(input.files[0].name, answer.digest, true, true);
    select.add(option);
    status.textContent = "";
    document.getElementById("cmp-form").submit();
  });

  // ← and → step to the previous and the next node (not while typing in a field)
  document.addEventListener("keydown", (ev) => {
    if (ev.altKey || ev.ctrlKey || ev.metaKey || ev.target.closest("input, select, textarea")) return;
    const rel = { ArrowLeft: "prev", ArrowRight: "next" }[ev.key];
    const link = rel && document.querySelector(`#cmp-node a[rel=${rel}]`);
    if (link) {
      ev.preventDefault();
      link.click();
    }
  });
})();
