"""Chat templates as vLLM takes them: --chat-template FILE|TEMPLATE, a request's chat_template (only when the server
trusts request templates), chat_template_kwargs, add_generation_prompt, continue_final_message; a model without a
template refuses chat with a 400 that says so."""

from __future__ import annotations

import shutil
from contextlib import contextmanager
from pathlib import Path

import pytest

from pagedserve.services.gateway.config import GatewayConfig
from pagedserve.services.gateway.text.chat_template import load_chat_template
from pagedserve.services.gateway.text.tokenizer import PromptTokenizer
from tests.unit.gateway.app_client import app_client, serving
from tests.unit.gateway.conftest import MODEL_DIR
from tests.unit.gateway.fake_scheduler import FakeSchedulerClient

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
PLAIN = ("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
         "{% if add_generation_prompt %}[assistant] {% endif %}")


@pytest.fixture(scope="module")
def bare_model_dir(tmp_path_factory) -> Path:
    """The default model's tokenizer without any chat template."""
    folder = tmp_path_factory.mktemp("no-template")
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json"):
        shutil.copy(MODEL_DIR / name, folder / name)
    return folder


@contextmanager
def gateway(model_dir: Path, **config):
    tokenizer = PromptTokenizer(str(model_dir), config.get("chat_template"))
    fake = FakeSchedulerClient(tokenizer)
    with app_client(serving(tokenizer, fake, model_dir, **config)) as client:
        yield client, fake, tokenizer


def prompt_text(fake, tokenizer) -> str:
    return tokenizer.decode(fake.requests[-1].prompt_token_ids, skip_special_tokens=False)


def test_a_model_without_a_template_refuses_chat_and_says_why(bare_model_dir):
    with gateway(bare_model_dir) as (client, fake, tokenizer):
        assert not tokenizer.has_chat_template
        reply = client.post("/v1/chat/completions", json={"messages": MESSAGES})
        assert reply.status_code == 400
        error = reply.json()["error"]
        assert "no chat template" in error["message"] and "--chat-template" in error["message"]
        assert error["code"] == "missing_chat_template" and error["type"] == "invalid_request_error"
        assert client.post("/v1/completions", json={"prompt": "Paris is"}).status_code == 200
        assert fake.requests and fake.requests[-1].prompt_token_ids == tokenizer.encode("Paris is")


def test_server_template_given_as_text_or_file(bare_model_dir, tmp_path):
    path = tmp_path / "plain.jinja"
    path.write_text(PLAIN)
    for value in (PLAIN, str(path)):
        with gateway(bare_model_dir, chat_template=value) as (client, fake, tokenizer):
            assert client.post("/v1/chat/completions", json={"messages": MESSAGES}).status_code == 200
            assert prompt_text(fake, tokenizer) == "[user] What is the capital of France?\n[assistant] "


def test_server_template_overrides_the_models(tmp_path):
    with gateway(MODEL_DIR, chat_template=PLAIN) as (client, fake, tokenizer):
        client.post("/v1/chat/completions", json={"messages": MESSAGES})
        assert prompt_text(fake, tokenizer).startswith("[user] ")


def test_a_template_flag_that_is_neither_file_nor_template_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        GatewayConfig(model_dir="m", chat_template=str(tmp_path / "missing.jinja"))
    assert load_chat_template("{{ messages }}") == "{{ messages }}"


def test_request_templates_need_the_servers_trust():
    body = {"messages": MESSAGES, "chat_template": PLAIN}
    with gateway(MODEL_DIR) as (client, fake, tokenizer):
        reply = client.post("/v1/chat/completions", json=body)
        assert reply.status_code == 400 and reply.json()["error"]["param"] == "chat_template"
        assert "--trust-request-chat-template" in reply.json()["error"]["message"]
        assert not fake.requests
    with gateway(MODEL_DIR, trust_request_chat_template=True) as (client, fake, tokenizer):
        assert client.post("/v1/chat/completions", json=body).status_code == 200
        assert prompt_text(fake, tokenizer) == "[user] What is the capital of France?\n[assistant] "


def test_template_kwargs_and_generation_prompt_flags():
    template = "{{ greeting }}: {{ messages[-1].content }}{% if add_generation_prompt %} >{% endif %}"
    with gateway(MODEL_DIR, chat_template=template) as (client, fake, tokenizer):
        client.post("/v1/chat/completions", json={"messages": MESSAGES, "chat_template_kwargs": {"greeting": "Hi"}})
        assert prompt_text(fake, tokenizer) == "Hi: What is the capital of France? >"
        client.post("/v1/chat/completions", json={"messages": MESSAGES, "add_generation_prompt": False,
                                                  "chat_template_kwargs": {"greeting": "Yo"}})
        assert prompt_text(fake, tokenizer) == "Yo: What is the capital of France?"
        reply = client.post("/v1/chat/completions", json={"messages": MESSAGES,
                                                          "chat_template_kwargs": {"tokenize": True}})
        assert reply.status_code == 400 and reply.json()["error"]["param"] == "chat_template_kwargs"


def test_continue_final_message_leaves_the_answer_open():
    messages = [*MESSAGES, {"role": "assistant", "content": "The capital is"}]
    with gateway(MODEL_DIR) as (client, fake, tokenizer):
        reply = client.post("/v1/chat/completions", json={"messages": messages, "continue_final_message": True,
                                                          "add_generation_prompt": False})
        assert reply.status_code == 200
        assert prompt_text(fake, tokenizer).endswith("<|im_start|>assistant\nThe capital is")
        reply = client.post("/v1/chat/completions", json={"messages": messages, "continue_final_message": True})
        assert reply.status_code == 400 and reply.json()["error"]["param"] == "continue_final_message"


def test_tokenize_takes_the_same_template_fields():
    template = "{{ greeting }} {{ messages[0].content }}"
    with gateway(MODEL_DIR, chat_template=template) as (client, _, tokenizer):
        reply = client.post("/tokenize", json={"messages": MESSAGES, "chat_template_kwargs": {"greeting": "Hey"}})
        assert reply.status_code == 200
        assert tokenizer.decode(reply.json()["tokens"]) == "Hey What is the capital of France?"


def test_a_broken_template_is_a_400_not_a_500():
    with gateway(MODEL_DIR, chat_template="{{ messages[0].content ") as (client, _, _):
        reply = client.post("/v1/chat/completions", json={"messages": MESSAGES})
        assert reply.status_code == 400 and "chat template" in reply.json()["error"]["message"]
