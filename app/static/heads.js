// Header-only uploads (app/heads.py): a file over the upload limit is inspected from its first
// bytes, read here in the browser with File.slice; a tensor's page that needs bytes not sent
// asks for the same file again and sends only those bytes.
(() => {
  const PROBE = 4096;

  async function sendHead(file, status) {
    let n = Math.min(file.size, 16 << 20);
    for (;;) {
      status.textContent = lensSay("sending_head", {n: n.toLocaleString(), size: file.size.toLocaleString()});
      const r = await fetch(`/gguf/head?size=${file.size}`, {method: "POST", body: file.slice(0, n)});
      const j = await r.json();
      if (j.url) { location.href = j.url; return; }
      if (j.need && j.need > n) { n = Math.min(j.need, file.size); continue; }
      status.textContent = j.error || lensSay("server_answered", {status: r.status});
      status.classList.add("error");
      return;
    }
  }

  document.addEventListener("submit", (ev) => {
    const form = ev.target.closest("form.upload[data-limit]");
    const file = form && form.querySelector("input[type=file]").files[0];
    if (!file || file.size <= +form.dataset.limit) return;  // small enough: upload it whole
    ev.preventDefault();
    sendHead(file, form.parentElement.querySelector(".headstatus"));
  });

  document.addEventListener("change", async (ev) => {
    const box = ev.target.closest("section.needs[data-ranges]");
    const file = box && ev.target.files[0];
    if (!file) return;
    const status = box.querySelector(".headstatus");
    const spans = box.dataset.ranges.split(",").map((r) => r.split(":").map(Number));
    const parts = [file.slice(0, Math.min(PROBE, file.size)), ...spans.map(([a, n]) => file.slice(a, a + n))];
    status.textContent = lensSay("sending");
    const r = await fetch(`/gguf/${box.dataset.digest}/bytes?probe=${Math.min(PROBE, file.size)}&ranges=${box.dataset.ranges}`,
                          {method: "POST", body: new Blob(parts)});
    const j = await r.json();
    if (j.ok) location.reload();
    else { status.textContent = j.error || lensSay("server_answered", {status: r.status}); status.classList.add("error"); }
  });
})();
