// Keep figures legible on narrow screens: an output image is never shown at less than
// MIN_SCALE of its own size; a wider one scrolls sideways inside its output box.
(function () {
  const MIN_SCALE = 0.65;
  function keepLegible(img) {
    const box = img.closest("div.cell_output");
    if (!box || !img.naturalWidth) return;
    const minWidth = Math.round(img.naturalWidth * MIN_SCALE);
    box.classList.add("attn-figure-scroll");
    img.style.width = "100%";
    img.style.maxWidth = img.naturalWidth + "px";
    img.style.minWidth = minWidth + "px";
  }
  function run() {
    for (const img of document.querySelectorAll("div.cell_output img")) {
      if (img.complete) keepLegible(img); else img.addEventListener("load", () => keepLegible(img));
    }
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", run);
  else run();
})();
