"""The HTML reports in a real browser: headless Chromium loads each page, every picture decodes, nothing
overflows a narrow window; the DOM is read back through ``--dump-dom``, the look through a screenshot."""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap

import pytest

from attnformal.pictures import html, tiles
from attnformal.prove import main as prove
from attnformal.verify.__main__ import main as verify

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
WIDTH = 900  # px: narrower than the error maps' natural width, so a picture that does not shrink overflows

# Run in the page after it loaded: what a reader would see go wrong, as JSON in a <pre> that --dump-dom prints.
PROBE = """<script>
window.addEventListener("load", () => {
  const images = [...document.images].map(i => ({alt: i.alt, loaded: i.complete && i.naturalWidth > 0}));
  const wide = [...document.body.querySelectorAll("*")].filter(e => e.getBoundingClientRect().right > innerWidth + 1
                                                                   || e.scrollWidth > e.clientWidth + 1)
    .map(e => e.tagName + ": " + e.textContent.slice(0, 60));
  const out = document.createElement("pre");
  out.id = "probe";
  out.textContent = JSON.stringify({images, wide, page: document.documentElement.scrollWidth, window: innerWidth});
  document.body.appendChild(out);
});
</script>"""


@pytest.fixture(scope="module")
def browser():
    found = next(filter(None, map(shutil.which, BROWSERS)), None)
    if found is None:
        pytest.skip("headless Chromium is not installed (Debian: apt-get update && apt-get install -y chromium)")
    return found


def chromium(browser, tmp_path, *args) -> str:
    result = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                             f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={WIDTH},3000",
                             "--virtual-time-budget=10000", *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def inspect(browser, page, tmp_path) -> dict:
    probed = tmp_path / f"probed-{page.name}"
    probed.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    dom = chromium(browser, tmp_path, "--dump-dom", probed.as_uri())
    text = dom.split('<pre id="probe">', 1)[1].split("</pre>", 1)[0]
    return json.loads(text.replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&"))


def screenshot(browser, page, tmp_path, png):
    shot = tmp_path / f"{page.stem}.png"
    chromium(browser, tmp_path, f"--screenshot={shot}", page.as_uri())
    return png(shot)


def assert_readable(seen: dict, pictures: int):
    assert len(seen["images"]) == pictures and all(i["loaded"] for i in seen["images"]), seen["images"]
    assert not seen["wide"] and seen["page"] <= seen["window"] == WIDTH, seen


KERNEL = '''
import math

import torch

from attnformal.oracle import attention_oracle


def head_1_unscaled(q, k, v, *, scale=None, **kwargs):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    q = q.double().clone()
    q[:, 1] /= scale  # head 1 forgets the softmax scale
    return attention_oracle(q, k.double(), v.double(), scale=scale, **kwargs).to(k.dtype)
'''

def test_the_verify_page_shows_every_error_map_and_fits_the_window(browser, tmp_path, monkeypatch, png):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bug.py").write_text(KERNEL)
    code = verify(["--impl", "bug.py:head_1_unscaled", "--only", "fwd.random", "mask.causal_top_left", "--dtypes",
                   "float32", "--no-isolate", "--html", "report.html"])
    assert code == 1
    page = tmp_path / "report.html"
    text = page.read_text()
    assert "verdict: FAIL" in text and "Coverage" in text and "[head_specific]" in text
    assert "--replay verify-repro/bug.head_1_unscaled/fwd.random-float32.pt" in text
    assert 'src="data:image/png;base64,' in text and "verify-repro" not in text.split("<img", 1)[1].split(">")[0]
    assert_readable(inspect(browser, page, tmp_path), pictures=2)
    shot = screenshot(browser, page, tmp_path, png)
    assert shot.size[0] == WIDTH and shot.share("#d93025") > 0.0002  # the red verdict is drawn


def test_the_prove_page_shows_the_refutations_tile_maps(browser, tmp_path, bound_tiling, png):
    assert prove(["--kernel", bound_tiling, "--report", "proof.html", "--timeout", "600"]) == 1
    page = tmp_path / "proof.html"
    assert "Negative controls" in page.read_text() and "Tile maps" in page.read_text()
    assert_readable(inspect(browser, page, tmp_path), pictures=2)  # the refuted check and the generic control
    assert screenshot(browser, page, tmp_path, png).share(tiles.CLASS_COLOURS[1]) > 0.001  # a partial tile shows


def test_the_browser_check_sees_a_broken_picture_and_an_overflow(browser, tmp_path):
    broken = html.document("control", ['<img src="data:image/png;base64,bm90IGEgcG5n" alt="not a png">',
                                       '<p style="white-space: nowrap">' + "x" * 400 + "</p>"])
    page = tmp_path / "control.html"
    page.write_text(broken)
    seen = inspect(browser, page, tmp_path)
    assert seen["images"] == [{"alt": "not a png", "loaded": False}]
    assert seen["wide"] and seen["page"] > WIDTH
