# Sourced by scripts/demo.sh and scripts/test.sh: make ./.venv and install the
# project (server and test extras) with the pinned torch, only when
# pyproject.toml changed since the last install. Sets $PY.
#
# Which torch build: torch==2.13.0 from PyPI is the multi-GB CUDA build on Linux, whatever the
# machine has. So on a machine without an NVIDIA GPU the CPU build (2.13.0+cpu) is installed:
# from a wheel pip's own configuration already finds (find-links, a local index), else from
# PyTorch's CPU index (torch alone), else (that index unreachable) PyPI's CUDA build after all,
# saying so: the suite passes with it on a machine without a GPU. Overrides:
#   TORCH_INDEX_URL=URL   torch (alone) from that index, e.g. https://download.pytorch.org/whl/cu130
#   CACHESVC_TORCH=cuda   PyPI's CUDA build even without a GPU (a build machine for GPU images)
#   CACHESVC_TORCH=cpu    the CPU build even with a GPU, and never the CUDA one: stop when it cannot be had
VENV=.venv
PY=$VENV/bin/python
TORCH_VERSION=2.13.0
TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
# Bytecode: a test run starts hundreds of Python processes, and where PYTHONDONTWRITEBYTECODE is set (this
# VM's shells set it) each compiles every module it imports again: 836 s against 753 s for the same suite
# on 2026-12-07. Such a shell's processes still keep their caches out of the source tree: under
# .venv/pycache (PYTHONPYCACHEPREFIX), set before anything is installed, so that pip's compile at install
# writes there too. Python reads bytecode only under a prefix once one is set: torch's, compiled into
# site-packages by an install made without it, would be compiled again by the suite's first processes,
# several at once (about 7 CPU-s each for torch, Dynamo, Inductor and transformers; CI's first run on a fresh
# clone of 2026-12-08 took 804 s where the same suite on a warm checkout took 670 s).
if [[ -n "${PYTHONDONTWRITEBYTECODE:-}" ]]; then
    unset PYTHONDONTWRITEBYTECODE
    export PYTHONPYCACHEPREFIX="${PYTHONPYCACHEPREFIX:-$PWD/$VENV/pycache}"
fi
[[ -x $PY ]] || "${PYTHON:-python3}" -m venv "$VENV"

# cpu or cuda: CACHESVC_TORCH when set, else cuda only where an NVIDIA GPU is visible
_torch_build() {
    case ${CACHESVC_TORCH:-} in
        cpu|cuda) echo "$CACHESVC_TORCH"; return ;;
        "") ;;
        *) echo "CACHESVC_TORCH must be cpu or cuda, not '$CACHESVC_TORCH'" >&2; return 2 ;;
    esac
    # nvidia-smi comes with the driver (and into containers given a GPU); -L fails when it sees no GPU
    if nvidia-smi -L >/dev/null 2>&1; then
        echo cuda
    else
        echo cpu
    fi
}

_install_torch() {
    if [[ -n ${TORCH_INDEX_URL:-} ]]; then
        "$PY" -m pip install -q --index-url "$TORCH_INDEX_URL" "torch==$TORCH_VERSION"
        return
    fi
    local build
    build=$(_torch_build) || return 2
    if [[ $build == cuda ]]; then
        "$PY" -m pip install -q "torch==$TORCH_VERSION"  # PyPI's build: the CUDA one
        return
    fi
    # The +cpu pin never matches PyPI (it has no local versions): a wheel pip's configuration finds, or the CPU index
    "$PY" -m pip install -q "torch==$TORCH_VERSION+cpu" 2>/dev/null && return
    echo "no NVIDIA GPU here: torch $TORCH_VERSION+cpu from $TORCH_CPU_INDEX (CACHESVC_TORCH=cuda for PyPI's CUDA build)" >&2
    # one retry, not pip's five with back-off: an unreachable index (no DNS) fails in seconds. pip's own
    # output goes to a log: an index it cannot reach ends in "ERROR: ResolutionImpossible", which reads as
    # a conflict where nothing was found at all, so the one line below says what happened instead
    local log=$VENV/torch-cpu-index.log
    "$PY" -m pip install -q --retries 1 --timeout 30 --index-url "$TORCH_CPU_INDEX" "torch==$TORCH_VERSION+cpu" \
        >"$log" 2>&1 && return
    if [[ ${CACHESVC_TORCH:-} == cpu ]]; then
        echo "could not install torch $TORCH_VERSION+cpu: $TORCH_CPU_INDEX unreachable? Set TORCH_INDEX_URL to a mirror" \
             "of it, or PIP_FIND_LINKS to a folder holding the wheel (pip's output: $log)" >&2
        return 1
    fi
    echo "$TORCH_CPU_INDEX unreachable: installing torch $TORCH_VERSION from PyPI instead, its CUDA build (~5 GB; it runs" \
         "on the CPU). For the CPU build set TORCH_INDEX_URL to a mirror of that index or PIP_FIND_LINKS to a folder" \
         "holding the wheel; CACHESVC_TORCH=cpu stops here instead (pip's output: $log)" >&2
    "$PY" -m pip install -q "torch==$TORCH_VERSION"
}

STAMP=$VENV/.installed-pyproject.toml
_installed() {
    cmp -s pyproject.toml "$STAMP" && "$PY" - "$TORCH_VERSION" <<'PY' 2>/dev/null
import importlib.metadata as md, sys
md.version("cachesvc")
assert md.version("torch").startswith(sys.argv[1]), md.version("torch")
PY
}
if ! _installed; then
    echo "installing cachesvc[server,test] and torch==$TORCH_VERSION into $VENV ..." >&2
    "$PY" -m pip install -q --upgrade pip
    _install_torch
    # torch is in place: the project's own pins (torch==2.13.0 holds for 2.13.0+cpu) keep it.
    # The filter: setuptools' "Editable installation ... folders in your working directory with the same
    # name as your package" note (its InformationOnly class), a 10-line box that recent pip shows on every
    # editable install of a layout like ours (cachesvc_client lives in client/). It is filtered by its
    # message alone: every other warning, and every error, still prints.
    PYTHONWARNINGS="${PYTHONWARNINGS:+$PYTHONWARNINGS,}ignore:Editable installation" \
        "$PY" -m pip install -q -e '.[server,test]'
    cp pyproject.toml "$STAMP"
fi
