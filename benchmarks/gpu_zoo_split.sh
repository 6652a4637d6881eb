#!/usr/bin/env bash
# The zoo suite of gpu_zoo.sh split over the GPUs of one machine: one suite per GPU, each running its
# share of the models model-major (a model's ember run, then its Inductor run, on the same GPU), so
# a multi-GPU lease finishes the 10-model training zoo in half (two GPUs) of its ~19 minutes.
# The suites share the host's cores: compile times and host-bound steps of both compilers are
# measured under the same neighbour load, so compare ember with Inductor within this run only.
#
#     bash benchmarks/gpu_zoo.sh prepare                      # here, once: the harness into .bench
#     run(kind="nvidia-h200-x2", carry=[".bench"], command="ZOO_MODE=train bash benchmarks/gpu_zoo_split.sh start \
#         'resnet50,vit_base_patch16_224|gpt2,mlp4' && bash benchmarks/gpu_zoo_split.sh collect 500")
#     run(carry=[".bench"], command="bash benchmarks/gpu_zoo_split.sh collect 540")   # at once, until DONE
#
# Two suites on one machine (training and reduce-overhead training on an x4): start each with its
# own ZOO_SPLIT_STATE and, for the second, ZOO_GPU_OFFSET=2 (its GPUs start there); collect each
# with its ZOO_SPLIT_STATE and its own OUT.
#
# `start GROUPS`: GROUPS is one comma list of models per GPU, separated by '|'.  The other knobs are
# gpu_zoo.sh's (ZOO_MODE, ZOO_COMPILERS, ZOO_TIMEOUT...).  `collect [WAIT_S]` waits for every suite up to
# WAIT_S seconds together and writes to $OUT: all.jsonl (every suite's lines), report.md
# (benchmarks/zoo_report.py over them), env.txt and progress-<gpu>.log per suite (at most 8 files come back).
set -u
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="${ZOO_SPLIT_STATE:-/tmp/ember_gpu_zoo_split}"
PY="${PYTHON:-python3}"

case "${1:-}" in
start)
    IFS='|' read -r -a groups <<< "${2:?start needs the model groups, one per GPU, separated by |}"
    mkdir -p "$ROOT"
    echo "${#groups[@]}" > "$ROOT/count"
    for gpu in "${!groups[@]}"; do
        CUDA_VISIBLE_DEVICES="$((gpu + ${ZOO_GPU_OFFSET:-0}))" ZOO_STATE="$ROOT/gpu$gpu" ZOO_MODELS="${groups[$gpu]}" \
            bash "$HERE/gpu_zoo.sh" start | tail -n 1
    done
    ;;
collect)
    wait_s="${2:-0}"
    count="$(cat "$ROOT/count" 2>/dev/null || echo 0)"
    [ "$count" -gt 0 ] || { echo "GPU_ZOO_SPLIT: nothing started on this machine"; exit 1; }
    t0=$(date +%s)
    for gpu in $(seq 0 $((count - 1))); do
        left=$(( wait_s - ($(date +%s) - t0) )); [ "$left" -lt 0 ] && left=0
        ZOO_STATE="$ROOT/gpu$gpu" OUT="$ROOT/gpu$gpu/out" bash "$HERE/gpu_zoo.sh" collect "$left" > "$ROOT/gpu$gpu/collect.txt" 2>&1
    done
    out="${OUT:-$ROOT/out}"; mkdir -p "$out"
    cat "$ROOT"/gpu*/all.jsonl > "$out/all.jsonl" 2>/dev/null
    cp "$ROOT/gpu0/env.txt" "$out/env.txt" 2>/dev/null
    "$PY" "$HERE/zoo_report.py" "$out/all.jsonl" --md "$out/report.md" --ember "${ZOO_EMBER_COLUMN:-ember}" \
        --inductor "${ZOO_INDUCTOR_COLUMN:-inductor}" > /dev/null 2>&1
    done_count=0
    for gpu in $(seq 0 $((count - 1))); do
        cp "$ROOT/gpu$gpu/progress.log" "$out/progress-$gpu.log" 2>/dev/null
        echo "================ GPU $gpu"; tail -n 4 "$ROOT/gpu$gpu/progress.log" 2>/dev/null
        [ -f "$ROOT/gpu$gpu/done" ] && done_count=$((done_count + 1))
    done
    echo "================ report"; cat "$out/report.md" 2>/dev/null
    if [ "$done_count" -eq "$count" ]; then
        echo "GPU_ZOO_SPLIT: DONE ($(wc -l < "$out/all.jsonl") runs)"
    else
        echo "GPU_ZOO_SPLIT: RUNNING ($done_count of $count suites done, $(wc -l < "$out/all.jsonl") runs): collect again within 30 s"
    fi
    ;;
*)
    sed -n '2,17p' "$0"; exit 2
    ;;
esac
