"""A stand-in grammar child speaking grammar_child.py's protocol: a spec holding "slow" never finishes compiling,
"pause S" takes S seconds, anything else compiles at once (so that timing tests do not depend on the machine)."""

from __future__ import annotations

import json
import sys
import time

if __name__ == "__main__":
    print("ready", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        if "slow" in request["spec"]:
            time.sleep(3600)
        if request["spec"].startswith("pause "):
            time.sleep(float(request["spec"].split()[1]))
        print(json.dumps({"kind": request["kind"], "error": ""}), flush=True)
