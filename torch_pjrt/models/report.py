"""docs/models.md from the JSONL results: pass rates per zoo and overall, the failure causes
grouped (ops without a lowering, by op; errors by their first line), and every model that did not
pass with its reason. Generated: edit this module, not the markdown.

Records of several modes (eager `strict`, eager `defer_and_fuse`, `compile`: a record's mode_key)
are kept apart: the main sections describe the primary mode (strict when it has records), a
*Modes* table gives each mode's pass rates side by side, and compiled records get a section of
their own (graphs per model, graph-break reasons, compile failure causes)."""
from __future__ import annotations

import glob
import os
import re
from collections import Counter, defaultdict
from typing import Dict, Iterable, List, Optional

from .compare import ROUNDING_FACTOR, SGD_LR, TOLERANCES
from .runner import load_records

STATUSES = ("pass", "fallback", "mismatch", "error", "skipped")
ZOO_ORDER = ("hf", "timm", "torchvision", "diffusers")
MODE_ORDER = ("strict", "debug", "defer_and_fuse", "compile")
NOTES_COMPILE = os.path.join("docs", "models", "NOTES-compile.md")


def mode_key(r: dict) -> str:
    """The column a record belongs to: its eager mode (strict, defer_and_fuse, ...) for eager
    records, "compile" for compiled ones (with the eager mode of the ops outside the graphs
    appended when it is not strict)."""
    eager = r.get("eager_mode", "strict")
    if r.get("mode") == "compile":
        return "compile" if eager == "strict" else f"compile+{eager}"
    return eager


def _mode_rank(m: str) -> int:
    return MODE_ORDER.index(m) if m in MODE_ORDER else len(MODE_ORDER)


def latest(paths: Iterable[str]) -> List[dict]:
    """One record per (zoo, name, mode): the last one written (a rerun replaces an earlier
    result of the same mode)."""
    by_key: Dict[tuple, dict] = {}
    for p in paths:
        for r in load_records(p):
            by_key[(r["zoo"], r["name"], mode_key(r))] = r
    return list(by_key.values())


def _pct(n: int, d: int) -> str:
    return f"{100.0 * n / d:.0f}%" if d else "-"


def _esc(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ").strip()


def _normalize(reason: str) -> str:
    """An error's first line with its numbers, quoted names and shapes blanked, so errors with one
    cause group together."""
    s = re.sub(r"0x[0-9a-f]+", "N", reason)
    s = re.sub(r"\[[0-9, ]*\]|\([0-9, ]*\)", "[...]", s)
    s = re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "N", s)
    s = re.sub(r"'[^']{0,80}'", "'…'", s)
    return s[:200]


def _blank_numbers(s: str) -> str:
    """Whitespace runs to one space, numbers to N: Dynamo's messages with one cause group."""
    return re.sub(r"\b\d+\b", "N", re.sub(r"\s+", " ", s)).strip()


def causes(recs: List[dict]) -> Dict[str, Counter]:
    """fallback ops (models whose run fell back on each op), errors grouped, mismatches by phase
    and output kind, skip reasons grouped."""
    fb, err, mm, sk = Counter(), Counter(), Counter(), Counter()
    for r in recs:
        for op in r.get("fallback_ops") or {}:
            fb[op] += 1
        if r["status"] == "error":
            err[f"{r.get('phase', '?')}: {_normalize(r.get('reason', ''))}"] += 1
        elif r["status"] == "mismatch":
            t = (r.get("worst") or {}).get("tensor", "")
            kind = ("gradient" if t.startswith("grad ") else "updated parameter" if t.startswith("param ")
                    else "loss" if t == "loss" else "generated tokens" if t.startswith("generate")
                    else "forward output")
            note = (r.get("worst") or {}).get("note", "")
            mm[kind + (f" ({_normalize(note)})" if note else "")] += 1
        elif r["status"] == "skipped":
            sk[_normalize(r.get("reason", ""))[:160]] += 1
    return {"fallback": fb, "error": err, "mismatch": mm, "skipped": sk}


def render(all_recs: List[dict]) -> str:
    modes_present = sorted({mode_key(r) for r in all_recs}, key=_mode_rank)
    primary = "strict" if "strict" in modes_present else (modes_present[0] if modes_present else "strict")
    recs = [r for r in all_recs if mode_key(r) == primary]
    zoos = sorted({r["zoo"] for r in recs},
                  key=lambda z: ZOO_ORDER.index(z) if z in ZOO_ORDER else len(ZOO_ORDER))
    # each package's versions over the records, with the zoos that ran under each (the sweeps
    # may come from different environments, e.g. torchvision's from the torch 2.14.1 venv)
    seen: Dict[str, Dict[str, set]] = defaultdict(lambda: defaultdict(set))
    for r in recs:  # the primary mode's
        for k, v in (r.get("versions") or {}).items():
            seen[k][v].add(r["zoo"])
    versions: Dict[str, str] = {}
    for k, by_v in seen.items():
        versions[k] = " / ".join(
            f"{ver}" + (f" ({', '.join(sorted(zs))})" if len(by_v) > 1 else "")
            for ver, zs in sorted(by_v.items()))
    modes = sorted({r.get("eager_mode", "strict") for r in recs})
    lines = [
        "# Model coverage",
        "",
        "Generated by `python -m torch_pjrt.models report` from the JSONL results in `docs/models/`"
        " (do not edit by hand). Each model is built small from a config (nothing is downloaded;"
        " `HF_HUB_OFFLINE=1`), once on CPU under a fixed seed and deep-copied to `tpu`, and run"
        " in its own worker subprocess with a timeout (a crash or hang is an `error`). Compared"
        " with CPU: the eval-mode forward outputs, one training step (the loss, every"
        " parameter's gradient, every parameter after one SGD step, lr"
        f" {SGD_LR}), greedy `generate()` (4 new tokens, the same tokens) for causal LMs, and"
        " the image of a short DDPM pipeline run. Dropout and drop-path are zeroed so both"
        " devices compute the same function in train mode.",
        "",
        "Run: `python -m torch_pjrt.models --zoo hf -j 2` (options: `--zoo`, `-k SUBSTR`,"
        " `--limit N`, `--resume`, `--timeout S`, `--eager-mode`); then"
        " `python -m torch_pjrt.models report`.",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items()))
        + f"; eager mode: {', '.join(modes)}.",
        "",
        "## Tolerances (float32)",
        "",
        "Elementwise `|tpu - cpu| <= atol + rtol * |cpu|`; integer and bool tensors (and"
        " generated tokens) must be equal; NaN and inf must sit in the same places. *Scaled*"
        " means atol is multiplied by max(1, largest magnitude of the CPU tensor).",
        "",
        "| compared | rtol | atol |",
        "| --- | --- | --- |",
    ]
    for k, t in TOLERANCES.items():
        lines.append(f"| {k} | {t['rtol']:g} | {t['atol']:g}{' (scaled)' if t['scaled'] else ''} |")
    lines += [
        "",
        "Statuses: **pass**; **fallback** (values match, but ops ran on CPU through the fallback:"
        " named); **mismatch** (the worst tensor, its largest absolute error and its error over"
        " the tolerance); **error** (the tpu side raised or the worker died: exception type and"
        " first line, the phase); **skipped** (not a tpu result: CPU itself fails, inputs"
        " cannot be synthesized, too large, or the zoo's library does not import). A float32"
        " mismatch is run again in float64 on both devices; it counts as a pass when float64"
        " matches CPU and tpu's float32 is no more than ROUNDING_FACTOR"
        f" ({ROUNDING_FACTOR:g}) times as far from CPU's float64 result as CPU's own float32 is"
        " (torch_pjrt/models/compare.py): those models are listed, with their figures, under"
        " *Passed by the float64 check*.",
        "",
        "## Pass rates",
        "",
        "| zoo | models | " + " | ".join(STATUSES) + " | pass rate (of all) | pass rate (of run) |",
        "| --- | --- | " + " | ".join("---" for _ in STATUSES) + " | --- | --- |",
    ]

    def row(label: str, rs: List[dict]) -> str:
        c = Counter(r["status"] for r in rs)
        ran = len(rs) - c["skipped"]
        return (f"| {label} | {len(rs)} | " + " | ".join(str(c[s]) for s in STATUSES)
                + f" | {_pct(c['pass'], len(rs))} | {_pct(c['pass'], ran)} |")

    for z in zoos:
        lines.append(row(z, [r for r in recs if r["zoo"] == z]))
    lines.append(row("**all**", recs))
    lines += ["", "*Of run*: models that ran on tpu (all but the skipped).", ""]

    cz = causes([r for r in recs])
    lines += ["## Failure causes", ""]
    if cz["fallback"]:
        lines += ["Ops that fell back to CPU (models whose run used each):", "",
                  "| op | models |", "| --- | --- |"]
        lines += [f"| `{op}` | {n} |" for op, n in cz["fallback"].most_common()]
        lines.append("")
    if cz["error"]:
        lines += ["Errors, grouped by phase and first line (numbers and quoted names blanked):", "",
                  "| phase: error | models |", "| --- | --- |"]
        lines += [f"| {_esc(e)} | {n} |" for e, n in cz["error"].most_common()]
        lines.append("")
    if cz["mismatch"]:
        lines += ["Mismatches, by the kind of the worst tensor:", "", "| worst tensor | models |",
                  "| --- | --- |"]
        lines += [f"| {_esc(e)} | {n} |" for e, n in cz["mismatch"].most_common()]
        lines.append("")
    if cz["skipped"]:
        lines += ["Skip reasons, grouped:", "", "| reason | models |", "| --- | --- |"]
        lines += [f"| {_esc(e)} | {n} |" for e, n in cz["skipped"].most_common(40)]
        lines.append("")

    lines += ["## Models that did not pass", ""]
    for z in zoos:
        bad = sorted((r for r in recs if r["zoo"] == z and r["status"] != "pass"),
                     key=lambda r: (STATUSES.index(r["status"]) if r["status"] in STATUSES else 9,
                                    r["name"]))
        if not bad:
            continue
        lines += [f"### {z}", "", "| model | class / task | status | reason |", "| --- | --- | --- | --- |"]
        for r in bad:
            info = r.get("info") or {}
            what = " / ".join(str(info[k]) for k in ("class", "task") if k in info)
            reason = r.get("reason", "")
            if r["status"] == "error":
                reason = f"{r.get('phase', '?')}: {reason}" + (f" (at {r['where']})" if r.get("where") else "")
                if r.get("fallback_ops"):
                    reason += "; fell back: " + ", ".join(sorted(r["fallback_ops"]))
            elif r["status"] == "mismatch" and r.get("fallback_ops"):
                reason += "; fell back: " + ", ".join(sorted(r["fallback_ops"]))
            lines.append(f"| {_esc(r['name'])} | {_esc(what)} | {r['status']} | {_esc(reason)[:500]} |")
        lines.append("")
    by64 = sorted((r for r in recs if r.get("rounding")), key=lambda r: (r["zoo"], r["name"]))
    if by64:
        lines += ["## Passed by the float64 check", "",
                  "float32 results that differ from CPU's by more than the tolerance, where float64"
                  " matches and tpu's float32 is about as accurate as CPU's:", "",
                  "| model | status | float32 difference, and the float64 check |",
                  "| --- | --- | --- |"]
        lines += [f"| {r['zoo']}/{_esc(r['name'])} | {r['status']} | {_esc(r.get('reason', ''))[:600]} |"
                  for r in by64]
        lines.append("")
    passed = sorted(f"{r['zoo']}/{r['name']}" for r in recs if r["status"] == "pass")
    lines += ["## Models that passed", "", ", ".join(f"`{p}`" for p in passed) or "(none)", ""]
    if len(modes_present) > 1:
        lines += render_modes(all_recs, modes_present, primary)
    compiled = [r for r in all_recs if mode_key(r).startswith("compile")]
    if compiled:
        lines += render_compile(compiled, {(r["zoo"], r["name"]): r for r in recs}, primary)
    return "\n".join(lines)


def _cell(rs: List[dict]) -> str:
    if not rs:
        return "-"
    c = Counter(r["status"] for r in rs)
    ran = len(rs) - c["skipped"]
    rest = ", ".join(f"{c[s]} {s}" for s in STATUSES[1:] if c[s])
    return f"{c['pass']}/{ran} ({_pct(c['pass'], ran)})" + (f"; {rest}" if rest else "")


def render_modes(recs: List[dict], modes: List[str], primary: str) -> List[str]:
    """Pass rates side by side, one column per mode; a mode that ran on a sample of a zoo also
    gets the primary mode's figures on the same models, so the two compare like for like."""
    zoos = sorted({r["zoo"] for r in recs},
                  key=lambda z: ZOO_ORDER.index(z) if z in ZOO_ORDER else len(ZOO_ORDER))
    by = defaultdict(dict)  # (zoo, mode) -> {name: rec}
    for r in recs:
        by[(r["zoo"], mode_key(r))][r["name"]] = r
    others = [m for m in modes if m != primary]
    head = [primary] + [c for m in others for c in (m, f"{primary} on {m}'s models")]
    lines = ["## Modes", "",
             "Each cell: passes / models run (skipped left out), then the other statuses. A mode"
             " that ran on a sample of a zoo is set beside the "
             f"{primary} results of the same models.", "",
             "| zoo | " + " | ".join(head) + " |", "| --- |" + " --- |" * len(head)]
    for z in zoos:
        base = by[(z, primary)]
        cells = [_cell(list(base.values()))]
        for m in others:
            got = by[(z, m)]
            cells += [_cell(list(got.values())), _cell([base[n] for n in got if n in base])]
        lines.append(f"| {z} | " + " | ".join(cells) + " |")
    lines.append("")
    return lines


def _median(xs: List[float]) -> float:
    xs = sorted(xs)
    if not xs:
        return 0.0
    mid = len(xs) // 2
    return float(xs[mid]) if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2.0


def render_compile(recs: List[dict], eager: Dict[tuple, dict], primary: str) -> List[str]:
    """The compiled mode: what Dynamo made of each model (graphs, breaks, recompiles), the
    graph-break reasons and the failure causes by frequency, and a row per model."""
    ran = [r for r in recs if r["status"] != "skipped"]
    stats = [r["compile"] for r in ran if r.get("compile")]
    lines = ["## Compiled mode (torch.compile)", "",
             "`python -m torch_pjrt.models --compile` (records with mode `compile`, in"
             " `docs/models/results-<zoo>-compile.jsonl`): the same models and inputs, compared"
             " with CPU eager under the same tolerances, with the tpu side compiled as users write"
             " it, plain `torch.compile` (no `backend=`, `fullgraph=False`; tpu graphs reach this"
             " project's backend through `torch_pjrt/inductor_route.py`): the eval forward is"
             " `torch.compile(model)`, the training step's forward and loss one compiled function"
             " (its backward the compiled AOTAutograd backward; every parameter's gradient is"
             " compared) and the SGD step `torch.compile(optimizer.step)` (every updated"
             " parameter compared). Generation and pipeline cases are not compiled. Dynamo is"
             " reset between models. *Graphs*: Dynamo graphs compiled"
             " (`counters[\"stats\"][\"unique_graphs\"]`), forward / training forward+loss /"
             " SGD step; *breaks*: graph breaks (`counters[\"graph_break\"]`); *recompiles*:"
             " Dynamo recompilations (the eval-to-train switch of `model.training` is one where"
             " the same code object is compiled twice); *graph runs*: `torch.tpu.metrics()`"
             " `graph_runs`.", ""]
    if os.path.exists(NOTES_COMPILE):
        with open(NOTES_COMPILE, encoding="utf-8") as f:
            lines += [f.read().strip(), ""]
    c = Counter(r["status"] for r in recs)
    graphs = [s.get("graphs", 0) for s in stats]
    # a training step's graphs: the compiled forward+loss (its backward is that graph's
    # AOTAutograd backward) and the SGD step, in the models whose step ran compiled
    step_graphs = [r["compile_phases"].get("train", 0) + r["compile_phases"].get("sgd step", 0)
                   for r in ran if "train" in (r.get("compile_phases") or {})]
    lines += ["| models | " + " | ".join(STATUSES) + " | median graphs / model | median graphs"
              " / training step | models with a graph break | graph breaks | recompiles |",
              "| --- |" + " --- |" * (len(STATUSES) + 5),
              f"| {len(recs)} | " + " | ".join(str(c[s]) for s in STATUSES)
              + f" | {_median(graphs):g} | {_median(step_graphs):g}"
              f" | {sum(1 for s in stats if s.get('graph_breaks'))}"
              f" | {sum(s.get('graph_breaks', 0) for s in stats)}"
              f" | {sum(s.get('recompiles', 0) for s in stats)} |", ""]
    breaks_models, breaks_total = Counter(), Counter()
    recompile_reasons = Counter()
    for r in ran:
        s = r.get("compile") or {}
        mine = Counter()
        for k, v in (s.get("break_reasons") or {}).items():
            mine[_esc(_blank_numbers(k))[:240]] += v
        for key, v in mine.items():
            breaks_models[key] += 1
            breaks_total[key] += v
        for k in set(_blank_numbers(x)[:240] for x in s.get("recompile_reasons") or []):
            recompile_reasons[k] += 1
    if breaks_models:
        lines += ["Graph-break reasons (Dynamo's, by the models that hit each):", "",
                  "| reason | models | breaks |", "| --- | --- | --- |"]
        lines += [f"| {k} | {n} | {breaks_total[k]} |" for k, n in breaks_models.most_common()]
        lines.append("")
    cz = causes(recs)
    if cz["error"] or cz["mismatch"] or cz["fallback"]:
        lines += ["Failure causes:", "", "| cause | models |", "| --- | --- |"]
        lines += [f"| error in {_esc(e)} | {n} |" for e, n in cz["error"].most_common()]
        lines += [f"| mismatch: {_esc(e)} | {n} |" for e, n in cz["mismatch"].most_common()]
        lines += [f"| CPU fallback: `{op}` | {n} |" for op, n in cz["fallback"].most_common()]
        lines.append("")
    if recompile_reasons:
        lines += ["Recompilation reasons (the first guard that failed):", "",
                  "| function: guard | models |", "| --- | --- |"]
        lines += [f"| {_esc(k)} | {n} |" for k, n in recompile_reasons.most_common(20)]
        lines.append("")
    lines += ["| model | status | " + primary + " | graphs (fwd / train / sgd) | breaks |"
              " recompiles | graph runs | CPU fallbacks | reason |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in sorted(recs, key=lambda r: (ZOO_ORDER.index(r["zoo"]) if r["zoo"] in ZOO_ORDER
                                         else 9, r["name"])):
        s = r.get("compile") or {}
        ph = r.get("compile_phases") or {}
        per = " / ".join(str(ph[k]) if k in ph else "-" for k in ("forward", "train", "sgd step"))
        fb = sum((r.get("fallback_ops") or {}).values())
        reason = r.get("reason", "")
        if r["status"] == "error":
            reason = f"{r.get('phase', '?')}: {reason}" + (f" (at {r['where']})" if r.get("where") else "")
        e = eager.get((r["zoo"], r["name"]))
        lines.append(
            f"| {r['zoo']}/{_esc(r['name'])} | {r['status']} | {e['status'] if e else '-'} | "
            + (f"{s.get('graphs', 0)} ({per}) | {s.get('graph_breaks', 0)} | "
               f"{s.get('recompiles', 0)} | {s.get('graph_runs', 0)} | {fb} | "
               if s else "- | - | - | - | - | ")
            + f"{_esc(reason)[:300]} |")
    lines.append("")
    return lines


def write_report(paths: Optional[List[str]] = None, output: str = os.path.join("docs", "models.md"),
                 notes: Optional[str] = os.path.join("docs", "models", "NOTES.md")) -> str:
    """`notes`: a hand-written markdown file (how this run was made, what it left out) placed
    after the introduction, when it exists."""
    paths = paths or sorted(glob.glob(os.path.join("docs", "models", "results-*.jsonl")))
    text = render(latest(paths))
    if notes and os.path.exists(notes):
        with open(notes, encoding="utf-8") as f:
            extra = f.read().strip()
        marker = "## Tolerances (float32)"
        text = text.replace(marker, f"## Notes on this run\n\n{extra}\n\n{marker}", 1)
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "w", encoding="utf-8") as f:
        f.write(text)
    return output
