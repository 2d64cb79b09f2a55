(function () {
  var root = document.getElementById("%(id)s");
  if (!root || root.getAttribute("data-ready")) return;
  root.setAttribute("data-ready", "1");
  var frames = root.querySelectorAll(".attn-frame");
  if (frames.length > 1) {
    var bar = document.createElement("div");
    bar.className = "attn-controls";
    var prev = document.createElement("button");
    prev.type = "button"; prev.className = "attn-prev"; prev.textContent = "\u25C0 Previous";
    var slider = document.createElement("input");
    slider.type = "range"; slider.className = "attn-slider";
    slider.min = "1"; slider.max = String(frames.length); slider.step = "1"; slider.value = "1";
    slider.setAttribute("aria-label", "%(slider_label)s");
    var next = document.createElement("button");
    next.type = "button"; next.className = "attn-next"; next.textContent = "Next \u25B6";
    var counter = document.createElement("span");
    counter.className = "attn-counter"; counter.setAttribute("aria-live", "polite");
    bar.appendChild(prev); bar.appendChild(slider); bar.appendChild(next); bar.appendChild(counter);
    root.insertBefore(bar, frames[0]);
    var show = function (k) {
      k = Math.max(0, Math.min(frames.length - 1, k));
      for (var i = 0; i < frames.length; i++) frames[i].hidden = (i !== k);
      root.setAttribute("data-frame", String(k + 1));
      slider.value = String(k + 1);
      prev.disabled = (k === 0); next.disabled = (k === frames.length - 1);
      counter.textContent = (k + 1) + " / " + frames.length + ": " + frames[k].getAttribute("data-title");
    };
    prev.addEventListener("click", function () { show(Number(slider.value) - 2); });
    next.addEventListener("click", function () { show(Number(slider.value)); });
    slider.addEventListener("input", function () { show(Number(slider.value) - 1); });
    show(%(start)d);
  }
  var readout = root.querySelector(".attn-readout");
  if (readout) {
    var cells = root.querySelectorAll("[data-readout]");
    var point = function (cell) {
      var old = root.querySelector(".attn-hover");
      if (old) old.classList.remove("attn-hover");
      cell.classList.add("attn-hover");
      readout.textContent = cell.getAttribute("data-readout");
    };
    for (var i = 0; i < cells.length; i++) {
      cells[i].tabIndex = 0;
      ["mouseover", "focus", "click"].forEach(function (name) {
        cells[i].addEventListener(name, function (event) { point(event.currentTarget); });
      });
    }
  }
})();
