// The GPT that writes, in the page (attnlib/live_writer.py). Each function mirrors the Python
// named beside it; tests/test_live_figures.py checks the page's logits against Python to 1e-6
// and its sampled text exactly. Defined once per page, whatever the figure count.
(function () {
  if (window.attnWriter) return;
  var W = {};

  // the float32 weights, sent as base64 of little-endian float32, as Float64Arrays by name
  W.decode = function (data) {
    var bytes = atob(data.weights), buffer = new ArrayBuffer(bytes.length), u8 = new Uint8Array(buffer);
    for (var i = 0; i < bytes.length; i++) u8[i] = bytes.charCodeAt(i);
    var view = new DataView(buffer), out = {}, offset = 0;
    data.manifest.forEach(function (entry) {
      var n = entry[1].reduce(function (a, b) { return a * b; }, 1), a = new Float64Array(n);
      for (var j = 0; j < n; j++) a[j] = view.getFloat32(4 * (offset + j), true);
      out[entry[0]] = {data: a, shape: entry[1]};
      offset += n;
    });
    return out;
  };

  // x (k,) @ w (k, m) -> (m,): w row-major
  W.vecmat = function (x, w) {
    var k = w.shape[0], m = w.shape[1], out = new Float64Array(m);
    for (var i = 0; i < k; i++) {
      var xi = x[i], row = i * m;
      for (var j = 0; j < m; j++) out[j] += xi * w.data[row + j];
    }
    return out;
  };
  // attnlib.learn.transformer.LayerNorm.forward on one vector
  W.layerNorm = function (x, gain, bias, eps) {
    var n = x.length, mean = 0, variance = 0, out = new Float64Array(n);
    for (var i = 0; i < n; i++) mean += x[i];
    mean /= n;
    for (i = 0; i < n; i++) variance += (x[i] - mean) * (x[i] - mean);
    variance /= n;
    var sd = Math.sqrt(variance + eps);
    for (i = 0; i < n; i++) out[i] = (x[i] - mean) / sd * gain.data[i] + bias.data[i];
    return out;
  };
  // math.erf to about 1e-15: Taylor series below 2, a continued fraction for erfc above
  W.erf = function (x) {
    var z = Math.abs(x), result;
    if (z < 2) {
      var term = z, sum = z, n = 0;
      while (Math.abs(term) > 1e-17 * Math.abs(sum)) {
        n += 1;
        term *= -z * z / n;
        sum += term / (2 * n + 1);
      }
      result = 2 / Math.sqrt(Math.PI) * sum;
    } else if (z < 6) {
      // erfc(z) = exp(-z^2) / sqrt(pi) * 1 / (z + (1/2) / (z + 1 / (z + (3/2) / (z + 2 / (z + ...)))))
      var f = z;
      for (var k = 60; k >= 1; k--) f = z + (k / 2) / f;
      result = 1 - Math.exp(-z * z) / Math.sqrt(Math.PI) / f;
    } else {
      result = 1;
    }
    return x < 0 ? -result : result;
  };
  // torch.nn.functional.gelu (exact): x * (1 + erf(x / sqrt 2)) / 2
  W.gelu = function (x) { return 0.5 * x * (1 + W.erf(x / Math.SQRT2)); };
  // attnlib.rope, style "half", on one head's vector at position m
  W.rope = function (x, m, base) {
    var d = x.length, half = d / 2, out = new Float64Array(d);
    for (var i = 0; i < half; i++) {
      var angle = m * Math.pow(base, -2 * i / d), c = Math.cos(angle), s = Math.sin(angle);
      out[i] = x[i] * c - x[i + half] * s;
      out[i + half] = x[i] * s + x[i + half] * c;
    }
    return out;
  };
  // attnlib.softmax on one row
  W.softmax = function (row) {
    var top = -Infinity, i, total = 0, out = new Float64Array(row.length);
    for (i = 0; i < row.length; i++) top = Math.max(top, row[i]);
    for (i = 0; i < row.length; i++) { out[i] = Math.exp(row[i] - top); total += out[i]; }
    for (i = 0; i < row.length; i++) out[i] /= total;
    return out;
  };

  // attnlib.live_writer.step: one new token at position pos through every block, its keys
  // and values appended to each block's cache (the last `window` kept); the logits and the maps
  W.step = function (m, w, caches, token, pos) {
    var d = m.d_model, H = m.n_heads, dh = d / H;
    var x = w.embedding.data.slice(token * d, (token + 1) * d);
    var maps = [];
    for (var l = 0; l < m.n_layers; l++) {
      var p = "blocks." + l + ".";
      var h = W.layerNorm(x, w[p + "norm_1.gain"], w[p + "norm_1.bias"], m.eps);
      var q = W.vecmat(h, w[p + "w_q"]), k = W.vecmat(h, w[p + "w_k"]), v = W.vecmat(h, w[p + "w_v"]);
      var cache = caches[l], heads = new Float64Array(d), layerMaps = [];
      var kh = [], vh = [];
      for (var j = 0; j < H; j++) {
        kh.push(W.rope(k.slice(j * dh, (j + 1) * dh), pos, m.rope_base));
        vh.push(v.slice(j * dh, (j + 1) * dh));
      }
      cache.push({k: kh, v: vh});
      if (cache.length > m.window) cache.shift();
      for (j = 0; j < H; j++) {
        var qj = W.rope(q.slice(j * dh, (j + 1) * dh), pos, m.rope_base), scale = 1 / Math.sqrt(dh);
        var scores = cache.map(function (entry) {
          var s = 0;
          for (var c = 0; c < dh; c++) s += qj[c] * entry.k[j][c];
          return s * scale;
        });
        var weights = W.softmax(scores);
        for (var t = 0; t < cache.length; t++) {
          for (var c2 = 0; c2 < dh; c2++) heads[j * dh + c2] += weights[t] * cache[t].v[j][c2];
        }
        layerMaps.push(Array.prototype.slice.call(weights));
      }
      maps.push(layerMaps);
      var added = W.vecmat(heads, w[p + "w_o"]);
      for (var i = 0; i < d; i++) x[i] += added[i];
      var h2 = W.layerNorm(x, w[p + "norm_2.gain"], w[p + "norm_2.bias"], m.eps);
      var hidden = W.vecmat(h2, w[p + "mlp.w_1"]);
      for (i = 0; i < hidden.length; i++) hidden[i] = W.gelu(hidden[i] + w[p + "mlp.b_1"].data[i]);
      var out = W.vecmat(hidden, w[p + "mlp.w_2"]);
      for (i = 0; i < d; i++) x[i] += out[i] + w[p + "mlp.b_2"].data[i];
    }
    var logits = W.vecmat(W.layerNorm(x, w["norm.gain"], w["norm.bias"], m.eps), w.unembedding);
    return {logits: logits, maps: maps};
  };

  // attnlib.sampling.Uniform: mulberry32
  W.uniform = function (seed) {
    var state = seed >>> 0;
    return function () {
      state = (state + 0x6D2B79F5) >>> 0;
      var t = state;
      t = Math.imul(t ^ (t >>> 15), t | 1);
      t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
      return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    };
  };
  // attnlib.sampling.sample_next with temperature only (no top-k, no top-p)
  W.sampleNext = function (logits, temperature, next) {
    var i, best = 0;
    if (temperature === 0) {
      for (i = 1; i < logits.length; i++) if (logits[i] > logits[best]) best = i;
      return best;
    }
    var top = -Infinity, p = new Float64Array(logits.length), total = 0;
    for (i = 0; i < logits.length; i++) top = Math.max(top, logits[i]);
    for (i = 0; i < logits.length; i++) { p[i] = Math.exp((logits[i] - top) / temperature); total += p[i]; }
    for (i = 0; i < p.length; i++) p[i] /= total;
    var order = [];
    for (i = 0; i < p.length; i++) order.push(i);
    order.sort(function (a, b) { return p[b] - p[a] || a - b; });  // most likely first, lower id on a tie
    var kept = 0;
    for (i = 0; i < order.length; i++) kept += p[order[i]];
    var u = next(), cumulative = 0, count = 0;
    for (i = 0; i < order.length; i++) {
      cumulative += p[order[i]] / kept;
      if (cumulative <= u) count += 1;
    }
    return order[Math.min(count, order.length - 1)];
  };

  // attnlib.live_writer.writer_state: feed the prompt, then sample n_new tokens
  W.write = function (m, w, ids, temperature, seed, nNew) {
    var caches = [];
    for (var l = 0; l < m.n_layers; l++) caches.push([]);
    var next = W.uniform(seed), tokens = ids.slice(), result = null;
    for (var i = 0; i < ids.length; i++) result = W.step(m, w, caches, ids[i], i);
    var lastLogits = null, lastMaps = null;
    for (var s = 0; s < nNew; s++) {
      lastLogits = result.logits;
      lastMaps = result.maps;
      var token = W.sampleNext(result.logits, temperature, next);
      tokens.push(token);
      if (s < nNew - 1) result = W.step(m, w, caches, token, tokens.length - 1);
    }
    return {tokens: tokens, logits: lastLogits, maps: lastMaps};
  };

  // attnlib.live_writer.name_char: in quotes, or by code point when it cannot be seen
  W.nameChar = function (c) {
    if (/^[\p{C}\p{Z}]$/u.test(c)) {
      var hex = c.codePointAt(0).toString(16).toUpperCase();
      return "the invisible U+" + "0000".slice(hex.length) + hex;
    }
    return "\u201c" + c + "\u201d";
  };

  var colour = function (x) {
    var r = Math.round(255 - 222 * x), g = Math.round(255 - 153 * x), b = Math.round(255 - 75 * x);
    return "rgb(" + r + "," + g + "," + b + ")";
  };
  var escapeChar = function (ch) {
    return ch === "\n" ? "\u21b5" : ch === " " ? "\u00a0" : ch.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;");
  };

  W.start = function (id) {
    var root = document.getElementById(id);
    if (!root || root.getAttribute("data-ready")) return;
    root.setAttribute("data-ready", "1");
    var data = JSON.parse(root.querySelector("script.attn-live-data").textContent);
    var weights = W.decode(data), m = data.config;
    var prompt = root.querySelector("textarea.attn-live-prompt"), seed = root.querySelector("input.attn-live-seed");
    var temperature = root.querySelector("select.attn-live-temperature"), head = root.querySelector("select.attn-live-head");
    var message = root.querySelector(".attn-live-message");
    var update = function () {
      var text = Array.from(prompt.value), ids = [], unknown = [];  // by code point, as Python: an emoji is one
      for (var i = 0; i < text.length; i++) {
        var t = data.vocab.indexOf(text[i]);
        if (t < 0) { if (unknown.indexOf(text[i]) < 0) unknown.push(text[i]); } else ids.push(t);
      }
      var error = "";
      if (unknown.length) error = "not in the model's alphabet: " + unknown.map(W.nameChar).join(", ") + " (" + data.knows + ")";
      else if (ids.length < 1) error = "type at least one character";
      else if (ids.length > m.window) error = "at most " + m.window + " characters (got " + ids.length + ")";
      var s = Number(seed.value);
      if (!error && !(/^\d+$/.test(seed.value.trim()) && s <= 4294967295)) error = "sampling seed: a whole number from 0 to 4294967295";
      message.textContent = error;
      root.classList.toggle("attn-live-invalid", !!error);
      if (error) return;
      var tau = Number(temperature.value), lh = head.value.split(",").map(Number);
      var result = W.write(m, weights, ids, tau, s, data.n_new);
      var written = result.tokens.slice(ids.length).map(function (t) { return data.vocab[t]; }).join("");
      var out = root.querySelector('[data-role="text"]');
      out.setAttribute("data-value", written);
      out.textContent = written;
      var settings = root.querySelector(".attn-live-settings");  // the settings shown
      if (settings) settings.textContent = "temperature " + temperature.value + ", sampling seed " + seed.value.trim();
      root.querySelector('[data-role="logits"]').setAttribute("data-value", Array.prototype.join.call(result.logits, ","));
      var map = result.maps[lh[0]][lh[1]], all = result.tokens.slice(0, result.tokens.length - 1);
      var seen = all.slice(all.length - map.length);
      root.querySelector(".attn-live-grid").innerHTML = seen.map(function (t, j) {
        return "<span data-role=\"w\" data-index=\"" + j + "\" data-value=\"" + map[j] + "\" style=\"background:" + colour(Math.min(1, map[j] / Math.max.apply(null, map))) + "\">" + escapeChar(data.vocab[t]) + "</span>";
      }).join("");
    };
    [prompt, seed].forEach(function (el) { el.addEventListener("input", update); });
    [temperature, head].forEach(function (el) { el.addEventListener("change", update); });
    update();
  };
  window.attnWriter = W;
})();
