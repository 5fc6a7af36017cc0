"""``ragen_lightning.algos`` is pure torch math: importing it pulls in no lightning, no vllm, no model stack."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import ragen_lightning.algos

ALGOS_DIR = Path(ragen_lightning.algos.__file__).parent
FORBIDDEN = ("lightning", "pytorch_lightning", "lightning_fabric", "vllm", "transformers", "torchmetrics", "peft")


def test_import_does_not_load_lightning_or_vllm():
    # A fresh interpreter: other tests in this process may already have imported lightning.
    code = (
        "import json, sys; import ragen_lightning.algos; "
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


def test_algos_source_imports_only_torch_stdlib_and_itself():
    for path in sorted(ALGOS_DIR.glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level > 0:
                    continue  # relative: inside algos
                roots = [(node.module or "").split(".")[0]]
            else:
                continue
            for root in roots:
                assert root == "torch" or root in sys.stdlib_module_names, f"{path.name} imports {root}"
