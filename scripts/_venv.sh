# Sourced by the scripts: create or reuse .venv and install the project into it.
# Usage: . scripts/_venv.sh [extra ...]   (extras from pyproject.toml, e.g. test, bench)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3}"
EXTRAS="${*:-}"
if [ ! -x "$VENV/bin/python" ]; then
    echo "setting up $VENV ..." >&2
    "$PY" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip >&2
fi
# Reinstall when pyproject.toml or the requested extras change.
STAMP="$VENV/.loader-installed"
WANT="$(cat "$ROOT/pyproject.toml" | sha256sum | cut -c1-16) extras=[${EXTRAS// /,}]"
if [ ! -f "$STAMP" ] || ! grep -qxF "$WANT" "$STAMP"; then
    SPEC="$ROOT"
    if [ -n "$EXTRAS" ]; then SPEC="$ROOT[${EXTRAS// /,}]"; fi
    echo "installing loader${EXTRAS:+[$EXTRAS]} into $VENV ..." >&2
    if ! "$VENV/bin/python" -m pip install -q -e "$SPEC" >"$VENV/install.log" 2>&1; then
        cat "$VENV/install.log" >&2
        echo "error: installing loader into $VENV failed (log above)" >&2
        exit 1
    fi
    echo "$WANT" >> "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
cd "$ROOT"
