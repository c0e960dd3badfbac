// The playground's editor: CodeMirror (vendored) over the form's textarea, which still submits
// the program; Ctrl+Enter runs; a refused line is marked and the cursor put there.
document.addEventListener("DOMContentLoaded", () => {
  const area = document.getElementById("source");
  if (!area || typeof CodeMirror === "undefined") return;
  const form = document.getElementById("programform");
  const run = () => { editor.save(); form.requestSubmit ? form.requestSubmit() : form.submit(); };
  const editor = CodeMirror.fromTextArea(area, {
    mode: "python", lineNumbers: true, indentUnit: 4, tabSize: 4, indentWithTabs: false,
    matchBrackets: true, viewportMargin: Infinity,
    extraKeys: {
      "Ctrl-Enter": run, "Cmd-Enter": run,
      Tab: (cm) => cm.somethingSelected() ? cm.indentSelection("add") : cm.replaceSelection("    ", "end"),
      "Shift-Tab": (cm) => cm.indentSelection("subtract"),
    },
  });
  window.playgroundEditor = editor;
  const refusal = document.getElementById("refusal");
  if (refusal) {
    const line = Number(refusal.dataset.line) - 1, ch = Number(refusal.dataset.column);
    editor.addLineClass(line, "background", "refused-line");
    editor.setCursor({line, ch});
    editor.scrollIntoView({line, ch}, 80);
  }
  editor.focus();
});
