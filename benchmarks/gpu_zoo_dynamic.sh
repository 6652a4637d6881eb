#!/usr/bin/env bash
# Issue #11 must-show: the public zoo under ember with --dynamic false, then --dynamic true; with
# ZOO_CONV_AB=1 also the conv nets with --dynamic true and EMBER_DYNAMIC_CONV_CUDA=0 (their graphs
# compiled with static sizes: the A/B of symbolic sizes through cuDNN convolutions).  One suite after the other on the same machine (never two at once:
# timings), each through benchmarks/gpu_zoo.sh with its own state folder.
#   run(carry=[".bench"], command="bash benchmarks/gpu_zoo_dynamic.sh start && bash benchmarks/gpu_zoo_dynamic.sh collect 540")
#   run(carry=[".bench"], command="bash benchmarks/gpu_zoo_dynamic.sh collect 540")   # until ALL DONE
set -u
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT=/tmp/ember_zoo_dynamic
CONV_MODELS=resnet50,mobilenet_v3_large,convnext_tiny
case "${1:-}" in
start)
    mkdir -p "$ROOT"
    [ -f "$ROOT/pid" ] && kill -0 "$(cat "$ROOT/pid")" 2>/dev/null && { echo "already running"; exit 0; }
    cat > "$ROOT/pair.sh" <<SH
echo \$\$ > "$ROOT/pid"
suite() {  # state, then environment assignments
    local state=\$1; shift
    env "\$@" ZOO_COMPILERS=ember ZOO_STATE=\$state bash "$HERE/gpu_zoo.sh" start
    while [ ! -f \$state/done ]; do sleep 5; done
}
suite $ROOT/static ZOO_DYNAMIC=false
suite $ROOT/dynamic ZOO_DYNAMIC=true
[ "${ZOO_CONV_AB:-0}" = 1 ] && suite $ROOT/dynamic_conv_static ZOO_DYNAMIC=true EMBER_DYNAMIC_CONV_CUDA=0 ZOO_MODELS=$CONV_MODELS
# the decode loop of the must-show (a KV cache growing one token per step), after the suites
(cd "$HERE/.." && PYTHONPATH=. "\${PYTHON:-python3}" benchmarks/decode_loop.py --device cuda --dtype bfloat16) > "$ROOT/decode.txt" 2>&1
touch "$ROOT/done"
SH
    setsid nohup bash "$ROOT/pair.sh" > "$ROOT/pair.log" 2>&1 < /dev/null &
    sleep 2; echo "started"; cat "$ROOT/pair.log"
    ;;
collect)
    wait_s="${2:-0}"; t0=$(date +%s)
    while [ ! -f "$ROOT/done" ] && [ $(( $(date +%s) - t0 )) -lt "$wait_s" ]; do sleep 5; done
    for s in static dynamic dynamic_conv_static; do
        [ -d "$ROOT/$s" ] || continue
        echo "################ $s"
        ZOO_STATE="$ROOT/$s" OUT="${OUT:-/tmp}/$s" bash "$HERE/gpu_zoo.sh" collect 0 | sed -n '/= report/,$p'
    done
    [ -f "$ROOT/decode.txt" ] && { echo "################ decode loop"; tail -n 20 "$ROOT/decode.txt"; }
    [ -f "$ROOT/done" ] && echo "ALL DONE" || echo "RUNNING: collect again within 30 s"
    ;;
*) sed -n '2,7p' "$0"; exit 2 ;;
esac
