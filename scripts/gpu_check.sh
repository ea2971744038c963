#!/usr/bin/env bash
# The GPU check: scripts/gpu_check.sh OUTDIR  (docs/gpu.md)
#
# Stages, each under its own time limit so that a hang in one still leaves the others' files:
#   probe   python -m ringtorch._device.probe: versions, pinned copies, IPC smoke, NCCL world 1,
#           torch's gloo on CUDA tensors           -> probe.json, probe.txt, probe.log
#   pytest  the tests marked gpu or nccl_lib       -> pytest.log, pytest-junit.xml
#   rerun   the failures of pytest again, verbose  -> rerun.log
#   bench   bench/gpu.py --quick, if present       -> bench.log
# and summary.txt last: each stage passed / failed / timed out, with counts. At most 8 files
# in OUTDIR, no subfolders; at most 8 minutes in all. Runs from the source tree
# (PYTHONPATH), installs nothing. GPU_CHECK_DRY=1 runs it on a CPU machine (simulated
# runtime; the gpu tests are deselected there). PYTHON picks the interpreter (default: the
# checkout's .venv/bin/python where it has torch, else python3).
set -u

if [ $# -ne 1 ]; then
    echo "usage: $0 OUTDIR" >&2
    exit 2
fi
OUT=$1
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

DRY=${GPU_CHECK_DRY:-0}
if [ -z "${PYTHON:-}" ]; then
    PYTHON=python3
    if [ -x .venv/bin/python ] && .venv/bin/python -c "import torch" >/dev/null 2>&1; then
        PYTHON=.venv/bin/python
    fi
fi
TOTAL_S=${GPU_CHECK_TOTAL_S:-470}   # the whole check stays under 8 minutes
START=$(date +%s)
ALLOC_CONF_SEEN=${PYTORCH_CUDA_ALLOC_CONF-(unset)}
# IPC with expandable segments goes through file descriptors that sandboxes may refuse: the
# check runs with the default allocator (the probe records what it ran with).
unset PYTORCH_CUDA_ALLOC_CONF
if [ "$DRY" = 1 ]; then
    export RINGTORCH_DEVICE_RUNTIME=sim
fi

declare -a SUMMARY=()

# limit STAGE_S: the stage's own limit, shrunk to what is left of the total (10 s kept back)
limit() {
    local left=$(( TOTAL_S - ($(date +%s) - START) - 10 ))
    if [ "$left" -lt "$1" ]; then echo $(( left > 5 ? left : 5 )); else echo "$1"; fi
}

# status RC: passed / failed / timed out
status() {
    case "$1" in
        0) echo passed ;;
        124|137) echo "timed out" ;;
        *) echo failed ;;
    esac
}

# --- probe ---------------------------------------------------------------------------------
t0=$(date +%s)
L=$(limit 150)
timeout -k 10 "$L" "$PYTHON" -m ringtorch._device.probe "$OUT" >"$OUT/probe.log" 2>&1
rc=$?
rm -f "$OUT"/*.tmp
counts=$(tail -1 "$OUT/probe.txt" 2>/dev/null | sed -n 's/^probe: //p')
SUMMARY+=("probe: $(status $rc) (exit $rc, $(( $(date +%s) - t0 )) s, limit $L s) ${counts:-no counts}")

# --- pytest --------------------------------------------------------------------------------
t0=$(date +%s)
L=$(limit 200)
# only the files that mark tests gpu or nccl_lib are collected: the rest of the suite may
# import what this machine's torch lacks, and its collection errors would hide the results
mapfile -t test_files < <(grep -rlE 'mark\.(gpu|nccl_lib)\b' tests --include='test_*.py' | sort)
if [ ${#test_files[@]} -eq 0 ]; then
    echo "no test file marks gpu or nccl_lib tests" >"$OUT/pytest.log"
    rc=5
else
    timeout -k 10 "$L" "$PYTHON" -m pytest "${test_files[@]}" -m "gpu or nccl_lib" \
        -p no:cacheprovider --continue-on-collection-errors --timeout 150 -rA -v \
        --junitxml="$OUT/pytest-junit.xml" >"$OUT/pytest.log" 2>&1
    rc=$?
fi
counts=$("$PYTHON" - "$OUT/pytest-junit.xml" "$OUT/pytest.log" <<'PY' 2>/dev/null
import re, sys, xml.etree.ElementTree as ET
suite = ET.parse(sys.argv[1]).getroot()
suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
total, failed, errors, skipped = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
log = open(sys.argv[2], errors="replace").read()
m = re.findall(r"(\d+) deselected", log)
print(f"{total - failed - errors - skipped} passed, {failed} failed, {errors} errors, "
      f"{skipped} skipped, {m[-1] if m else 0} deselected")
PY
)
if [ "$DRY" = 1 ] && [ "$rc" = 5 ]; then
    st="no tests ran (none selected here)"
elif [ "$DRY" != 1 ] && grep -q '^DESELECTED .* marked gpu' "$OUT/pytest.log" 2>/dev/null; then
    st="failed: the gpu tests were deselected on this machine, see below"
else
    st=$(status $rc)
fi
SUMMARY+=("pytest: $st (exit $rc, $(( $(date +%s) - t0 )) s, limit $L s) ${counts:-no counts}")
while IFS= read -r line; do SUMMARY+=("  $line"); done < <(grep '^DESELECTED' "$OUT/pytest.log" 2>/dev/null)

# --- rerun of the failures, verbose --------------------------------------------------------
t0=$(date +%s)
failed_ids=$("$PYTHON" - "$OUT/pytest-junit.xml" <<'PY' 2>/dev/null
import os, sys, xml.etree.ElementTree as ET
for case in ET.parse(sys.argv[1]).getroot().iter("testcase"):
    if case.find("failure") is None and case.find("error") is None:
        continue
    parts = (case.get("classname") or "").split(".")
    for cut in range(len(parts), 0, -1):  # the longest dotted prefix that is a file
        path = "/".join(parts[:cut]) + ".py"
        if os.path.isfile(path):
            print("::".join([path, *parts[cut:], case.get("name", "")]))
            break
PY
)
if [ ! -s "$OUT/pytest-junit.xml" ]; then
    echo "pytest left no junit report: nothing to rerun" >"$OUT/rerun.log"
    SUMMARY+=("rerun: not run (pytest left no junit report)")
elif [ -z "$failed_ids" ]; then
    echo "no failures to rerun" >"$OUT/rerun.log"
    SUMMARY+=("rerun: not needed (no failures)")
else
    L=$(limit 90)
    # shellcheck disable=SC2086
    timeout -k 10 "$L" "$PYTHON" -m pytest -p no:cacheprovider -vv -rA --tb=long \
        --timeout 150 $failed_ids >"$OUT/rerun.log" 2>&1
    rc=$?
    n=$(echo "$failed_ids" | wc -l)
    SUMMARY+=("rerun: $(status $rc) (exit $rc, $(( $(date +%s) - t0 )) s, limit $L s) $n test(s) rerun")
fi

# --- bench ---------------------------------------------------------------------------------
t0=$(date +%s)
if [ -f bench/gpu.py ]; then
    L=$(limit 150)
    timeout -k 10 "$L" "$PYTHON" bench/gpu.py --quick >"$OUT/bench.log" 2>&1
    rc=$?
    SUMMARY+=("bench: $(status $rc) (exit $rc, $(( $(date +%s) - t0 )) s, limit $L s)")
else
    echo "bench/gpu.py: not present" >"$OUT/bench.log"
    SUMMARY+=("bench: not present")
fi

# --- summary, last -------------------------------------------------------------------------
{
    echo "gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n) ($(uname -r))"
    echo "dry run: $DRY; python: $PYTHON ($("$PYTHON" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -1))"
    echo "source: $(git rev-parse --short HEAD 2>/dev/null || echo 'not a git checkout')"
    echo "PYTORCH_CUDA_ALLOC_CONF as found: $ALLOC_CONF_SEEN (unset for the check)"
    echo "total: $(( $(date +%s) - START )) s"
    printf '%s\n' "${SUMMARY[@]}"
} >"$OUT/summary.txt"
cat "$OUT/summary.txt"
# exit 0 when no stage failed or timed out
if printf '%s\n' "${SUMMARY[@]}" | grep -Eq '^[a-z]+: (failed|timed out)'; then
    exit 1
fi
exit 0
