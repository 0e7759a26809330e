"""The layering contract and the torch-free configuration (docs/architecture.md)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_hold() -> None:
    # lint-imports reads the contracts in pyproject.toml: layers downwards only, no import cycles between any
    # two modules or sibling packages of dgrpo, and no torch/transformers under the configuration or the protocol.
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint is not None, "import-linter is a test dependency (pip install -e .[test])"
    result = subprocess.run([lint], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_configuration_loads_without_torch() -> None:
    # A fresh interpreter: importing and validating every configuration model must not pull in torch.
    code = (
        "import sys\n"
        "import dgrpo.config, dgrpo.simulations.scenario as s, dgrpo.daemon.settings as d\n"
        "s.load_scenario(None, ['rollout.sampler=\"seeded\"', 'defense.chain=[\"length\"]'])\n"
        "d.load_node_settings(None, ['limits.max_completions=8'])\n"
        "bad = [m for m in ('torch', 'transformers', 'peft') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
