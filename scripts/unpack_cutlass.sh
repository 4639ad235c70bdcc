#!/usr/bin/env bash
# unpack_cutlass.sh WHEEL DEST: extracts cutlass_library/source/include of the nvidia-cutlass
# wheel into DEST/include (python's zipfile: no unzip needed on the GPU machine).
set -euo pipefail
whl=$1 dest=$2
python3 - "$whl" "$dest" <<'PY'
import os, sys, zipfile
whl, dest = sys.argv[1], sys.argv[2]
prefix = "cutlass_library/source/include/"
with zipfile.ZipFile(whl) as z:
    for name in z.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            out = os.path.join(dest, "include", name[len(prefix):])
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with z.open(name) as src, open(out, "wb") as dst:
                dst.write(src.read())
PY
