"""``dynatree report``: results JSONL -> markdown tables shaped like the papers' + PNG figures.

Sections (mirroring the tables of the DynaTree and DySpec papers):

1. provenance: rows read, lines skipped (corrupt / other schema version / duplicate), machines,
   library versions, and whether any run group was measured across several processes;
2. greedy-output check: mismatches against the autoregressive output, per strategy;
3. per setup (model pair, dtype, device, T), one column block per dataset:
   main results (DynaTree paper Table 1: t/s ± std, speedup), latency (Table 2: TTFT, TPOT), verification
   efficiency (Table 3: acceptance, the papers' acceptance under its own name, L̄, ℓ̄, #Iter),
   and per run group resources (peak memory, Δ vs AR, time split, tree size, draft calls);
   figures: throughput with error bars, tokens-per-round histogram;
4. ablation (DynaTree paper Table 4): DynaTree with adaptive breadth / depth / history switched on in turn;
5. Spec-Bench's table (:mod:`dynatree.bench.specbench`): speedup per task over our autoregressive
   decoding and over HF ``generate``, the mean over tasks and τ, for Spec-Bench's own questions and,
   under its own heading, for the own instruct sets;
6. length scaling (DynaTree paper Fig. 5 and its first version's Table 4): speedup vs T when several T were run;
7. parameter sensitivity (DynaTree paper versions' Table 5, Fig. 3/7): every swept configuration, best first, plus
   heatmaps over the two most-varied parameters (mean speedup over the other parameters).

Bench rows (``origin == "bench"``) feed 3-6; sweep rows feed 6-7.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynatree.errors import DynaTreeError
from dynatree.bench import plots
from dynatree.bench.metrics import AR, Agg, Summary, committed_per_round, cost_profiles, summarize, varying_options
from dynatree.bench.specbench import specbench_section
from dynatree.bench.store import LoadedResults, load_results

Row = Mapping[str, Any]
SETUP_KEYS = ("target", "draft", "dtype", "device", "threads", "max_new_tokens", "engine", "compile", "temperature",
              "kv_window", "kv_sinks", "buckets")
DASH = "—"


@dataclass
class Report:
    """What ``build_report`` wrote."""

    markdown: Path
    figures: list[Path] = field(default_factory=list)
    rows: int = 0
    skipped: int = 0
    skipped_message: str = ""
    text: str = ""
    specbench: str = ""  # the Spec-Bench section alone, which ``dynatree report`` also prints


# ------------------------------------------------------------------------------------ formatting
def _f(agg: Agg | None, digits: int = 1, scale: float = 1.0) -> str:
    return DASH if agg is None else agg.fmt(digits, scale)


def _m(agg: Agg | None, digits: int = 2, scale: float = 1.0) -> str:
    return DASH if agg is None else f"{agg.mean * scale:.{digits}f}"


def _pct(value: float | None, digits: int = 1) -> str:
    return DASH if value is None else f"{value * 100:.{digits}f}%"


def _delta(value: float | None) -> str:
    return DASH if value is None else f"{value * 100:+.1f}%"


def palette(labels: Sequence[str]) -> dict[str, str]:
    """One colour per label across every figure of the report (autoregressive in grey)."""
    out, i = {}, 0
    for lab in dict.fromkeys(labels):
        if lab == AR:
            out[lab] = "#888888"
        else:
            out[lab] = f"C{i % 10}"
            i += 1
    return out


def _x(value: float | None) -> str:
    return DASH if value is None else f"{value:.2f}×"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()[:80] or "x"


def _setup_title(settings: Mapping[str, Any]) -> str:
    threads = f", {settings.get('threads')} threads" if settings.get("threads") else ""
    engine = f" · engine {settings.get('engine', 'hf')}" + (" + compile" if settings.get("compile") else "")
    temp = f" · temperature {settings['temperature']}" if settings.get("temperature") else " · greedy"
    if settings.get("kv_window"):
        temp += (f" · StreamingLLM KV eviction ({settings.get('kv_sinks', 4)} sinks + {settings['kv_window']} "
                 "recent tokens)")
    return (f"target {settings.get('target')} · draft {settings.get('draft')} · {settings.get('dtype')} "
            f"{settings.get('device')}{threads} · T = {settings.get('max_new_tokens')}{engine}{temp}")


# ------------------------------------------------------------------------------------- sections
def _provenance(path: Path, loaded: LoadedResults, summaries: list[Summary]) -> str:
    machines = sorted({
        f"{r['machine'].get('cpu')} ({r['machine'].get('cpu_count')} cores, {r['machine'].get('torch_threads')} torch threads)"
        + (f", GPU {r['machine']['gpu']}" if r["machine"].get("gpu") else "")
        for r in loaded.rows if isinstance(r.get("machine"), dict)
    })
    versions = sorted({
        ", ".join(f"{k} {v}" for k, v in r["versions"].items()) for r in loaded.rows if isinstance(r.get("versions"), dict)
    })
    multi = sorted({s.group for s in summaries if s.sessions > 1})
    lines = [
        f"Source: `{path}` — {len(loaded.rows)} rows; {loaded.skipped_message()}.",
        "",
        "Machine(s): " + ("; ".join(machines) or "unknown"),
        "",
        "Versions: " + (" | ".join(versions) or "unknown"),
    ]
    if multi:
        lines += ["", f"Note: {len(multi)} run group(s) were measured across several processes (a resumed run); "
                  "their speedups compare timings taken at different times."]
    return "\n".join(lines)


def _greedy_check(rows: Sequence[Row]) -> str:
    bad: dict[str, list[str]] = defaultdict(list)
    checked: dict[str, int] = defaultdict(int)
    for r in rows:
        if r.get("reference", r["strategy"] == AR):  # rows from before several baselines lack the flag
            continue
        checked[r["label"]] += 1
        if r.get("greedy_match") is False:
            bad[r["label"]].append(f"{r['prompt_id']}@{r.get('first_mismatch')}")
    total = sum(len(v) for v in bad.values())
    head = (f"**{total} mismatch(es)** against the autoregressive output of the same run group "
            f"over {sum(checked.values())} checked runs.")
    if not total:
        return head + " Every strategy reproduced the target's greedy output token for token."
    body = _table(["Strategy", "Mismatched prompts", "prompt@first differing token"],
                  [[lab, f"{len(v)}/{checked[lab]}", ", ".join(v[:8]) + (" …" if len(v) > 8 else "")]
                   for lab, v in bad.items()])
    return head + " (fp16/bf16 tree verification can flip near-ties: a tree's logits are computed with another kernel shape than a one-token step's.)\n\n" + body


def _dataset_table(
    by_ds: Mapping[str, Sequence[Summary]], labels: Sequence[str],
    columns: Sequence[tuple[str, Callable[[Summary], str]]],
) -> str:
    datasets = list(by_ds)
    header = ["Method"] + [f"{ds} {title}" if len(datasets) > 1 else title for ds in datasets for title, _ in columns]
    index = {ds: {s.label: s for s in ss} for ds, ss in by_ds.items()}
    rows = []
    for label in labels:
        cells = [label]
        for ds in datasets:
            s = index[ds].get(label)
            cells += [fn(s) if s is not None else DASH for _, fn in columns]
        rows.append(cells)
    return _table(header, rows)


def _accept(s: Summary) -> str:
    return _pct(s.get("acceptance").mean) if s.get("acceptance") else DASH


def _paper_accept(s: Summary) -> str:
    return _pct(s.get("paper_acceptance").mean) if s.get("paper_acceptance") else DASH


MAIN_COLUMNS: list[tuple[str, Callable[[Summary], str]]] = [
    ("t/s", lambda s: _f(s.get("throughput"))),
    ("Speedup", lambda s: _x(s.speedup)),
]
def _main_columns(ss: Sequence[Summary]) -> list[tuple[str, Callable[[Summary], str]]]:
    """t/s and speedup, plus one speedup column per extra autoregressive baseline (e.g. compiled)."""
    baselines = list(dict.fromkeys(b for s in ss for b in s.speedups))
    if len(baselines) < 2:
        return MAIN_COLUMNS
    return [MAIN_COLUMNS[0], (f"Speedup vs {baselines[0]}", MAIN_COLUMNS[1][1])] + [
        (f"Speedup vs {b}", lambda s, b=b: _x(s.speedups.get(b))) for b in baselines[1:]]


LATENCY_COLUMNS: list[tuple[str, Callable[[Summary], str]]] = [
    ("TTFT (ms)", lambda s: _f(s.get("ttft"), 1, 1e3)),
    ("TPOT (ms)", lambda s: _f(s.get("tpot"), 2, 1e3)),
]
EFFICIENCY_COLUMNS: list[tuple[str, Callable[[Summary], str]]] = [
    ("Accept. (accepted/drafted)", _accept),
    ("Accept. (papers' def.)", _paper_accept),
    ("L̄", lambda s: _m(s.get("L"))),
    ("ℓ̄", lambda s: _m(s.get("ell"))),
    ("#Iter", lambda s: _m(s.get("rounds"), 1)),
]


def _resources(summaries: Sequence[Summary]) -> str:
    kind = next((s.memory_kind for s in summaries if s.memory_kind), None)
    mem_title = "Peak GPU mem (MiB)" if kind == "cuda_max_allocated" else "Peak RSS so far (MiB)"
    rows = []
    for s in summaries:
        split = " / ".join(f"{s.time_split[p] * 100:.0f}" if p in s.time_split else DASH
                           for p in ("prefill", "draft", "verify", "commit", "other"))
        rows.append([
            s.label, str(s.prompts), _m(s.get("peak_memory_mb"), 1), _delta(s.memory_change),
            split, _m(s.get("drafted"), 1), _m(s.get("depth"), 1), _m(s.get("draft_calls"), 0),
            _x(s.speedup_per_prompt.mean) + f" ± {s.speedup_per_prompt.std:.2f}" if s.speedup_per_prompt else DASH,
            f"{s.mismatches}/{s.prompts}" if not s.reference else DASH,
        ])
    return _table(
        ["Method", "Prompts", mem_title, "Δ mem vs AR", "Time % prefill / draft / verify / commit / other",
         "Drafted nodes / round", "Tree depth", "Draft calls / prompt", "Per-prompt speedup", "Greedy mismatches"],
        rows,
    )


ABLATION_STEPS: list[tuple[tuple[bool, bool, bool], str]] = [
    ((False, False, False), "Fixed tree (DynaTree, static: B = B_mid, D = D_0)"),
    ((True, False, False), "+ Dynamic breadth"),
    ((False, True, False), "+ Dynamic depth"),
    ((True, True, False), "+ Dynamic breadth & depth"),
    ((True, True, True), "+ History adaptation"),
]


def _ablation(summaries: Sequence[Summary]) -> str | None:
    """The DynaTree paper's Table 4 from the DynaTree rows of one group, classified by their three switches."""
    found: dict[tuple[bool, bool, bool], Summary] = {}
    for s in summaries:
        if s.strategy != "dynatree":
            continue
        flags = (bool(s.config.get("adaptive_breadth")), bool(s.config.get("adaptive_depth")), bool(s.config.get("history")))
        found.setdefault(flags, s)
    if len(found) < 2:
        return None
    base = found.get((False, False, False)) or next((s for s in summaries if s.strategy == "fixed"), None)
    base_tps = base.get("throughput").mean if base and base.get("throughput") else None
    rows = []
    if base is not None and (False, False, False) not in found:
        rows.append([f"Fixed tree ({base.label})", _f(base.get("throughput")), _x(base.speedup), _delta(0.0),
                     _m(base.get("L")), _accept(base)])
    for flags, name in ABLATION_STEPS:
        s = found.get(flags)
        if s is None:
            continue
        tps = s.get("throughput")
        delta = _delta(tps.mean / base_tps - 1) if (tps and base_tps) else DASH
        rows.append([f"{name} [{s.label}]", _f(tps), _x(s.speedup), delta, _m(s.get("L")), _accept(s)])
    return _table(["Variant", "Throughput (t/s)", "Speedup", "Δ vs fixed", "L̄", "Accept."], rows)


# ------------------------------------------------------------------------------------ the report
def build_report(results: str | Path, out_dir: str | Path) -> Report:
    """Read ``results`` (skipping bad lines, counted) and write ``report.md`` + PNGs in ``out_dir``."""
    path = Path(results)
    loaded = load_results(path)
    if not loaded.rows:
        raise DynaTreeError(f"no usable rows in '{path}' ({loaded.skipped_message()})")
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise DynaTreeError(f"cannot create report directory '{out}': {err.strerror}") from None
    rows = loaded.rows
    summaries = summarize(rows)
    origins: dict[tuple[str, str], set[str]] = defaultdict(set)
    for r in rows:
        origins[(r["group"], r["label"])].add(r.get("origin", "bench"))
    report = Report(markdown=out / "report.md", rows=len(rows), skipped=loaded.skipped,
                    skipped_message=loaded.skipped_message())

    md = ["# dynatree benchmark report", "", _provenance(path, loaded, summaries), "",
          "## Greedy-output check", "", _greedy_check(rows), ""]
    md += _main_sections(rows, summaries, origins, out, report)
    specbench = specbench_section(rows, _setup_title)
    report.specbench = "\n".join(specbench)
    md += specbench
    md += _length_section(summaries, origins, out, report)
    md += _sensitivity_sections(summaries, origins, out, report)
    md += ["## Definitions", "",
           "Throughput = generated tokens / wall time of generate (prefill included, warm-up runs excluded), "
           "mean ± sample std over prompts. Speedup = mean t/s ÷ mean autoregressive t/s of the same run group. "
           "L̄ = tokens committed per round (incl. bonus); ℓ̄ = accepted drafted tokens per round; "
           "Accept. = accepted ÷ drafted nodes. *Accept. (papers' def.)* = (ℓ̄ + 1) ÷ K for linear and "
           "(ℓ̄ + 1) ÷ (D + 2) for trees (D = depth, or DynaTree's D_0): the definition that reproduces the papers' "
           "tables and can exceed 100% (they divide L by K or by the tree depth + 2). TTFT = start → first committed token; "
           "TPOT = (total − TTFT) ÷ (T − 1). On CPU, memory is the process RSS high-water mark so far "
           "(monotone across runs); on CUDA, the allocator peak of each run. hf-assisted: HuggingFace "
           "`generate(assistant_model=draft)`; its drafting internals are not visible, so acceptance, ℓ̄ "
           "and the time split are blank.", ""]
    report.text = "\n".join(md)
    report.markdown.write_text(report.text, encoding="utf-8")
    return report


def _setup_key(settings: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(repr(settings.get(k)) for k in SETUP_KEYS)


def _ordered_labels(summaries: Sequence[Summary]) -> list[str]:
    labels = [s.label for s in summaries if s.strategy == AR][:1]
    labels += [s.label for s in summaries if s.label not in labels]
    return list(dict.fromkeys(labels))


def _main_sections(rows: Sequence[Row], summaries: Sequence[Summary],
                   origins: Mapping[tuple[str, str], set[str]], out: Path, report: Report) -> list[str]:
    bench = [s for s in summaries if s.strategy == AR or "bench" in origins[(s.group, s.label)]]
    groups_with_bench = {s.group for s in bench if s.strategy != AR}
    bench = [s for s in bench if s.group in groups_with_bench]
    if not bench:
        return ["## Main results", "", "No bench rows (only sweep rows): see the sensitivity section.", ""]
    setups: dict[tuple[Any, ...], list[Summary]] = defaultdict(list)
    for s in bench:
        setups[_setup_key(s.settings)].append(s)
    md: list[str] = []
    for n, ss in enumerate(setups.values(), 1):
        by_ds: dict[str, list[Summary]] = defaultdict(list)
        for s in ss:
            by_ds[str(s.settings.get("dataset"))].append(s)
        labels = _ordered_labels(ss)
        colors = palette(labels)
        title = _setup_title(ss[0].settings)
        md += [f"## Setup {n}: {title}", "",
               "### Main results (shape of DynaTree Table 1)", "", _dataset_table(by_ds, labels, _main_columns(ss)), "",
               "### Latency (shape of DynaTree Table 2)", "", _dataset_table(by_ds, labels, LATENCY_COLUMNS), "",
               "### Verification efficiency (shape of DynaTree Table 3)", "", _dataset_table(by_ds, labels, EFFICIENCY_COLUMNS), ""]
        for ds, dss in by_ds.items():
            group_rows = [r for r in rows if r["group"] == dss[0].group]
            slug = _slug(f"{n}-{ds}")
            md += [f"### {ds}: resources, time split, tree shape", "", _resources(dss), ""]
            ablation = _ablation(dss)
            if ablation:
                md += [f"### {ds}: ablation (shape of DynaTree Table 4)", "", ablation, ""]
            ok = [s for s in dss if s.get("throughput")]
            fig = plots.throughput_bars(
                [s.label for s in ok], [s.get("throughput").mean for s in ok], [s.get("throughput").std for s in ok],
                [s.speedup for s in ok], f"{ds} · {title}", out / f"throughput-{slug}.png", colors)
            hist_data = {s.label: committed_per_round([r for r in group_rows if r["label"] == s.label])
                         for s in dss if s.strategy != AR}
            figs = [fig]
            if any(hist_data.values()):
                figs.append(plots.tokens_per_round_hist(hist_data, f"tokens per round (pooled over prompts) · {ds} · T = {ss[0].settings.get('max_new_tokens')}",
                                                        out / f"tokens-per-round-{slug}.png", colors))
            report.figures += figs
            md += [f"![throughput]({figs[0].name})"] + ([f"![tokens per round]({figs[1].name})"] if len(figs) > 1 else []) + [""]
            md += _cost_profile_section(group_rows, dss, f"{ds} · {title}", out / f"cost-profile-{slug}.png", report)
    return md


def _cost_profile_section(rows: Sequence[Row], summaries: Sequence[Summary], title: str, path: Path,
                          report: Report) -> list[str]:
    """The verify-cost profiles the auto-budgeted strategies chose their trees from, plotted, with
    the budget each chose (mean drafted-node budget per round)."""
    profiles = cost_profiles(rows)
    if not profiles:
        return []
    lines = ["### Tree budget from the verify-cost profile", "",
             _table(["strategy", "budget (nodes/round)", "verify ms by rows"],
                    [[label, _m(next((s.get("budget") for s in summaries if s.label == label), None), 1),
                      ", ".join(f"{r}: {m:.1f}" for r, m in zip(p["rows"], p["ms"]))]
                     for label, p in profiles.items()]), ""]
    fig = plots.cost_profile_plot({label: (p["rows"], p["ms"]) for label, p in profiles.items()},
                                  f"verify cost vs tree rows · {title}", path)
    report.figures.append(fig)
    return lines + [f"![verify cost]({fig.name})", ""]


def _length_section(summaries: Sequence[Summary], origins: Mapping[tuple[str, str], set[str]],
                    out: Path, report: Report) -> list[str]:
    """Speedup vs generation length for labels measured at ≥ 2 values of T in otherwise equal settings."""
    families: dict[tuple[Any, ...], dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    at: dict[tuple[Any, ...], dict[int, list[Summary]]] = defaultdict(lambda: defaultdict(list))
    for s in summaries:
        fam = tuple(repr(v) for k, v in sorted(s.settings.items()) if k != "max_new_tokens")
        at[fam][int(s.settings["max_new_tokens"])].append(s)
        if s.strategy == AR or s.speedup is None:
            continue
        families[fam][s.label][int(s.settings["max_new_tokens"])] = s.speedup
    md: list[str] = []
    for n, (fam, by_label) in enumerate(families.items(), 1):
        lengths = sorted({t for pts in by_label.values() for t in pts})
        if len(lengths) < 2:
            continue
        md += [f"## Best configuration per generation length ({n}) (shape of the first DynaTree version's Table 4)", "",
               _best_per_length(at[fam], lengths), ""]
        by_label = {lab: pts for lab, pts in by_label.items() if len(pts) >= 2}
        if len(by_label) > 8:  # a sweep over many configs: keep the best 8 at the longest length
            best = sorted(by_label, key=lambda lab: -max(by_label[lab].values()))[:8]
            by_label = {lab: by_label[lab] for lab in best}
        if not by_label:
            continue
        md += [f"## Speedup vs generation length ({n})", "",
               _table(["Method"] + [f"T = {t}" for t in lengths],
                      [[lab] + [_x(pts.get(t)) for t in lengths] for lab, pts in by_label.items()]), ""]
        fig = plots.speedup_vs_length({lab: list(pts.items()) for lab, pts in by_label.items()},
                                      "speedup vs generation length", out / f"speedup-vs-length-{n}.png",
                                      palette(list(by_label)))
        report.figures.append(fig)
        md += [f"![speedup vs length]({fig.name})", ""]
    return md


def _best_per_length(by_length: Mapping[int, Sequence[Summary]], lengths: Sequence[int]) -> str:
    rows = []
    for t in lengths:
        ss = [s for s in by_length.get(t, []) if s.strategy != AR and s.get("throughput")]
        ar = next((s for s in by_length.get(t, []) if s.strategy == AR), None)
        if not ss:
            continue
        best = max(ss, key=lambda s: s.get("throughput").mean)
        rows.append([str(t), best.label, _m(ar.get("throughput"), 1) if ar else DASH,
                     _m(best.get("throughput"), 1), _x(best.speedup), _accept(best), _paper_accept(best)])
    return _table(["Length", "Best configuration", "AR (t/s)", "Best (t/s)", "Speedup", "Accept.",
                   "Accept. (papers' def.)"], rows)


def _sensitivity_sections(summaries: Sequence[Summary], origins: Mapping[tuple[str, str], set[str]],
                          out: Path, report: Report) -> list[str]:
    by_key: dict[tuple[str, str], list[Summary]] = defaultdict(list)
    ar: dict[str, Summary] = {}
    for s in summaries:
        if s.reference:
            ar[s.group] = s
        elif s.strategy != AR and "sweep" in origins[(s.group, s.label)]:
            by_key[(s.group, s.strategy)].append(s)
    md: list[str] = []
    for n, ((group, strategy), ss) in enumerate(by_key.items(), 1):
        varied = varying_options(ss)
        if len(ss) < 2 or not varied:
            continue
        ss = sorted(ss, key=lambda s: -(s.get("throughput").mean if s.get("throughput") else 0.0))
        rows = []
        if group in ar:
            a = ar[group]
            rows.append(["AR"] + [DASH] * len(varied) + [_f(a.get("throughput")), "1.00×", DASH, _m(a.get("L")), DASH])
        for i, s in enumerate(ss):
            vals = [str(s.config.get(k)) for k in varied]
            mark = (lambda t: f"**{t}**") if i == 0 else (lambda t: t)
            rows.append([mark(strategy)] + vals + [mark(_f(s.get("throughput"))), mark(_x(s.speedup)),
                                                   _accept(s), _m(s.get("L")), _m(s.get("drafted"), 1)])
        title = _setup_title(ss[0].settings) + f" · {ss[0].settings.get('dataset')}"
        md += [f"## Parameter sensitivity ({n}): {strategy} · {title}", "",
               f"{len(ss)} configurations, best first (bold).", "",
               _table(["Strategy"] + varied + ["Throughput (t/s)", "Speedup", "Accept.", "L̄", "Drafted / round"], rows), ""]
        if len(varied) >= 2:
            x_name, y_name = sorted(varied, key=lambda k: -len({repr(s.config.get(k)) for s in ss}))[:2]
            xs = sorted({s.config.get(x_name) for s in ss}, key=_sort_key)
            ys = sorted({s.config.get(y_name) for s in ss}, key=_sort_key)
            cells = [[_mean_speedup(ss, {x_name: x, y_name: y}) for x in xs] for y in ys]
            others = [k for k in varied if k not in (x_name, y_name)]
            note = f" (mean over {', '.join(others)})" if others else ""
            fig = plots.heatmap(x_name, xs, y_name, ys, cells,
                                f"{strategy}: speedup{note}\n{ss[0].settings.get('dataset')} · T = {ss[0].settings.get('max_new_tokens')}",
                                out / f"sensitivity-{n}-{_slug(strategy)}.png")
            report.figures.append(fig)
            md += [f"![sensitivity heatmap]({fig.name})", ""]
    return md


def _sort_key(value: Any) -> tuple[int, Any]:
    return (0, value) if isinstance(value, (int, float)) else (1, str(value))


def _mean_speedup(ss: Sequence[Summary], where: Mapping[str, Any]) -> float | None:
    vals = [s.speedup for s in ss if s.speedup is not None and all(s.config.get(k) == v for k, v in where.items())]
    return sum(vals) / len(vals) if vals else None
