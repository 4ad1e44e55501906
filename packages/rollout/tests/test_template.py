import json

import pytest

from telescope_rollout import ChatTemplate, SingleTurnEnvironment, TemplateError, Tokenizer


def test_render_chatml(tokenizer):
    msgs = [{"role": "user", "content": "hi"}]
    assert tokenizer.apply_chat_template(msgs) == "<|im_start|>user\nhi<|im_end|>\n"
    assert tokenizer.apply_chat_template(msgs, add_generation_prompt=True).endswith("<|im_start|>assistant\n")
    no_think = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, enable_thinking=False)
    assert no_think.endswith("<think>\n\n</think>\n\n")
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.eos_token_id == tokenizer.token_to_id("<|im_end|>")


def test_continue_final_message(tokenizer):
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<think>"}]
    text = tokenizer.apply_chat_template(msgs, continue_final_message=True)
    assert text.endswith("<|im_start|>assistant\n<think>")
    with pytest.raises(TemplateError):
        tokenizer.apply_chat_template(msgs, continue_final_message=True, add_generation_prompt=True)


def test_hf_helpers_sandbox_and_errors():
    tpl = ChatTemplate(
        "{% if messages|length == 0 %}{{ raise_exception('no messages') }}{% endif %}"
        "{{ bos_token }}{{ messages[0] | tojson }}{% for t in tools or [] %}{{ t.name }}{% endfor %}",
        bos_token="<s>",
    )
    assert tpl.render([{"role": "user", "content": "é"}], tools=[{"name": "f"}]) == (
        '<s>{"role": "user", "content": "é"}f'
    )
    with pytest.raises(TemplateError, match="no messages"):
        tpl.render([])
    with pytest.raises(TemplateError):
        ChatTemplate("{% for %}")
    with pytest.raises(TemplateError):
        ChatTemplate("")
    evil = ChatTemplate("{{ messages.__class__.__mro__ }}")  # the sandbox refuses attribute escapes
    with pytest.raises(TemplateError):
        evil.render([{"role": "user", "content": "x"}])


def test_config_template_overrides_folder(model_dir):
    tok = Tokenizer.from_pretrained(
        model_dir, chat_template="{{ messages[-1]['content'] }}!", enable_thinking=True
    )
    assert tok.apply_chat_template([{"role": "user", "content": "yo"}]) == "yo!"


def test_named_templates_and_missing(tmp_path, model_dir):
    (tmp_path / "tokenizer.json").write_bytes((model_dir / "tokenizer.json").read_bytes())
    cfg = {"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert ChatTemplate.from_pretrained(tmp_path).render([]) == "D"
    (tmp_path / "tokenizer_config.json").write_text("{}")
    tok = Tokenizer.from_pretrained(tmp_path)  # loads, but has no template
    with pytest.raises(TemplateError, match="chat_template"):
        tok.apply_chat_template([{"role": "user", "content": "x"}])
    with pytest.raises(FileNotFoundError, match=r"tokenizer\.json"):
        Tokenizer.from_pretrained(tmp_path / "nope")


def test_tokenize_roundtrip_unicode(tokenizer):
    text = "<|im_start|>user\nrésumé 東京 🙂<|im_end|>\n"
    ids = tokenizer.encode(text)
    assert tokenizer.token_to_id("<|im_start|>") == ids[0]
    assert tokenizer.decode(ids) == text
    assert tokenizer.apply_chat_template(
        [{"role": "user", "content": "a"}], tokenize=True
    ) == tokenizer.encode("<|im_start|>user\na<|im_end|>\n")


class _Echo(SingleTurnEnvironment):
    system_prompt = "Be brief."
    instruction_prompt = "Answer:"

    def load_dataset(self, num_samples=-1, **kw):
        return []

    def compute_reward(self, completion, sample, eos_token=""):
        return 1.0


def test_format_prompt_with_thinking_prefix(tokenizer):
    env = _Echo()
    plain = env.format_prompt("2+2?", tokenizer)
    assert plain == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nAnswer:\n\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert env.format_prompt("2+2?", tokenizer, add_thinking_prefix=True) == plain + "<think>"
    assert _Echo(add_thinking_prefix=True).format_prompt("2+2?", tokenizer).endswith("<think>")
    kw = env.format_prompt("q", tokenizer, chat_template_kwargs={"enable_thinking": False})
    assert kw.endswith("</think>\n\n")
