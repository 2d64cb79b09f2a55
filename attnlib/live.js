// Live figures (attnlib/live.py): the reader's input, computed in the page. Each function
// mirrors the Python named beside it, line for line; tests/test_live_figures.py checks that
// the page's numbers equal Python's to 1e-6. Defined once per page, whatever the figure count.
(function () {
  if (window.attnLive) return;
  var L = {};

  // attnlib.softmax on one row: subtract the largest score, exponentiate, divide by the sum
  L.softmax = function (row) {
    var top = Math.max.apply(null, row);
    var e = row.map(function (s) { return Math.exp(s - top); });
    var total = e.reduce(function (a, b) { return a + b; }, 0);
    return e.map(function (x) { return x / total; });
  };
  L.dot = function (a, b) {
    var s = 0;
    for (var i = 0; i < a.length; i++) s += a[i] * b[i];
    return s;
  };
  // x @ w: (n, k) @ (k, m) -> (n, m)
  L.matmul = function (x, w) {
    return x.map(function (row) {
      var out = new Array(w[0].length).fill(0);
      for (var i = 0; i < row.length; i++) for (var j = 0; j < out.length; j++) out[j] += row[i] * w[i][j];
      return out;
    });
  };
  // attnlib.learn.transformer.LayerNorm.forward, one token's vector at a time
  L.layerNorm = function (x, gain, bias, eps) {
    return x.map(function (row) {
      var mean = row.reduce(function (a, b) { return a + b; }, 0) / row.length;
      var variance = row.reduce(function (a, b) { return a + (b - mean) * (b - mean); }, 0) / row.length;
      var sd = Math.sqrt(variance + eps);
      return row.map(function (v, i) { return (v - mean) / sd * gain[i] + bias[i]; });
    });
  };
  // attnlib.rope, style "half": pair i is (x[i], x[i + d/2]), turned by m * base ** (-2i / d)
  L.rope = function (x, base) {
    var d = x[0].length, half = d / 2;
    return x.map(function (row, m) {
      var out = new Array(d);
      for (var i = 0; i < half; i++) {
        var angle = m * Math.pow(base, -2 * i / d);
        var a = row[i], b = row[i + half], c = Math.cos(angle), s = Math.sin(angle);
        out[i] = a * c - b * s;
        out[i + half] = a * s + b * c;
      }
      return out;
    });
  };
  // one head of attention: q, k, v (T, d_head) -> weights (T, T) and output (T, d_head);
  // causal: query i sees keys 0 ... i only (attnlib.attention with causal=True)
  L.attention = function (q, k, v, causal) {
    var scale = 1 / Math.sqrt(q[0].length);
    var weights = q.map(function (qi, i) {
      var n = causal ? i + 1 : k.length;
      var seen = L.softmax(k.slice(0, n).map(function (kj) { return L.dot(qi, kj) * scale; }));
      return seen.concat(new Array(k.length - n).fill(0));  // the mask: no later key
    });
    var out = weights.map(function (w) {
      return v[0].map(function (_, c) { return w.reduce(function (a, wj, j) { return a + wj * v[j][c]; }, 0); });
    });
    return {weights: weights, out: out};
  };
  // (T, H * d_head) <-> H slices of (T, d_head): attnlib.split_heads and merge_heads
  L.splitHeads = function (x, heads) {
    var d = x[0].length / heads, out = [];
    for (var h = 0; h < heads; h++) out.push(x.map(function (row) { return row.slice(h * d, (h + 1) * d); }));
    return out;
  };
  L.mergeHeads = function (parts) {
    return parts[0].map(function (_, t) { return [].concat.apply([], parts.map(function (p) { return p[t]; })); });
  };
  // attnlib.learn.transformer.Decoder.forward (attention-only blocks, RoPE) on one sequence of ids
  L.decoderForward = function (m, tokens) {
    var x = tokens.map(function (t) { return m.embedding[t].slice(); });  // (T, d)
    var maps = [];
    m.blocks.forEach(function (b) {
      var h = L.layerNorm(x, b.norm_1.gain, b.norm_1.bias, m.eps);
      var q = L.splitHeads(L.matmul(h, b.w_q), m.n_heads);
      var k = L.splitHeads(L.matmul(h, b.w_k), m.n_heads);
      var v = L.splitHeads(L.matmul(h, b.w_v), m.n_heads);
      var heads = q.map(function (_, i) {
        return L.attention(L.rope(q[i], m.rope_base), L.rope(k[i], m.rope_base), v[i], true);
      });
      maps.push(heads.map(function (r) { return r.weights; }));
      var added = L.matmul(L.mergeHeads(heads.map(function (r) { return r.out; })), b.w_o);
      x = x.map(function (row, t) { return row.map(function (val, c) { return val + added[t][c]; }); });
    });
    var logits = L.matmul(L.layerNorm(x, m.norm.gain, m.norm.bias, m.eps), m.unembedding);
    return {maps: maps, logits: logits};
  };

  // attnlib.learn.model.AttentionPointer: embeddings plus positions, layers x + MHA(x), then
  // the pointer head's row for one query: softmax(q_i . k_j / sqrt(d_k)) over the tokens j
  L.pointerForward = function (m, tokens, readAt) {
    var x = tokens.map(function (t, i) { return m.embedding[t].map(function (e, c) { return e + m.position[i][c]; }); });
    var maps = [];
    m.layers.forEach(function (layer) {
      var q = L.splitHeads(L.matmul(x, layer.w_q), m.n_heads);
      var k = L.splitHeads(L.matmul(x, layer.w_k), m.n_heads);
      var v = L.splitHeads(L.matmul(x, layer.w_v), m.n_heads);
      var heads = q.map(function (_, i) { return L.attention(q[i], k[i], v[i], false); });
      maps.push(heads.map(function (r) { return r.weights; }));
      var added = L.matmul(L.mergeHeads(heads.map(function (r) { return r.out; })), layer.w_o);
      x = x.map(function (row, t) { return row.map(function (val, c) { return val + added[t][c]; }); });
    });
    var q = L.matmul([x[readAt]], m.pointer_w_q)[0], k = L.matmul(x, m.pointer_w_k);
    var scale = 1 / Math.sqrt(q.length);
    return {maps: maps, pointer: L.softmax(k.map(function (kj) { return L.dot(q, kj) * scale; }))};
  };

  // ---- the figures ----------------------------------------------------------------------
  var fmt = function (x, digits) { return (Object.is(x, -0) ? 0 : x).toFixed(digits); };
  var setValue = function (el, x, digits) { el.textContent = fmt(x, digits); el.setAttribute("data-value", String(x)); };
  var colour = function (w) {  // white -> the book's weights blue, as attnlib.interactive's tables
    var r = Math.round(255 - 222 * w), g = Math.round(255 - 153 * w), b = Math.round(255 - 75 * w);
    return "rgb(" + r + "," + g + "," + b + ")";
  };
  // a number the reader typed: finite, and small enough to compute with; else the message to show
  L.parseNumber = function (text, name, limit) {
    var t = text.trim();
    if (t === "") return {error: name + " is empty: type a number"};
    if (!/^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$/.test(t)) return {error: name + ": \u201c" + t + "\u201d is not a number"};
    var x = Number(t);
    if (!isFinite(x) || Math.abs(x) > limit) return {error: name + " = " + t + " is too large: keep it between " + (-limit) + " and " + limit};
    return {value: x};
  };

  var starters = {};
  // attnlib.live.typed_scores: weights = softmax(c * s), their sum, and whether softmax saturates
  starters["typed-scores"] = function (root, data) {
    var inputs = root.querySelectorAll("input.attn-live-score"), factor = root.querySelector("input.attn-live-factor");
    var message = root.querySelector(".attn-live-message");
    var update = function () {
      var values = [], errors = [];
      [].forEach.call(inputs, function (input, i) {
        var r = L.parseNumber(input.value, "score of \u201c" + data.tokens[i] + "\u201d", data.limit);
        if (r.error) errors.push(r.error); else values.push(r.value);
      });
      var c = L.parseNumber(factor.value, "factor c", data.limit);
      if (c.error) errors.push(c.error);
      root.classList.toggle("attn-live-invalid", errors.length > 0);
      message.textContent = errors.join("; ");
      if (errors.length) return;  // the last good numbers stay, greyed out by the class above
      var scaled = values.map(function (s) { return c.value * s; });
      var weights = L.softmax(scaled);
      weights.forEach(function (w, i) {
        setValue(root.querySelector('[data-role="scaled"][data-index="' + i + '"]'), scaled[i], 2);
        setValue(root.querySelector('[data-role="weight"][data-index="' + i + '"]'), w, 3);
        root.querySelector('[data-role="bar"][data-index="' + i + '"]').style.width = (100 * w).toFixed(1) + "%";
      });
      setValue(root.querySelector('[data-role="sum"]'), weights.reduce(function (a, b) { return a + b; }, 0), 6);
      var top = Math.max.apply(null, weights);
      root.querySelector('[data-role="saturation"]').textContent = top >= data.saturated
        ? "saturated: the largest weight is " + fmt(top, 3) + ", so softmax is nearly a hard max and its gradient nearly 0"
        : "not saturated: the largest weight is " + fmt(top, 3);
    };
    [].forEach.call(inputs, function (input) { input.addEventListener("input", update); });
    factor.addEventListener("input", update);
    update();
  };
  // attnlib.live.pick_query: one query's scores q . k / sqrt(d_k), weights and output
  starters["pick-query"] = function (root, data) {
    var select = root.querySelector("select.attn-live-query");
    var update = function () {
      var i = Number(select.value), scale = 1 / Math.sqrt(data.q[0].length);
      var scores = data.k.map(function (k) { return L.dot(data.q[i], k) * scale; });
      var weights = L.softmax(scores);
      var out = data.v[0].map(function (_, c) { return weights.reduce(function (a, w, j) { return a + w * data.v[j][c]; }, 0); });
      scores.forEach(function (s, j) {
        setValue(root.querySelector('[data-role="score"][data-index="' + j + '"]'), s, 3);
        var cell = root.querySelector('[data-role="weight"][data-index="' + j + '"]');
        setValue(cell, weights[j], 3);
        cell.style.background = colour(weights[j]);
      });
      out.forEach(function (o, c) { setValue(root.querySelector('[data-role="output"][data-index="' + c + '"]'), o, 3); });
      root.querySelector('[data-role="query"]').textContent = data.tokens[i];
    };
    select.addEventListener("change", update);
    update();
  };
  // attnlib.live.induction_live: the trained decoder on the reader's letters
  starters["induction"] = function (root, data) {
    var input = root.querySelector("input.attn-live-sequence"), head = root.querySelector("select.attn-live-head");
    var message = root.querySelector(".attn-live-message"), grid = root.querySelector(".attn-live-grid");
    var guess = root.querySelector('[data-role="guesses"]');
    var update = function () {
      var letters = input.value.replace(/[\s,]+/g, "").toLowerCase(), tokens = [];
      var error = "";
      for (var i = 0; i < letters.length && !error; i++) {
        var t = data.letters.indexOf(letters[i]);
        if (t < 0) error = "\u201c" + letters[i] + "\u201d is not a token: use the letters " + data.letters[0] + " to " + data.letters[data.letters.length - 1];
        tokens.push(t);
      }
      if (!error && tokens.length < 2) error = "type at least 2 letters";
      if (!error && tokens.length > data.max_len) error = "at most " + data.max_len + " letters, the length the model trained on (got " + tokens.length + ")";
      root.classList.toggle("attn-live-invalid", !!error);
      message.textContent = error;
      if (error) return;
      var result = L.decoderForward(data.model, tokens);
      var parts = head.value.split(","), w = result.maps[Number(parts[0])][Number(parts[1])];
      var rows = ["<tr><th scope=\"col\">query \\ key</th>" + tokens.map(function (t) { return "<th scope=\"col\">" + data.letters[t] + "</th>"; }).join("") + "</tr>"];
      w.forEach(function (row, q) {
        rows.push("<tr><th scope=\"row\">" + q + " " + data.letters[tokens[q]] + "</th>" + row.map(function (x, k) {
          return k > q ? "<td class=\"attn-masked\"></td>"
            : "<td data-role=\"w\" data-q=\"" + q + "\" data-k=\"" + k + "\" data-value=\"" + x + "\" style=\"background:" + colour(x) + "\" title=\"" + fmt(x, 3) + "\">" + fmt(x, 2).replace(/^0/, "") + "</td>";
        }).join("") + "</tr>");
      });
      grid.innerHTML = "<table class=\"attn-matrix\">" + rows.join("") + "</table>";
      var guesses = result.logits.map(function (row) { return row.indexOf(Math.max.apply(null, row)); });
      guess.textContent = guesses.map(function (g) { return data.letters[g]; }).join("");
      guess.setAttribute("data-value", guesses.join(","));
      var p = L.softmax(result.logits[tokens.length - 1]), last = guesses[tokens.length - 1];
      setValue(root.querySelector('[data-role="next-p"]'), p[last], 3);
      root.querySelector('[data-role="next"]').textContent = data.letters[last];
    };
    input.addEventListener("input", update);
    head.addEventListener("change", update);
    update();
  };

  // attnlib.live.pointer_live: the trained pointer model on the sentence the reader builds
  starters["pointer"] = function (root, data) {
    var selects = {};
    ["template", "animal", "place", "adjective"].forEach(function (name) { selects[name] = root.querySelector('select[data-slot="' + name + '"]'); });
    var update = function () {
      var words = data.templates[Number(selects.template.value)].split(" ").map(function (w) {
        return w === "{animal}" ? selects.animal.value : w === "{place}" ? selects.place.value
          : w === "{adjective}" ? selects.adjective.value : w;
      });
      var result = L.pointerForward(data.model, words.map(function (w) { return data.vocab.indexOf(w); }), data.read_at);
      var rows = [["pointer", result.pointer]];
      result.maps.forEach(function (heads, l) { heads.forEach(function (w, h) { rows.push(["layer " + l + ", head " + h, w[data.read_at]]); }); });
      var html = "<tr><th scope=\"col\">row of \u201cit\u201d</th>" + words.map(function (w) { return "<th scope=\"col\">" + w + "</th>"; }).join("") + "</tr>";
      rows.forEach(function (r) {
        html += "<tr><th scope=\"row\">" + r[0] + "</th>" + r[1].map(function (x, j) {
          return "<td data-role=\"" + (r[0] === "pointer" ? "pointer" : "head") + "\" data-row=\"" + r[0] + "\" data-index=\"" + j + "\" data-value=\"" + x + "\" style=\"background:" + colour(x) + "\">" + fmt(x, 2).replace(/^0/, "") + "</td>";
        }).join("") + "</tr>";
      });
      root.querySelector(".attn-live-grid").innerHTML = "<table class=\"attn-matrix\">" + html + "</table>";
      var best = result.pointer.indexOf(Math.max.apply(null, result.pointer));
      var right = data.animal_adjectives.indexOf(selects.adjective.value) >= 0 ? selects.animal.value : selects.place.value;
      root.querySelector('[data-role="sentence"]').textContent = words.join(" ");
      root.querySelector('[data-role="pick"]').textContent = words[best];
      setValue(root.querySelector('[data-role="pick-p"]'), result.pointer[best], 3);
      root.querySelector('[data-role="verdict"]').textContent = words[best] === right
        ? "right: \u201c" + selects.adjective.value + "\u201d describes " + right
        : "wrong: \u201c" + selects.adjective.value + "\u201d describes " + right;
    };
    for (var name in selects) selects[name].addEventListener("change", update);
    update();
  };

  L.start = function (id) {
    var root = document.getElementById(id);
    if (!root || root.getAttribute("data-ready")) return;
    root.setAttribute("data-ready", "1");
    var data = JSON.parse(root.querySelector("script.attn-live-data").textContent);
    starters[root.getAttribute("data-live")](root, data);
  };
  window.attnLive = L;
})();
