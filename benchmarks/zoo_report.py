"""ember vs Inductor on the team harness's JSONL (not a test): one row per model.

    python3 benchmarks/zoo_report.py all.jsonl [more.jsonl ...] [--md report.md]

Reads lines written by ``../shared/bench/run.py --json`` (any mix of compilers) and prints, for
every (model, mode, dtype): ember's status, rel-L2 vs eager, speedup over eager, Inductor's
speedup over eager, ember over Inductor, and both cold compile times; then the geomeans.

"ember over Inductor" is ember's speedup divided by Inductor's: each is a same-process ratio to
its own eager run, so the quotient cancels process-to-process drift of the GPU/host.  The raw
ratio of medians (inductor ms / ember ms, two processes) is printed beside it.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys


def load(paths: list[str]) -> list[dict]:
    rows = []
    for path in paths:
        with open(path) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    return rows


def geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def f(v: float | None, spec: str, unit: str = "") -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec) + unit


def report(rows: list[dict], ember: str = "ember", inductor: str = "inductor") -> str:
    latest: dict[tuple, dict] = {}
    for r in rows:  # the last line of a (model, mode, dtype, compiler) wins (--resume reruns)
        latest[(r["model"], r["mode"], r["dtype"], r["compiler"])] = r
    keys = []
    for (m, mode, dt, _c) in latest:
        if (m, mode, dt) not in keys:
            keys.append((m, mode, dt))
    lines = [
        f"| model | mode | dtype | {ember} status | rel_l2 | {ember} vs eager | {inductor} vs eager "
        f"| {ember} vs {inductor} | (raw ms ratio) | {ember} compile s | {inductor} compile s "
        f"| eager ms | {ember} ms | {inductor} ms | {inductor} status |",
        "|" + " --- |" * 15,
    ]
    e_sp, i_sp, ei, e_fail1, compiles, both = [], [], [], [], [], 0
    for k in keys:
        e = latest.get(k + (ember,), {})
        i = latest.get(k + (inductor,), {})
        es, is_ = e.get("status", "not run"), i.get("status", "not run")
        e_ok, i_ok = es == "pass", is_ == "pass"
        esp = e.get("speedup") if e_ok else None
        isp = i.get("speedup") if i_ok else None
        ratio = esp / isp if esp and isp else None
        raw = (i["compiled_ms"] / e["compiled_ms"]) if e_ok and i_ok and e.get("compiled_ms") else None
        if esp:
            e_sp.append(esp)
            if e.get("compile_s") is not None:
                compiles.append(e["compile_s"])
        if isp:
            i_sp.append(isp)
        if ratio:
            ei.append(ratio)
            both += 1
        if es not in ("unavailable", "skipped", "not run"):
            e_fail1.append(esp if esp else 1.0)
        status = es if e_ok or not e.get("error") else f"{es}: {e['error'][:80]}"
        lines.append(
            f"| {k[0]} | {k[1]} | {k[2]} | {status} | {f(e.get('rel_l2'), '.1e')} | {f(esp, '.2f', 'x')} "
            f"| {f(isp, '.2f', 'x')} | {f(ratio, '.2f', 'x')} | {f(raw, '.2f', 'x')} | {f(e.get('compile_s'), '.1f')} "
            f"| {f(i.get('compile_s'), '.1f')} | {f(e.get('eager_ms'), '.3f')} | {f(e.get('compiled_ms'), '.3f')} "
            f"| {f(i.get('compiled_ms'), '.3f')} | {is_} |")
    attempted = [k for k in keys if latest.get(k + (ember,), {}).get("status") not in (None, "unavailable", "skipped")]
    passed = [k for k in attempted if latest[k + (ember,)].get("status") == "pass"]
    i_compiles = [latest[k + (inductor,)]["compile_s"] for k in keys
                  if latest.get(k + (inductor,), {}).get("status") == "pass"
                  and latest[k + (inductor,)].get("compile_s") is not None]
    lines += [
        "",
        f"{ember}: pass {len(passed)}/{len(attempted)} attempted; "
        f"geomean speedup over eager {f(geomean(e_sp), '.3f', 'x')} (passing runs), "
        f"{f(geomean(e_fail1), '.3f', 'x')} counting failures as 1.0x; "
        f"median cold compile {f(statistics.median(compiles) if compiles else None, '.1f')} s",
        f"{inductor}: geomean speedup over eager {f(geomean(i_sp), '.3f', 'x')} over {len(i_sp)} passing runs; "
        f"median cold compile {f(statistics.median(i_compiles) if i_compiles else None, '.1f')} s",
        f"{ember} over {inductor}: geomean {f(geomean(ei), '.3f', 'x')} over the {both} models where both pass",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("jsonl", nargs="+")
    ap.add_argument("--md", default=None, help="also write the table here")
    ap.add_argument("--ember", default="ember", help="compiler name of the ember column (ember, ember-ro ...)")
    ap.add_argument("--inductor", default="inductor")
    args = ap.parse_args()
    text = report(load(args.jsonl), args.ember, args.inductor)
    print(text)
    if args.md:
        with open(args.md, "w") as out:
            out.write(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
