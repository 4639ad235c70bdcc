"""Makes the source tree's python/ importable when flashlab is not installed (pytest run without
PYTHONPATH=python); an installed flashlab, or one on PYTHONPATH, is used as is."""

import importlib.util
import sys
from pathlib import Path

if importlib.util.find_spec("flashlab") is None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
