"""Open the built book in headless Chromium, offline, as a reader would.

A small client for the Chrome DevTools Protocol over ``--remote-debugging-pipe``
(file descriptors 3 and 4 of the browser), so it needs no extra Python package
and opens no network port. ``tests/test_browser.py`` uses it to check every page;
run as a script it takes screenshots:

    python tools/browser.py screenshots _build/html/book/04_scale_and_softmax.html \
        --out _build/screenshots

Every page is opened from disk with the network emulated offline and every host
name mapped to nothing, so a page that tries to load from another host fails
visibly (the request is recorded) instead of quietly working.
"""

import argparse
import base64
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
WIDTHS = {"desktop": 1280, "phone": 390}
HEIGHT = {"desktop": 900, "phone": 844}


def find_chromium():
    """The path of a Chromium on this machine, or None (``CHROMIUM`` overrides the search)."""
    if os.environ.get("CHROMIUM"):
        return shutil.which(os.environ["CHROMIUM"])
    return next((shutil.which(name) for name in CHROMIUM_NAMES if shutil.which(name)), None)


class BrowserError(RuntimeError):
    """The browser answered a command with an error, or did not answer in time."""


class Chromium:
    """One headless Chromium process driven over the DevTools pipe."""

    def __init__(self, binary=None, timeout=60.0):
        binary = binary or find_chromium()
        if binary is None:
            raise FileNotFoundError("no Chromium found: apt-get install chromium")
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="attnlib-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def wire_pipes():  # in the child: the browser reads fd 3 and writes fd 4
            read_end = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10)
            write_end = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)
            os.dup2(read_end, 3)
            os.dup2(write_end, 4)
            os.set_inheritable(3, True)
            os.set_inheritable(4, True)

        self.process = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
             "--no-first-run", "--no-default-browser-check", "--disable-extensions",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--mute-audio", "--hide-scrollbars", "--allow-file-access-from-files",
             "--host-resolver-rules=MAP * ~NOTFOUND", f"--user-data-dir={self.profile}",
             "about:blank"],
            preexec_fn=wire_pipes, close_fds=False,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._next_id = 0
        self._replies = {}
        self.events = []
        self._lock = threading.Condition()
        self._reader = threading.Thread(target=self._read_messages, daemon=True)
        self._reader.start()

    def _read_messages(self):
        buffer = b""
        while True:
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                break
            buffer += chunk
            *messages, buffer = buffer.split(b"\0")
            with self._lock:
                for raw in messages:
                    message = json.loads(raw)
                    if "id" in message:
                        self._replies[message["id"]] = message
                    else:
                        self.events.append(message)
                self._lock.notify_all()
        with self._lock:
            self._lock.notify_all()

    def send(self, method, params=None, session=None):
        """Send one command and return its result (raises BrowserError on an error reply)."""
        with self._lock:
            self._next_id += 1
            command_id = self._next_id
        message = {"id": command_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        with self._lock:
            while command_id not in self._replies:
                if not self._reader.is_alive() or time.monotonic() > deadline:
                    raise BrowserError(f"no answer to {method} within {self.timeout:.0f} s")
                self._lock.wait(0.5)
            reply = self._replies.pop(command_id)
        if "error" in reply:
            raise BrowserError(f"{method}: {reply['error'].get('message')}")
        return reply.get("result", {})

    def open_page(self, url, width, height):
        """A new tab, offline, ``width`` x ``height`` CSS pixels, navigated to ``url``."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, target, session)
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable", session=session)
        self.send("Network.emulateNetworkConditions", {"offline": True, "latency": 0,
                  "downloadThroughput": -1, "uploadThroughput": -1}, session=session)
        page.resize(width, height, settle=False)
        self.send("Page.navigate", {"url": url}, session=session)
        deadline = time.monotonic() + self.timeout
        while True:  # the blank tab's own load event may come first: wait for this page's
            try:
                # a page may redirect (the book's index.html does): any loaded page but the blank one
                if page.evaluate("document.readyState === 'complete' && location.href", False) not in (
                        False, "about:blank"):
                    return page
            except BrowserError:
                pass  # the page is still being replaced
            if time.monotonic() > deadline:
                raise BrowserError(f"{url} did not finish loading within {self.timeout:.0f} s")
            time.sleep(0.05)

    def close(self):
        try:
            self.send("Browser.close")
        except (BrowserError, OSError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._to_browser)
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Page:
    """One open tab: evaluate JavaScript, read what went wrong, take screenshots."""

    def __init__(self, browser, target, session):
        self.browser, self.target, self.session = browser, target, session

    def evaluate(self, expression, await_promise=True):
        """The value of a JavaScript expression (JSON-serialisable), awaited if a promise."""
        result = self.browser.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                   "awaitPromise": await_promise}, session=self.session)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise BrowserError(details.get("exception", {}).get("description", details.get("text")))
        return result["result"].get("value")

    def resize(self, width, height, settle=True):
        """Show the page in a ``width`` x ``height`` CSS-pixel window (a phone's below 600 px wide).

        With ``settle``, return once the page has laid itself out again (two animation frames):
        its stylesheets' media queries and resize handlers have then run, as after a window is
        resized, and nothing is loaded again.
        """
        self.browser.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height,
                          "deviceScaleFactor": 1, "mobile": width < 600}, session=self.session)
        if settle:
            self.evaluate("new Promise(done => requestAnimationFrame(() => requestAnimationFrame(() => "
                          "done(document.documentElement.clientWidth))))")

    def _events(self, method):
        return [e["params"] for e in self.browser.events if e.get("sessionId") == self.session
                and e["method"] == method]

    def console_errors(self):
        """Console errors, uncaught exceptions and failed loads, as readable lines."""
        errors = [f"console.error: {' '.join(str(a.get('value', a.get('description', ''))) for a in p['args'])}"
                  for p in self._events("Runtime.consoleAPICalled") if p["type"] in ("error", "assert")]
        errors += [f"exception: {p['exceptionDetails'].get('exception', {}).get('description', p['exceptionDetails']['text'])}"
                   for p in self._events("Runtime.exceptionThrown")]
        errors += [f"log {p['entry']['source']}: {p['entry']['text']} {p['entry'].get('url', '')}"
                   for p in self._events("Log.entryAdded") if p["entry"]["level"] == "error"]
        return errors

    def requests(self):
        """The URL of every request the page made."""
        return [p["request"]["url"] for p in self._events("Network.requestWillBeSent")]

    def failed_loads(self):
        """Requests that failed (missing file, blocked host), as (url, reason)."""
        urls = {p["requestId"]: p["request"]["url"] for p in self._events("Network.requestWillBeSent")}
        return [(urls.get(p["requestId"], "?"), p["errorText"]) for p in self._events("Network.loadingFailed")]

    def screenshot(self, path, full_page=False):
        params = {"format": "png", "captureBeyondViewport": full_page}
        if full_page:
            width, height = self.evaluate("[document.documentElement.clientWidth, "
                                          "document.documentElement.scrollHeight]")
            params["clip"] = {"x": 0, "y": 0, "width": width, "height": min(height, 16000), "scale": 1}
        data = self.browser.send("Page.captureScreenshot", params, session=self.session)["data"]
        Path(path).write_bytes(base64.b64decode(data))

    def close(self):
        self.browser.send("Target.closeTarget", {"targetId": self.target})


def typeset(page, timeout_ms=20000):
    """Wait for MathJax to finish typesetting the page (if the page uses it)."""
    return page.evaluate(f"""new Promise(resolve => {{
        const start = Date.now();
        (function poll() {{
            const mj = window.MathJax;
            if (mj && mj.startup && mj.startup.promise) {{
                mj.startup.promise.then(() => resolve(true));
            }} else if (Date.now() - start > {timeout_ms}) {{ resolve(false); }}
            else {{ setTimeout(poll, 100); }}
        }})();
    }})""")


REPORT_JS = r"""(() => {
    const article = document.querySelector("article.bd-article") || document.querySelector("main");
    const column = article.getBoundingClientRect();
    const describe = el => {
        const id = el.id || (el.closest("[id]") || {}).id || "";
        const cls = (el.className && el.className.baseVal === undefined) ? el.className : "";
        return `${el.tagName.toLowerCase()}.${String(cls).trim().split(/\s+/).join(".")} in #${id}: `
            + `${Math.round(el.getBoundingClientRect().width)} px, text "`
            + (el.innerText || el.textContent || "").trim().slice(0, 60).replace(/\s+/g, " ") + '"';
    };
    const scrollsX = el => ["auto", "scroll"].includes(getComputedStyle(el).overflowX);
    const clipsX = el => getComputedStyle(el).overflowX !== "visible";
    const visible = el => {
        const r = el.getBoundingClientRect();
        return r.width > 0 && r.height > 0 && getComputedStyle(el).visibility !== "hidden";
    };
    // Wider than the column: an element sticking out of the column that no scrolling box
    // between it and the column holds, or that is cut off by a box that clips without scrolling.
    const tooWide = [];
    const screenReaderOnly = el => el.closest("mjx-assistive-mml");  // MathML kept for screen readers
    for (const el of article.querySelectorAll("*")) {
        if (!visible(el) || screenReaderOnly(el)) continue;
        const r = el.getBoundingClientRect();
        if (r.right <= column.right + 1 && r.left >= column.left - 1) continue;
        let box = el.parentElement, held = false, cut = false;
        while (box && box !== article) {
            if (clipsX(box)) {
                const b = box.getBoundingClientRect();
                if (b.right <= column.right + 1 && b.left >= column.left - 1) {
                    if (scrollsX(box)) held = true; else cut = true;
                    break;
                }
            }
            box = box.parentElement;
        }
        if (!held || cut) tooWide.push(describe(el));
    }
    // A clipping box that is not scrollable, whose content is wider than itself: cut off.
    const cutOff = [];
    for (const el of article.querySelectorAll("*")) {
        if (!visible(el) || scrollsX(el) || !clipsX(el)) continue;
        if (getComputedStyle(el).display === "inline" || el.closest(".math, mjx-container")) continue;
        if (el.scrollWidth > el.clientWidth + 1) cutOff.push(describe(el));
    }
    // Inline formulas with a scrollbar of their own: only display math wider than the column may scroll.
    const inlineMathScrollbars = [...article.querySelectorAll('mjx-container:not([display="true"])')]
        .filter(m => visible(m) && !screenReaderOnly(m) && scrollsX(m)
                && (m.scrollWidth > m.clientWidth + 1 || m.offsetHeight > m.clientHeight + 1))
        .map(describe);
    const images = [...document.images].filter(img => img.offsetParent !== null || img.closest("article"));
    const brokenImages = images.filter(img => !(img.complete && img.naturalWidth > 0)).map(img => img.src);
    const mathNodes = [...article.querySelectorAll(".math, span.math, div.math")];
    const untypeset = mathNodes.filter(m => !m.querySelector("mjx-container") && !m.closest("mjx-container"))
        .map(m => m.textContent.trim().slice(0, 60));
    const text = article.innerText;
    const rawMath = ["\\(", "\\["].filter(marker => {
        const i = text.indexOf(marker);
        return i >= 0;
    }).map(marker => text.slice(Math.max(0, text.indexOf(marker) - 30), text.indexOf(marker) + 40));
    const solutions = [...article.querySelectorAll("div.solution")];
    const openSolutions = solutions.filter(s => {
        const body = [...s.children].filter(c => !c.classList.contains("admonition-title"));
        return body.some(c => visible(c));
    }).map(s => s.id || (s.querySelector("a") || {}).href || "?");
    const smallText = [];
    for (const img of article.querySelectorAll("img[data-text-px]")) {
        const shownPx = parseFloat(img.dataset.textPx) * img.getBoundingClientRect().width / img.naturalWidth;
        if (shownPx < 9) smallText.push(`${img.src.split("/").pop()}: ${shownPx.toFixed(1)} px`);
    }
    return {
        title: document.title,
        columnWidth: Math.round(column.width),
        mathCount: article.querySelectorAll("mjx-container").length,
        untypeset, rawMath, tooWide: tooWide.slice(0, 40), tooWideCount: tooWide.length,
        cutOff: cutOff.slice(0, 40), brokenImages, imageCount: images.length,
        inlineMathScrollbars: inlineMathScrollbars.slice(0, 20), inlineMathScrollbarCount: inlineMathScrollbars.length,
        solutions: solutions.length, openSolutions,
        interactive: document.querySelectorAll(".attn-interactive").length,
    };
})()"""


def page_report(page):
    """What a reader would trip over on the open page (see REPORT_JS), as a dict."""
    return page.evaluate(REPORT_JS, await_promise=False)


def screenshots(pages, out):
    """Screenshots of each page at phone and desktop width: the top, and the whole page."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with Chromium() as browser:
        for html in pages:
            html = Path(html).resolve()
            for name, width in WIDTHS.items():
                page = browser.open_page(html.as_uri(), width, HEIGHT[name])
                typeset(page)
                for full in (False, True):
                    path = out / f"{html.stem}-{width}px{'-full' if full else ''}.png"
                    page.screenshot(path, full_page=full)
                    written.append(path)
                page.close()
    return written


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    shots = sub.add_parser("screenshots", help="screenshots at 1280 px and 390 px")
    shots.add_argument("pages", nargs="+")
    shots.add_argument("--out", default="_build/screenshots")
    args = parser.parse_args()
    for path in screenshots(args.pages, args.out):
        print(path)


if __name__ == "__main__":
    main()
