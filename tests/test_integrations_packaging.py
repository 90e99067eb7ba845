"""The adapters stay optional: the base install never imports a framework, and a missing one is
named with the extra that installs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def test_base_import_loads_no_framework(tmp_path: Path) -> None:
    code = (
        "import sys, memstrata, memstrata.integrations, memstrata.layers._items\n"
        "print(sorted(m for m in ('langgraph', 'agents', 'autogen_core') if m in sys.modules))\n"
    )
    result = _python(code, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("module", "blocked", "extra"),
    [
        ("langgraph", "langgraph", "langgraph"),
        ("openai_agents", "agents", "openai-agents"),
        ("autogen", "autogen_core", "autogen"),
    ],
)
def test_missing_framework_names_its_extra(module: str, blocked: str, extra: str, tmp_path: Path) -> None:
    code = f"import sys\nsys.modules[{blocked!r}] = None\nimport memstrata.integrations.{module}\n"
    result = _python(code, tmp_path)
    assert result.returncode != 0
    assert f"pip install 'memstrata[{extra}]'" in result.stderr, result.stderr[-2000:]


def test_bare_integrations_folder_import_fails_clearly() -> None:
    result = _python("import integrations", ROOT)
    assert result.returncode != 0
    assert "import memstrata.integrations, not integrations" in result.stderr
