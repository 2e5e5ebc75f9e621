"""Structured outputs and vLLM's extras through the official `openai` client, against a real `python -m app` (issue
31): `chat.completions.parse(Model)` on several schemas, json_object, vLLM's structured_outputs and guided_*
fields, and each accepted extra changing the answer exactly as vLLM documents it. Requests that finish on their
first token (max_tokens=1, EOS first) answer 200."""
from __future__ import annotations

import json
import math
from enum import Enum
from typing import Annotated, Optional

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from test_openai_api import MODEL, QUESTION, module_server, tokenizer  # noqa: F401 - tokenizer is a fixture

RAIN = "Write a poem about rain."  # a raw completion whose greedy first token is <|im_end|>
server, client = module_server("structured")


def ask(client, **kw):
    return client.chat.completions.create(model=MODEL, messages=kw.pop("messages", QUESTION), **kw)


# ---- a request that ends on its first token ------------------------------------------------------------------
def test_one_token_and_eos_first_answer_200(client, server):
    r = ask(client, max_tokens=1, temperature=0)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 1 and r.choices[0].message.content
    rain = client.completions.create(model=MODEL, prompt=RAIN, max_tokens=8, temperature=0)
    assert rain.choices[0].text == "" and rain.choices[0].finish_reason == "stop"
    assert rain.usage.completion_tokens == 1  # the EOS token was generated; its text is not part of the answer
    streamed = list(client.completions.create(model=MODEL, prompt=RAIN, max_tokens=8, temperature=0, stream=True))
    assert [c.choices[0].finish_reason for c in streamed if c.choices] == ["stop"]
    assert "Traceback" not in server[1].read_text()


# ---- structured outputs ---------------------------------------------------------------------------------
Short = Annotated[str, Field(max_length=20)]  # a 135M model can loop inside a string: every string is bounded


class Kind(str, Enum):
    capital = "capital"
    town = "town"


class Address(BaseModel):
    street: str = Field(max_length=30)
    city: str = Field(max_length=20)


class Person(BaseModel):  # nested object, array, enum and optional fields, every one bounded so the answer ends
    name: str = Field(max_length=20)
    age: int = Field(ge=0, le=150)
    home: Address
    hobbies: list[Short] = Field(max_length=3)
    kind: Kind
    nickname: Optional[str] = Field(max_length=15)


class City(BaseModel):
    name: str = Field(max_length=20)
    country: str = Field(max_length=20)
    population: int = Field(ge=0, le=100_000_000)
    districts: list[Short] = Field(max_length=2)


class Answer(BaseModel):
    answer: bool
    confidence: int = Field(ge=0, le=100)  # a float or an unbounded int can run on digit after digit


@pytest.mark.parametrize("model,prompt", [
    (Person, "Describe a person named Anna as JSON."),
    (City, "Describe Paris as JSON."),
    (Answer, "Is the Earth round? Answer as JSON."),
], ids=["nested", "city", "flat"])
def test_parse_returns_a_parsed_object_that_validates(client, model, prompt):
    r = client.chat.completions.parse(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                      response_format=model, max_tokens=300, temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, model)
    jsonschema.validate(json.loads(choice.message.content), model.model_json_schema())
    # sampled too: every answer validates, whatever the draw
    for seed in (1, 2):
        s = client.chat.completions.parse(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                          response_format=model, max_tokens=300, temperature=1.0, seed=seed)
        jsonschema.validate(json.loads(s.choices[0].message.content), model.model_json_schema())


def test_json_object_answers_parse(client):
    for seed in (0, 1, 2):
        r = ask(client, messages=[{"role": "user", "content": "Give me a JSON object about a cat."}],
                response_format={"type": "json_object"}, max_tokens=300, temperature=0.7, seed=seed)
        if r.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(r.choices[0].message.content), dict)
        else:  # cut by max_tokens: still a prefix of a JSON object
            assert r.choices[0].message.content.startswith("{")


def test_vllm_structured_outputs_and_guided_fields(client):
    choice = ask(client, max_tokens=10, temperature=0.9, seed=3,
                 extra_body={"structured_outputs": {"choice": ["yes", "no", "maybe"]}})
    assert choice.choices[0].message.content in ("yes", "no", "maybe")
    date = ask(client, max_tokens=20, temperature=0.8, seed=4,
               extra_body={"structured_outputs": {"regex": "[0-9]{4}-[0-9]{2}-[0-9]{2}"}})
    text = date.choices[0].message.content
    assert len(text) == 10 and text[4] == text[7] == "-" and text.replace("-", "").isdigit()
    lark = ask(client, max_tokens=10, temperature=0.8, seed=5,
               extra_body={"structured_outputs": {"grammar": 'start: "red" | "green" | "blue"'}})
    assert lark.choices[0].message.content in ("red", "green", "blue")
    legacy = ask(client, max_tokens=10, temperature=0, extra_body={"guided_choice": ["alpha", "beta"]})
    assert legacy.choices[0].message.content in ("alpha", "beta") and legacy.choices[0].finish_reason == "stop"
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    guided = ask(client, max_tokens=30, temperature=0, extra_body={"guided_json": schema})
    jsonschema.validate(json.loads(guided.choices[0].message.content), schema)
    # a schema over the grammar box's size limit is refused before any work, as the lab's grammar box refuses it
    huge = {"type": "object", "properties": {f"k{i}": {"type": "string"} for i in range(2000)}}
    with pytest.raises(openai.BadRequestError) as err:
        ask(client, max_tokens=5, extra_body={"guided_json": huge})
    assert "limit" in err.value.response.json()["error"]["message"]


# ---- vLLM's sampling extras -----------------------------------------------------------------------------
def test_ignore_eos_and_min_tokens(client):
    r = client.completions.create(model=MODEL, prompt=RAIN, max_tokens=7, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 7
    m = client.completions.create(model=MODEL, prompt=RAIN, max_tokens=7, temperature=0,
                                  extra_body={"min_tokens": 3, "return_token_ids": True})
    ids = m.choices[0].model_extra["token_ids"]
    assert len(ids) >= 3 and 2 not in ids[:3]  # <|im_end|> (id 2) is held back until three tokens exist


def test_logit_bias_stop_token_ids_and_the_stop_string_kept(client, tokenizer):
    base = ask(client, max_tokens=8, temperature=0, extra_body={"return_token_ids": True})
    ids = base.choices[0].model_extra["token_ids"]
    assert base.model_extra["prompt_token_ids"] == tokenizer.apply_chat_template(
        QUESTION, add_generation_prompt=True, tokenize=True)["input_ids"]
    assert tokenizer.decode(ids) == base.choices[0].message.content
    banned = ask(client, max_tokens=8, temperature=0, logit_bias={str(ids[1]): -100},
                 extra_body={"return_token_ids": True})
    assert ids[1] not in banned.choices[0].model_extra["token_ids"]
    cut = ask(client, max_tokens=8, temperature=0, extra_body={"stop_token_ids": [ids[2]]})
    assert cut.choices[0].finish_reason == "stop" and cut.choices[0].message.content == tokenizer.decode(ids[:2])
    word = base.choices[0].message.content.split()[1]
    kept = ask(client, max_tokens=8, temperature=0, stop=[word], extra_body={"include_stop_str_in_output": True})
    assert kept.choices[0].message.content.endswith(word)
    only = ask(client, max_tokens=4, temperature=0, extra_body={"allowed_token_ids": [28, 29, 30]})
    assert set(only.choices[0].message.content) <= set(tokenizer.decode([28]) + tokenizer.decode([29]) +
                                                       tokenizer.decode([30]))
    first = base.choices[0].message.content.split()[0]
    clean = ask(client, max_tokens=8, temperature=0, extra_body={"bad_words": [first]})
    assert first not in clean.choices[0].message.content
    special = client.completions.create(model=MODEL, prompt=RAIN, max_tokens=3, temperature=0,
                                        extra_body={"ignore_eos": True, "skip_special_tokens": False,
                                                    "spaces_between_special_tokens": True})
    assert special.choices[0].text.startswith("<|im_end|>")


def test_echo_prompt_logprobs_and_truncation(client, tokenizer):
    prompt = "The capital of France is"
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, temperature=0, echo=True, logprobs=2)
    c = r.choices[0]
    n_prompt = len(tokenizer(prompt)["input_ids"])
    assert c.text.startswith(prompt) and len(c.logprobs.tokens) == n_prompt + r.usage.completion_tokens
    assert c.logprobs.token_logprobs[0] is None and c.logprobs.top_logprobs[0] is None
    assert all(v <= 0 for v in c.logprobs.token_logprobs[1:])
    assert c.logprobs.text_offset[n_prompt] == len(prompt)
    # vLLM's prompt_logprobs: the prompt token's own entry with its rank, and the most likely one (rank 1)
    p = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, temperature=0,
                                  extra_body={"prompt_logprobs": 1})
    plp = p.choices[0].model_extra["prompt_logprobs"]
    assert plp[0] is None and len(plp) == n_prompt
    for i, entry in enumerate(plp[1:], start=1):
        own = entry[str(tokenizer(prompt)["input_ids"][i])]
        assert math.isclose(own["logprob"], c.logprobs.token_logprobs[i], abs_tol=1e-5)
        assert min(e["rank"] for e in entry.values()) == 1
    # the last prompt position's best guess is what greedy decoding then generates
    last = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, temperature=0, logprobs=1)
    assert math.isclose(last.choices[0].logprobs.token_logprobs[0], c.logprobs.token_logprobs[n_prompt], abs_tol=1e-4)
    short = client.completions.create(model=MODEL, prompt="one two three four five six", max_tokens=2,
                                      temperature=0, extra_body={"truncate_prompt_tokens": 3})
    assert short.usage.prompt_tokens == 3


def test_chat_template_switches_and_neutral_fields(client, tokenizer):
    msgs = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "The colour is"}]
    cont = ask(client, messages=msgs, max_tokens=3, temperature=0,
               extra_body={"add_generation_prompt": False, "continue_final_message": True,
                           "chat_template_kwargs": {"enable_thinking": False}})
    expected = tokenizer.apply_chat_template(msgs, add_generation_prompt=False, continue_final_message=True,
                                             tokenize=True)["input_ids"]
    assert cont.usage.prompt_tokens == len(expected)
    plain = ask(client, messages=QUESTION, max_tokens=2, temperature=0, extra_body={"add_generation_prompt": False})
    assert plain.usage.prompt_tokens == len(tokenizer.apply_chat_template(QUESTION, tokenize=True)["input_ids"])
    same = ask(client, max_tokens=4, temperature=0, parallel_tool_calls=False, metadata={"team": "lab"})
    assert same.choices[0].message.content == ask(client, max_tokens=4, temperature=0).choices[0].message.content


def test_an_object_that_lists_its_properties_gets_no_others(client):
    # llm --schema 'name, age int' sends this (no additionalProperties): JSON Schema would allow any other key,
    # and a small model adds some; as vLLM's default backend, only the listed properties are admitted
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 150}},
              "required": ["name", "age"]}
    for seed in (0, 1, 2):
        r = ask(client, messages=[{"role": "user", "content": "Invent a person with skills."}], max_tokens=100,
                temperature=0.8, seed=seed,
                response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}})
        assert set(json.loads(r.choices[0].message.content)) == {"name", "age"}


def test_closing_objects_leaves_data_and_explicit_choices_alone():
    from app.openai_schema import _closed

    schema = {"type": "object", "properties": {"properties": {"type": "object", "properties": {"a": {}}},
                                               "open": {"type": "object", "properties": {}, "additionalProperties": True},
                                               "e": {"enum": [{"properties": {}}]}}}
    out = _closed(schema)
    assert out["additionalProperties"] is False and out["properties"]["properties"]["additionalProperties"] is False
    assert out["properties"]["open"]["additionalProperties"] is True  # what the schema says stands
    assert out["properties"]["e"] == {"enum": [{"properties": {}}]}  # a value, not a schema
    assert _closed({"type": "object"}) == {"type": "object"}  # json_object: any object


def test_a_grammar_that_can_match_nothing_is_answered_400(client, server):
    # it validates, but no token can start it: refused when the engine compiles it, before any step
    for so in ({"grammar": "start: x\nx: x"}, {"regex": "[^\\x00-\\x{10FFFF}]"}):
        with pytest.raises(openai.BadRequestError) as err:
            ask(client, max_tokens=5, extra_body={"structured_outputs": so})
        assert "match" in err.value.response.json()["error"]["message"]
    assert ask(client, max_tokens=5, temperature=0).choices[0].message.content  # the server goes on
    assert "Traceback" not in server[1].read_text()
