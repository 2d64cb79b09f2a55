"""Drive a live figure (attnlib.live) in Chromium and compare its numbers with Python's.

Used by tests/test_live_figures.py on figures written to a page of their own, and by
tests/test_browser.py on the figures of the built book.
"""

import json

import numpy as np

from attnlib import live

TOLERANCE = 1e-6

SET_JS = """((id, selector, values, event) => {
    const root = document.getElementById(id);
    const fields = root.querySelectorAll(selector);
    values.forEach((value, i) => { fields[i].value = value; fields[i].dispatchEvent(new Event(event)); });
    const read = role => [...root.querySelectorAll(`[data-role="${role}"]`)].map(e => e.dataset.value);
    return {message: root.querySelector(".attn-live-message").textContent,
            invalid: root.classList.contains("attn-live-invalid"),
            text: root.querySelector(".attn-live-out").innerText,
            scaled: read("scaled"), weight: read("weight"), sum: read("sum"), score: read("score"),
            output: read("output"), guesses: read("guesses"), next_p: read("next-p"),
            grid: [...root.querySelectorAll('td[data-role="w"]')].map(td => [Number(td.dataset.q),
                   Number(td.dataset.k), td.dataset.value])};
})"""

FIGURES_JS = """[...document.querySelectorAll(".attn-live")].map(root => ({id: root.id, kind: root.dataset.live,
    data: JSON.parse(root.querySelector("script.attn-live-data").textContent)}))"""


def set_inputs(tab, figure_id, selector, values, event="input"):
    """Type ``values`` into the fields ``selector`` of the figure (one event each); what it then shows."""
    return tab.evaluate(f"{SET_JS}({json.dumps(figure_id)}, {json.dumps(selector)}, {json.dumps(values)}, "
                        f"{json.dumps(event)})", await_promise=False)


def numbers(values):
    return np.array([float(v) for v in values])


def close(page_values, python_values):
    page, python = numbers(page_values), np.asarray(python_values, dtype=float)
    return page.shape == python.shape and bool(np.all(np.abs(page - python) <= TOLERANCE))


def check_typed_scores(tab, figure_id, data, rng, rounds=5):
    """Random rows typed in; then bad input. Returns a list of what disagreed (empty when all agree)."""
    problems = []
    n = len(data["tokens"])
    for _ in range(rounds):
        scores = np.round(rng.normal(0, 3, n), 3)
        factor = float(np.round(rng.uniform(0.05, 4), 3))
        set_inputs(tab, figure_id, "input.attn-live-factor", [repr(factor)])
        shown = set_inputs(tab, figure_id, "input.attn-live-score", [repr(float(s)) for s in scores])
        want = live.typed_scores_state(scores, factor)
        if shown["message"] or not close(shown["weight"], want["weights"]) \
                or not close(shown["scaled"], want["scaled"]) or not close(shown["sum"], [want["sum"]]):
            problems.append(f"scores {scores.tolist()} c={factor}: page {shown}")
        if ("not saturated" not in shown["text"]) != want["saturated"] or "NaN" in shown["text"]:
            problems.append(f"saturation line for {scores.tolist()} c={factor}: {shown['text']!r}")
    good = shown
    for bad, words in (("abc", "is not a number"), ("", "is empty"), ("1e400", "too large"),
                       ("2e6", "too large"), ("1..2", "is not a number")):
        shown = set_inputs(tab, figure_id, "input.attn-live-score", [bad])
        if words not in shown["message"] or not shown["invalid"] or "NaN" in shown["text"] \
                or shown["weight"] != good["weight"]:
            problems.append(f"bad score {bad!r}: {shown['message']!r}, weights {shown['weight']}")
    shown = set_inputs(tab, figure_id, "input.attn-live-factor", ["x"])
    if "factor c" not in shown["message"]:
        problems.append(f"bad factor: {shown['message']!r}")
    set_inputs(tab, figure_id, "input.attn-live-factor", ["1"])
    shown = set_inputs(tab, figure_id, "input.attn-live-score", ["1"])  # good again: the message goes
    if shown["message"] or shown["invalid"]:
        problems.append(f"after good input the figure still says {shown['message']!r}")
    return problems


def check_pick_query(tab, figure_id, data, example):
    problems = []
    for i, token in enumerate(data["tokens"]):
        shown = set_inputs(tab, figure_id, "select.attn-live-query", [str(i)], event="change")
        want = live.pick_query_state(example, i)
        for name, key in (("score", "scores"), ("weight", "weights"), ("output", "output")):
            if not close(shown[name], want[key]):
                problems.append(f"query {token!r}, {name}: page {shown[name]}, python {want[key].tolist()}")
    return problems


def check_induction(tab, figure_id, data, sequences, heads=None):
    """Each sequence (a string of letters) typed in, each head picked: the page against the exported model."""
    problems = []
    twin = live.exported_model(data["model"])
    n_layers, n_heads = len(data["model"]["blocks"]), data["model"]["n_heads"]
    heads = heads or [(layer, h) for layer in range(n_layers) for h in range(n_heads)]
    for text in sequences:
        tokens = live.parse_letters(text, data["letters"], data["max_len"])
        want = live.induction_state(twin, tokens)
        for layer, h in heads:
            set_inputs(tab, figure_id, "select.attn-live-head", [f"{layer},{h}"], event="change")
            shown = set_inputs(tab, figure_id, "input.attn-live-sequence", [text])
            grid = np.zeros((len(tokens), len(tokens)))
            for q, k, value in shown["grid"]:
                grid[q, k] = float(value)
            if shown["message"] or len(shown["grid"]) != len(tokens) * (len(tokens) + 1) // 2 \
                    or not np.all(np.abs(grid - want["maps"][layer][h]) <= TOLERANCE):
                problems.append(f"{text!r} layer {layer} head {h}: weights differ (message {shown['message']!r})")
        if shown["guesses"] != [",".join(map(str, want["guesses"]))] or not close(shown["next_p"], [want["next_p"]]):
            problems.append(f"{text!r}: guesses {shown['guesses']} / {want['guesses'].tolist()}, "
                            f"p {shown['next_p']} / {want['next_p']}")
    last = shown
    for bad, words in (("ab1", "is not a token"), ("a", "at least 2"), ("", "at least 2"),
                       ("a" * (data["max_len"] + 1), f"at most {data['max_len']}")):
        shown = set_inputs(tab, figure_id, "input.attn-live-sequence", [bad])
        if words not in shown["message"] or not shown["invalid"] or shown["grid"] != last["grid"]:
            problems.append(f"bad sequence {bad!r}: {shown['message']!r}")
    return problems


def check_pointer(tab, figure_id, data, sentences):
    """Each (template, animal, place, adjective) picked in the drop-downs: the page against the exported model."""
    from attnlib.learn import coreference as task

    problems = []
    twin = live.exported_pointer(data["model"], data["read_at"])
    for template, animal, place, adjective in sentences:
        values = {"template": str(template), "animal": animal, "place": place, "adjective": adjective}
        for slot, value in values.items():
            shown = set_inputs(tab, figure_id, f'select[data-slot="{slot}"]', [value], event="change")
        words = task.TEMPLATES[template].format(animal=animal, place=place, adjective=adjective).split()
        want = live.pointer_state(twin, data["vocab"], words, data["read_at"])
        rows = tab.evaluate(f"""(() => {{
            const root = document.getElementById({json.dumps(figure_id)});
            const cells = [...root.querySelectorAll("td[data-row]")];
            const rows = {{}};
            cells.forEach(td => {{ (rows[td.dataset.row] = rows[td.dataset.row] || []).push(td.dataset.value); }});
            return rows;
        }})()""", await_promise=False)
        expected = {"pointer": want["pointer"]}
        for layer, maps in enumerate(want["maps"]):
            for h in range(maps.shape[0]):
                expected[f"layer {layer}, head {h}"] = maps[h, data["read_at"]]
        for name, row in expected.items():
            if name not in rows or not close(rows[name], row):
                problems.append(f"{words}: {name} page {rows.get(name)} python {row.tolist()}")
        pick = words[int(want["pointer"].argmax())]
        right = task.referent(animal, place, adjective)
        verdict = tab.evaluate(f"""document.getElementById({json.dumps(figure_id)})
            .querySelector('[data-role="verdict"]').textContent""", await_promise=False)
        if verdict.split(":")[0] != ("right" if pick == right else "wrong"):
            problems.append(f"{words}: verdict {verdict!r}, model picks {pick}, answer {right}")
    return problems


WRITER_JS = """((id, prompt, temperature, seed, head) => {
    const root = document.getElementById(id);
    const set = (selector, value, event) => { const e = root.querySelector(selector); e.value = value;
        e.dispatchEvent(new Event(event)); };
    set("select.attn-live-head", head, "change");
    set("select.attn-live-temperature", temperature, "change");
    set("input.attn-live-seed", seed, "input");
    set("textarea.attn-live-prompt", prompt, "input");
    return {message: root.querySelector(".attn-live-message").textContent,
            invalid: root.classList.contains("attn-live-invalid"),
            text: root.querySelector('[data-role="text"]').dataset.value,
            logits: root.querySelector('[data-role="logits"]').dataset.value,
            weights: [...root.querySelectorAll('.attn-live-grid [data-role="w"]')].map(e => e.dataset.value)};
})"""


def set_writer(tab, figure_id, prompt, temperature, seed, head):
    """Type a prompt, pick a temperature, a seed and a head in the writer figure; what it then shows."""
    args = ", ".join(json.dumps(a) for a in (figure_id, prompt, f"{temperature:g}", str(seed), head))
    return tab.evaluate(f"{WRITER_JS}({args})", await_promise=False)


def check_writer(tab, figure_id, data, cases):
    """Each (prompt, temperature, seed, (layer, head)): the page's text equal to Python's, its logits and
    the head's weights to 1e-6; then bad input, which shows a message and leaves the text as it was."""
    from attnlib import live_writer

    problems = []
    for prompt, temperature, seed, (layer, h) in cases:
        want = live_writer.writer_state(data, prompt, temperature, seed, data["n_new"])
        shown = set_writer(tab, figure_id, prompt, temperature, seed, f"{layer},{h}")
        if shown["message"] or shown["text"] != want["text"]:
            problems.append(f"{prompt!r} t={temperature} seed={seed}: text {shown['text']!r} / {want['text']!r} "
                            f"({shown['message']!r})")
        if not close(shown["logits"].split(","), want["logits"]) or not close(shown["weights"],
                                                                               want["maps"][layer][h]):
            problems.append(f"{prompt!r} t={temperature} seed={seed}: logits or weights differ")
    last = set_writer(tab, figure_id, "And", 0.8, 1, "1,0")  # the settings the bad prompts keep
    for bad, words in (("Zoë", "not in the model's alphabet"), ("x" * 65, "at most 64"), ("", "at least one")):
        shown = set_writer(tab, figure_id, bad, 0.8, 1, "1,0")
        if words not in shown["message"] or not shown["invalid"] or shown["text"] != last["text"]:
            problems.append(f"bad prompt {bad!r}: {shown['message']!r}")
    shown = set_writer(tab, figure_id, "And", 0.8, "-3", "1,0")
    if "seed" not in shown["message"]:
        problems.append(f"bad seed: {shown['message']!r}")
    return problems


def check_writer_messages(tab, figure_id, data, prompts):
    """Each bad prompt: the page shows exactly the message Python's parse_prompt raises."""
    from attnlib import live_writer

    problems = []
    for prompt in prompts:
        try:
            live_writer.parse_prompt(prompt, data["vocab"], data["config"]["window"])
            want = ""
        except ValueError as error:
            want = str(error)
        shown = set_writer(tab, figure_id, prompt, 0.8, 1, "1,0")
        if shown["message"] != want or shown["invalid"] != bool(want):
            problems.append(f"{prompt!r}: page {shown['message']!r}, Python {want!r}")
    return problems
