#!/usr/bin/env bash
# ember vs Inductor on the public zoo, GPU, inference, bfloat16 (issue #4 must-show).
#
# Runs ../shared/bench/run.py with `--compiler ember,inductor` (model-major: each model's ember run
# is followed by its Inductor run, same machine, same session) on every public-zoo model, infer,
# bfloat16, cuda, cold caches, `--timeout` per run.  The suite takes ~12-18 min wall, longer than
# one device call (10 min), so it runs detached (setsid nohup) and later calls poll and collect.
#
# ---------------------------------------------------------------- for the lead
# 0. Here, once, in the repo root (the harness lives in ../shared, which does not travel):
#        bash benchmarks/gpu_zoo.sh prepare        # copies ../shared/bench -> .bench (git-ignored)
# 1. First device call (starts the suite, then polls ~8.5 min and returns what is done):
#        run(kind="nvidia-h100-x1", carry=[".bench"], timeout_s=600,
#            command="bash benchmarks/gpu_zoo.sh start && bash benchmarks/gpu_zoo.sh collect 510")
# 2. Next call(s) AT ONCE (the machine stays warm only 30 s after a call returns; if it goes back,
#    the detached job dies with it):
#        run(carry=[".bench"], timeout_s=600, command="bash benchmarks/gpu_zoo.sh collect 540")
#    Repeat until the output ends with "GPU_ZOO: DONE".  Each call returns in $OUT:
#        all.jsonl (every run line), ember.jsonl, inductor.jsonl, summary.txt (run.py --summary),
#        report.md (per-model: ember vs eager, vs Inductor, geomeans, cold compile s),
#        progress.log (the suite's console), logs.tar.gz (every worker's log), env.txt.
# 3. If the machine was lost mid-suite: copy the last all.jsonl you got back to .bench/resume.jsonl
#    and do step 1 again; runs already recorded there are skipped (run.py --resume).
#
# Knobs (environment): ZOO_MODELS (default all), ZOO_COMPILERS (default ember,inductor),
# ZOO_EMBER_COLUMN / ZOO_INDUCTOR_COLUMN (report.md columns: ember-ro, inductor-ro ...), ZOO_TIMEOUT (per run, default 240 s), ZOO_MODE (infer), ZOO_DTYPE (bfloat16), ZOO_DYNAMIC
# (run.py --dynamic: none, true or false); for a CPU dry run
# ZOO_DEVICE=cpu ZOO_SIZE=tiny ZOO_STATE=/tmp/zoo_dry (tiny configs; timings mean nothing).
# ---------------------------------------------------------------------------------------------
set -u
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
STATE="${ZOO_STATE:-/tmp/ember_gpu_zoo}"          # outlives the call, not the machine
OUT="${OUT:-$STATE/out}"
PY="${PYTHON:-python3}"

cmd="${1:-}"
case "$cmd" in
prepare)
    # local, on the CPU machine: the harness copy that travels with carry=[".bench"]
    src="${2:-$REPO/../shared/bench}"
    [ -f "$src/run.py" ] || { echo "no harness at $src" >&2; exit 1; }
    exclude="$(git -C "$REPO" rev-parse --git-path info/exclude)"
    case "$exclude" in /*) ;; *) exclude="$REPO/$exclude" ;; esac
    grep -qx '/.bench/' "$exclude" 2>/dev/null || echo '/.bench/' >> "$exclude"
    mkdir -p "$REPO/.bench"
    cp "$src/run.py" "$src/models.py" "$src/README.md" "$REPO/.bench/"
    chmod u+w "$REPO"/.bench/*
    echo "harness copied to $REPO/.bench ($(cd "$REPO/.bench" && ls | tr '\n' ' '))"
    git -C "$REPO" check-ignore -q "$REPO/.bench/run.py" && echo ".bench is git-ignored: pass carry=[\".bench\"]"
    ;;

start)
    [ -f "$REPO/.bench/run.py" ] || { echo "missing .bench/run.py: run 'bash benchmarks/gpu_zoo.sh prepare' here and pass carry=[\".bench\"]" >&2; exit 1; }
    if [ -f "$STATE/pid" ] && kill -0 "$(cat "$STATE/pid")" 2>/dev/null; then
        echo "GPU_ZOO: already running (pid $(cat "$STATE/pid"))"; exit 0
    fi
    mkdir -p "$STATE"
    # a snapshot of the code: later calls re-sync the working tree under the running job
    rm -rf "$STATE/src" && mkdir -p "$STATE/src"
    cp -r "$REPO/ember" "$STATE/src/ember" && cp -r "$REPO/.bench" "$STATE/src/bench"
    cp "$REPO/benchmarks/zoo_report.py" "$STATE/src/"
    if [ -f "$REPO/.bench/resume.jsonl" ] && [ ! -s "$STATE/all.jsonl" ]; then
        cp "$REPO/.bench/resume.jsonl" "$STATE/all.jsonl"
        echo "resuming from .bench/resume.jsonl ($(wc -l < "$STATE/all.jsonl") runs recorded)"
    fi
    {
        echo "date: $(date -u +%FT%TZ)"; echo "git: $(git -C "$REPO" rev-parse HEAD 2>/dev/null || echo '?')"
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
        "$PY" -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'cuda ok', torch.cuda.is_available())" 2>&1
        "$PY" -c "import transformers, timm, torchvision; print('transformers', transformers.__version__, 'timm', timm.__version__, 'torchvision', torchvision.__version__)" 2>&1
        (cd "$STATE" && PYTHONPATH="$STATE/src" "$PY" -c "import ember; print('ember', ember.__version__, ember.__file__)" 2>&1)
    } > "$STATE/env.txt"
    cat "$STATE/env.txt"
    cat > "$STATE/suite.sh" <<EOF
echo \$\$ > "$STATE/pid"
cd "$STATE/src/bench"
export PYTHONPATH="$STATE/src" PYTHONUNBUFFERED=1
"$PY" run.py --device "${ZOO_DEVICE:-cuda}" --size "${ZOO_SIZE:-full}" --zoo public --models "${ZOO_MODELS:-all}" --mode "${ZOO_MODE:-infer}" \\
    --dtype "${ZOO_DTYPE:-bfloat16}" --compiler "${ZOO_COMPILERS:-ember,inductor}" \\
    --timeout "${ZOO_TIMEOUT:-240}" --dynamic "${ZOO_DYNAMIC:-none}" --json "$STATE/all.jsonl" --resume --log-dir "$STATE/logs"
echo "suite exit code \$?"
touch "$STATE/done"
EOF
    rm -f "$STATE/done" "$STATE/pid"
    setsid nohup bash "$STATE/suite.sh" > "$STATE/progress.log" 2>&1 < /dev/null &
    for _ in $(seq 50); do [ -s "$STATE/pid" ] && break; sleep 0.1; done
    echo "GPU_ZOO: started (pid $(cat "$STATE/pid")); state in $STATE"
    ;;

collect)
    wait_s="${2:-0}"
    [ -d "$STATE" ] || { echo "GPU_ZOO: nothing started on this machine (fresh machine? see step 3 above)"; exit 1; }
    t0=$(date +%s)
    while [ ! -f "$STATE/done" ] && [ $(( $(date +%s) - t0 )) -lt "$wait_s" ]; do
        if [ -f "$STATE/pid" ] && ! kill -0 "$(cat "$STATE/pid")" 2>/dev/null; then break; fi
        sleep 5
    done
    mkdir -p "$OUT"
    touch "$STATE/all.jsonl"
    cp "$STATE/all.jsonl" "$STATE/progress.log" "$STATE/env.txt" "$OUT/" 2>/dev/null
    "$PY" - "$STATE/all.jsonl" "$OUT" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for comp in ("ember", "inductor"):
    with open(f"{sys.argv[2]}/{comp}.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows if str(r.get("compiler", "")).startswith(comp))  # ember-ro, inductor-ro too
EOF
    (cd "$STATE/src/bench" && "$PY" run.py --summary "$OUT/inductor.jsonl" "$OUT/ember.jsonl") > "$OUT/summary.txt" 2>&1
    "$PY" "$STATE/src/zoo_report.py" "$OUT/all.jsonl" --md "$OUT/report.md" --ember "${ZOO_EMBER_COLUMN:-ember}" --inductor "${ZOO_INDUCTOR_COLUMN:-inductor}" > /dev/null 2>&1
    [ -d "$STATE/logs" ] && tar -czf "$OUT/logs.tar.gz" -C "$STATE" logs
    echo "================ progress"; tail -n 25 "$STATE/progress.log"
    echo "================ summary (run.py --summary inductor.jsonl ember.jsonl)"; cat "$OUT/summary.txt"
    echo "================ report"; cat "$OUT/report.md" 2>/dev/null
    if [ -f "$STATE/done" ]; then
        echo "GPU_ZOO: DONE ($(wc -l < "$STATE/all.jsonl") runs)"
    elif [ -f "$STATE/pid" ] && kill -0 "$(cat "$STATE/pid")" 2>/dev/null; then
        echo "GPU_ZOO: RUNNING ($(wc -l < "$STATE/all.jsonl") runs so far): call 'collect' again within 30 s"
    else
        echo "GPU_ZOO: STOPPED without finishing (see progress.log)"
    fi
    ;;

*)
    sed -n '2,28p' "$0"
    exit 2
    ;;
esac
