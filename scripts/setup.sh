#!/usr/bin/env bash
# Set up optcheck in the active Python environment (a venv, or the user's Python).
#   bash scripts/setup.sh          optcheck + PyTorch backend + pythonnet
#   bash scripts/setup.sh --test   also the test tools (extra `test`: pytest, pytest-xdist, hypothesis, ...),
#                                  the Lightning/transformers integrations (extra
#                                  `integrations`), the third-party optimizer zoo (extra `zoo`:
#                                  pytorch-optimizer, heavyball, schedulefree, bitsandbytes, torchao),
#                                  a .NET runtime (Mono, mcs) for the bridge tests, and
#                                  gitlab-ci-local (npm) + rsync, which run the shipped GitLab pipeline
#                                  in tests/integration/test_ci_nightly.py
# torch is pinned to 2.13.0 first: a CPU build is on this machine kind's disk, while a
# bare `pip install torch` would pull GBs of CUDA packages.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
want_test=0
[ "${1:-}" = "--test" ] && want_test=1

"$PY" -m pip install --disable-pip-version-check -q "torch==2.13.0"
if [ $want_test = 1 ]; then
  # torch stays the CPU 2.13.0 installed above: lightning/transformers/accelerate only need torch>=2.x
  "$PY" -m pip install --disable-pip-version-check -q -e ".[pytorch,torchsharp,plot,test,integrations,zoo]" "torch==2.13.0"
else
  "$PY" -m pip install --disable-pip-version-check -q -e ".[pytorch,torchsharp,plot]"
fi

if [ $want_test = 1 ]; then
  # Mono (runtime + mcs) runs the .NET side of the bridge tests; CoreCLR 3.1 comes from PyPI's dotnetcore2.
  "$PY" -m pip install --disable-pip-version-check -q "dotnetcore2>=3.1" || echo "setup: dotnetcore2 not installed; CoreCLR bridge tests will skip" >&2
  # pythonnet on Mono needs libmono-2.0 and the netstandard facade (mono-devel); without the facade
  # Mono aborts the process inside pythonnet.load.
  if ! command -v mcs >/dev/null || ! command -v mono >/dev/null || [ ! -f /usr/lib/mono/4.5/Facades/netstandard.dll ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      apt-get update -qq >/dev/null
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        mono-runtime mono-mcs mono-devel libmono-2.0-dev >/dev/null
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libicu72 >/dev/null 2>&1 || true
    else
      echo "setup: no root/apt-get: install mono-runtime, mono-mcs, mono-devel and libmono-2.0-dev yourself; Mono tests will skip" >&2
    fi
  fi
fi
if [ $want_test = 1 ]; then
  # gitlab-ci-local runs examples/ci/gitlab/.gitlab-ci.yml with its shell executor (no Docker); it copies
  # the checkout with rsync. 4.65.1 is pinned: later releases need Node 22 (Set.prototype.union), Debian 12
  # and 13 ship Node 18/20. Without them the GitLab test skips, saying why.
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    missing=""
    command -v rsync >/dev/null || missing="$missing rsync"
    command -v npm >/dev/null || missing="$missing nodejs npm"
    if [ -n "$missing" ]; then
      apt-get update -qq >/dev/null
      # shellcheck disable=SC2086
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null \
        || echo "setup: could not install$missing; the GitLab pipeline test will skip" >&2
    fi
  fi
  if command -v npm >/dev/null && ! gitlab-ci-local --version >/dev/null 2>&1; then
    npm install -g --silent gitlab-ci-local@4.65.1 >/dev/null 2>&1 \
      || echo "setup: npm could not install gitlab-ci-local; the GitLab pipeline test will skip" >&2
  fi
fi
echo "setup: done ($("$PY" -c 'import optcheck, torch; print("optcheck", optcheck.__version__, "torch", torch.__version__)'))"
