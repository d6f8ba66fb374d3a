"""One self-contained HTML file per run: ``verify --html FILE`` and ``prove --report FILE.html``.

The tables, the pictures (inlined as ``data:`` URIs, so the file can be mailed or attached to a
review), the coverage, the diagnosis and the commands that reproduce each failure. The text comes
from the terminal reports' own functions; this module only lays it out. Long lines wrap and
pictures shrink to the page, so nothing overflows a narrow window (a browser test checks it).
"""

from __future__ import annotations

import base64
from html import escape
from pathlib import Path

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.5em auto; max-width: 1100px; padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; border-bottom: 1px solid #ddd; margin-top: 1.6em; }
pre, code { font: 12.5px/1.4 ui-monospace, monospace; white-space: pre-wrap; overflow-wrap: anywhere; }
pre { background: #f6f8fa; padding: .6em .8em; border-radius: 4px; }
table { border-collapse: collapse; max-width: 100%; }
th, td { border: 1px solid #ddd; padding: .25em .6em; text-align: left; vertical-align: top; overflow-wrap: break-word; }
th { background: #f0f0f0; }
td.pass { background: #e6f4ea; } td.FAIL, td.ERROR, td.refuted-check { background: #fce8e6; }
td.unsupported, td.unknown { background: #fef7e0; }
.verdict { display: inline-block; padding: .3em .9em; border-radius: 4px; font-weight: bold; color: white; }
.verdict.ok { background: #1e8e3e; } .verdict.bad { background: #d93025; } .verdict.other { background: #e37400; }
figure { margin: 1em 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; box-sizing: border-box; }
figcaption { font-size: .9em; color: #555; }
"""


def data_uri(path) -> str:
    """A PNG file as a ``data:`` URI."""
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode("ascii")


def figure(path, caption: str) -> str:
    return (f'<figure><img src="{data_uri(path)}" alt="{escape(caption)}">'
            f"<figcaption>{escape(caption)} ({escape(Path(path).name)})</figcaption></figure>")


def pre(text: str) -> str:
    return f"<pre>{escape(text.strip())}</pre>" if text.strip() else ""


def table(header, rows, classes=None) -> str:
    """``rows`` of cells (text); ``classes[r][c]``: a CSS class for a cell (its status)."""
    head = "".join(f"<th>{escape(str(h))}</th>" for h in header)
    body = []
    for r, row in enumerate(rows):
        cells = "".join(f'<td class="{escape(classes[r][c]) if classes else ""}">{escape(str(cell))}</td>'
                        for c, cell in enumerate(row))
        body.append(f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def verdict(text: str, ok: bool | None) -> str:
    kind = "ok" if ok else "bad" if ok is False else "other"
    return f'<p><span class="verdict {kind}">{escape(text)}</span></p>'


def document(title: str, body: list[str]) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{escape(title)}</title><style>{STYLE}</style></head>\n<body>\n<h1>{escape(title)}</h1>\n"
            + "\n".join(part for part in body if part) + "\n</body></html>\n")


# ---------------------------------------------------------------------------- verify


def verify_report(report, previous: str | None = None) -> str:
    """The battery run as one HTML page: verdict, table, failures with error maps and replays, coverage, diagnosis."""
    from attnformal.verify import report as text
    from attnformal.verify.battery import judge

    name, reasons = judge(report)
    columns = text._columns(report)
    names = list(dict.fromkeys(r.check for r in report.results))
    by_key = {(r.check, r.dtype): r for r in report.results}
    cells = [[n, *(text._cell(by_key.get((n, c))) for c in columns)] for n in names]
    statuses = [["", *(getattr(by_key.get((n, c)), "status", "") for c in columns)] for n in names]
    body = [pre(text._header(report)), verdict(f"verdict: {name}", {"PASS": True, "FAIL": False}.get(name)),
            pre("\n".join(reasons)), "<h2>Checks</h2>", table(["check", *columns], cells, statuses),
            pre(text._summary(report, previous)), _failures(report)]
    body += ["<h2>Coverage</h2>", pre(text._coverage(report).replace("Coverage\n--------", ""))]
    body += ["<h2>Diagnosis</h2>", pre(text._diagnosis(report).replace("Diagnosis\n---------", ""))
             or "<p>no failure</p>"]
    return document(f"attnformal verify: {report.settings.impl_name}", body)


def _failures(report) -> str:
    failed = [r for r in report.results if r.failed]
    if not failed:
        return ""
    parts = ["<h2>Failures</h2>"]
    for r in failed:
        lines = [*r.details, *(f"-> [{f.bug}] {f.evidence}" if f.bug else f"-> {f.evidence}" for f in r.findings)]
        parts += [f"<h3>{escape(r.label)}: {escape(r.summary)}</h3>", pre("\n".join(lines))]
        if r.command:
            parts.append(f"<p>reproduce:</p>{pre(r.command)}")
        if r.picture and Path(r.picture).is_file():
            parts.append(figure(r.picture, f"error map of {r.label}: |actual - expected| / allowed"))
    return "\n".join(parts)


# ---------------------------------------------------------------------------- prove


def prove_report(checks, controls, wall: float, settings, pictures=()) -> str:
    """The proof run as one HTML page: obligations, controls, failures with replays, tile maps, what is trusted."""
    from attnformal import prove

    ok = all(o.ok for o in checks) and all(c.ok for c in controls)
    env = prove.environment()
    body = [pre(f"commit {env['commit']}; Z3 {env['z3']}, SymPy {env['sympy']}, Python {env['python']}; "
                f"wall {wall:.1f} s\nschedules: {prove.describe_schedules(settings)}"),
            verdict(f"{sum(o.ok for o in checks)}/{len(checks)} obligations hold, "
                    f"{sum(c.ok for c in controls)}/{len(controls)} controls refuted", ok),
            "<h2>Obligations</h2>",
            table(["#", "obligation", "tool", "checks", "status", "time"],
                  [[o.number, o.title, o.tools, len(o.checks), o.status, f"{o.seconds:.1f} s"] for o in checks],
                  [["", "", "", "", "pass" if o.ok else "FAIL", ""] for o in checks]),
            "<h2>Negative controls</h2>",
            table(["#", "control", "breaks", "status", "counterexample"],
                  [[c.obligation, c.name, c.breaks, c.proof.status, prove._counterexample(c.proof)] for c in controls],
                  [["", "", "", "pass" if c.ok else "FAIL", ""] for c in controls])]
    failed = [(o, p) for o in checks for p in o.checks if not p.ok]
    if failed:
        body.append("<h2>Failures</h2>")
        for o, p in failed:
            body += [f"<h3>obligation {o.number} ({escape(o.title)}): {escape(p.status)}</h3>",
                     pre("\n".join(filter(None, [p.claim, p.countermodel and prove._counterexample(p), p.detail])))]
    if pictures:
        body.append("<h2>Tile maps</h2>")
        body += [figure(path, Path(path).stem) for path in pictures]
    body += ["<h2>Trusted, not proved</h2>", pre("\n".join(f"- {item}" for item in prove._trusted(checks)))]
    return document("attnformal prove", body)
