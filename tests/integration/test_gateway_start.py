"""The gateway says at start when its model has no chat template (every chat request would get a 400)."""

from __future__ import annotations

import shutil
import subprocess
import sys

from pagedserve.services.ports import free_port
from tests.integration.processes import MODEL_DIR, REPO, wait_for


def test_gateway_warns_at_start_about_a_model_without_a_chat_template(tmp_path):
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json"):
        shutil.copy(MODEL_DIR / name, tmp_path / name)
    log_path = tmp_path / "gateway.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen([sys.executable, "-m", "pagedserve.services.gateway", str(tmp_path), "--port",
                                    str(free_port()),
                                    "--scheduler-address", f"127.0.0.1:{free_port()}"], cwd=REPO, stdout=log,
                                   stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "Uvicorn running" in log_path.read_text() or process.poll() is not None, 120,
                 interval_s=0.2, what="gateway start")
        text = log_path.read_text()
        assert process.poll() is None, text
        assert "WARNING" in text and "this model has no chat template" in text and "--chat-template" in text, text
    finally:
        process.terminate()
        process.wait(30)
