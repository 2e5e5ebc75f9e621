"""OpenAI request bodies -> typed jobs for the room's engine, every field checked before any tokenizer work.

`parse_chat` and `parse_completion` read a decoded JSON body and return a `Job` (or raise `ApiError`, whose
`body()` is OpenAI's error object); `tokenize` then turns the job's prompts into token ids with the engine's
own tokenizer and chat template. Nothing here touches the engine's state.

Fields follow OpenAI's API (names, types, ranges), plus vLLM's extras: its sampling fields (`top_k`, `min_p`,
`repetition_penalty`, `ignore_eos`, `min_tokens`, `stop_token_ids`, `allowed_token_ids`, `bad_words`, ...), its
output fields (`prompt_logprobs`, `return_token_ids`, `echo`), its chat-template controls and its structured
outputs. Structured outputs, OpenAI's `response_format` (json_schema, json_object) and vLLM's
`structured_outputs` / `guided_*`, become one engine `Grammar` (engine/grammar.py), capped as the lab's grammar
box is. A field we do not know, or know but do not implement with a value that would change the answer
(`tools`, `best_of` > n, ...), is refused by name: a client must not be silently given something other than what
it asked for.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import json

from engine import MAX_STOP_CHARS, MAX_STOP_STRINGS, Grammar, SamplingParams
from engine.grammar import MAX_GRAMMAR_CHARS, MAX_SCHEMA_DEPTH
from engine.sampling import (MAX_BAD_WORDS, MAX_LOGIT_BIAS, MAX_PROMPT_LOGPROBS, MAX_STOP_TOKEN_IDS)

from .session import MAX_PROMPT_CHARS


@dataclass(frozen=True)
class ApiLimits:
    """What one request (and one client) may ask for; every value is checked before any work."""

    max_body_bytes: int = 1 << 20
    max_prompt_chars: int = MAX_PROMPT_CHARS  # all prompt strings or message texts of one request together
    max_prompt_tokens: int = 4096  # per prompt, after the chat template
    max_tokens: int = 2048  # per choice
    default_chat_tokens: int = 512  # chat without max_tokens (OpenAI's own default is "up to the context")
    default_completion_tokens: int = 16  # OpenAI's default for /v1/completions
    max_choices: int = 8  # prompts x n (the room's per-owner cap on sequences is 8 as well)
    max_messages: int = 64
    max_top_logprobs: int = 20
    max_concurrent_per_client: int = 8
    max_concurrent: int = 32
    # prompt_logprobs (and echo with logprobs) run the LM head over every prompt position: a shorter prompt cap
    max_prompt_logprobs_tokens: int = 1024


class ApiError(Exception):
    """An answer in OpenAI's error format: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.code, self.status, self.kind = message, param, code, status, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Template:
    """How a chat's messages become its prompt: the chat template's own switches (vLLM's names)."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False
    kwargs: tuple[tuple[str, object], ...] = ()  # chat_template_kwargs, as (name, JSON scalar) pairs


@dataclass(frozen=True)
class Prompt:
    """One prompt: a completion's text or token ids, or a chat's messages; `token_ids` filled by `tokenize`."""

    text: str | None = None
    token_ids: tuple[int, ...] | None = None
    messages: tuple[dict, ...] | None = None
    template: Template = Template()


@dataclass(frozen=True)
class Job:
    kind: str  # "chat" or "completion"
    model: str
    prompts: tuple[Prompt, ...]
    n: int
    params: SamplingParams  # max_tokens None until tokenize() knows the prompt's length (a default)
    max_tokens_given: bool
    stream: bool
    include_usage: bool
    logprobs: int | None  # None: no logprobs; else how many alternatives per token (chat: top_logprobs)
    choice_params: tuple[SamplingParams, ...] = field(default=())
    echo: bool = False  # completions: the prompt's text (and, with logprobs, its tokens) before the answer
    return_token_ids: bool = False  # vLLM: prompt_token_ids and each choice's token_ids in the answer
    prompt_logprobs: int | None = None  # vLLM: every prompt token's logprob and this many alternatives
    truncate_prompt_tokens: int | None = None  # vLLM: keep only the prompt's last k tokens (-1: the context)

    def choices(self) -> list[tuple[int, int, SamplingParams]]:
        """(choice index, prompt index, params) for every sequence the job runs; OpenAI numbers the choices
        prompt by prompt, n each. With a seed, choice j of a prompt samples with seed + j (as vLLM does), so
        n > 1 gives n different answers and the same request gives the same n again."""
        out = []
        for p in range(len(self.prompts)):
            for j in range(self.n):
                params = self.choice_params[p]
                if params.seed is not None and j:
                    params = replace(params, seed=_wrap_seed(params.seed + j))
                out.append((p * self.n + j, p, params))
        return out


SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what the engine's generator accepts


def _wrap_seed(seed: int) -> int:
    return seed if seed <= SEED_MAX else SEED_MIN + (seed - SEED_MAX - 1)


# Fields every endpoint takes; then each endpoint's own. "user" and "metadata" are labels that change nothing.
# The vLLM extras are honoured exactly (engine/sampling.py implements them); spaces_between_special_tokens only
# matters for slow tokenizers, and vLLM's fast-tokenizer path (ours: tokenizers' fast BPE) ignores it as well.
VLLM_SAMPLING = {"ignore_eos", "min_tokens", "stop_token_ids", "include_stop_str_in_output", "skip_special_tokens",
                 "spaces_between_special_tokens", "allowed_token_ids", "bad_words", "prompt_logprobs",
                 "truncate_prompt_tokens", "return_token_ids", "logit_bias"}
STRUCTURED = {"response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
              "guided_grammar", "guided_decoding_backend"}
COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "n", "presence_penalty",
          "frequency_penalty", "repetition_penalty", "stream", "stream_options", "user", "metadata", "best_of",
          *VLLM_SAMPLING, *STRUCTURED}
CHAT_FIELDS = COMMON | {"messages", "logprobs", "top_logprobs", "max_completion_tokens", "add_generation_prompt",
                        "continue_final_message", "chat_template_kwargs", "parallel_tool_calls"}
COMPLETION_FIELDS = COMMON | {"prompt", "logprobs", "echo"}
# OpenAI fields we know but do not implement: accepted only with the value that changes nothing.
NEUTRAL = {"tools": ([], None), "tool_choice": ("none", None), "functions": ([], None),
           "function_call": ("none", None), "suffix": ("", None), "store": (False, None),
           "service_tier": (None, "auto", "default"), "modalities": (["text"], None), "echo": (False, None)}
CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
FINISH = {"eos": "stop", "stop": "stop", "grammar": "stop", "length": "length", "abort": "abort"}
MAX_METADATA = 16  # OpenAI's limits on metadata: 16 pairs, keys of 64 characters, values of 512
MAX_TEMPLATE_KWARGS = 16
# apply_chat_template's own parameters: chat_template_kwargs may not set them (vLLM keeps them apart as well)
TEMPLATE_RESERVED = {"conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
                     "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors",
                     "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs"}


def parse_chat(body, limits: ApiLimits, vocab_size: int) -> Job:
    body = _object(body)
    _known(body, CHAT_FIELDS)
    if body.get("parallel_tool_calls") is not None:
        _bool(body, "parallel_tool_calls", True)  # without tools (refused above unless empty) it changes nothing
    messages = _messages(body.get("messages"), limits)
    template = _template(body, messages)
    logprobs = _bool(body, "logprobs", False)
    top = _int(body, "top_logprobs", 0, limits.max_top_logprobs, None)
    if top is not None and not logprobs:
        raise ApiError("top_logprobs needs logprobs: true", "top_logprobs")
    if body.get("max_tokens") is not None and body.get("max_completion_tokens") is not None:
        raise ApiError("give max_tokens or max_completion_tokens, not both", "max_completion_tokens")
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    return _job("chat", body, (Prompt(messages=messages, template=template),), limits, vocab_size, key,
                limits.default_chat_tokens, (top or 0) if logprobs else None)


def parse_completion(body, limits: ApiLimits, vocab_size: int) -> Job:
    body = _object(body)
    _known(body, COMPLETION_FIELDS)
    prompts = _prompts(body.get("prompt"), limits, vocab_size)
    logprobs = _int(body, "logprobs", 0, limits.max_top_logprobs, None)
    job = _job("completion", body, prompts, limits, vocab_size, "max_tokens", limits.default_completion_tokens,
               logprobs)
    echo = _bool(body, "echo", False)
    if echo and logprobs is not None:
        # OpenAI's echo with logprobs lists the prompt's tokens too: the engine computes the prompt's logprobs
        k = max(logprobs, job.params.prompt_logprobs or 0)
        job = replace(job, params=replace(job.params, prompt_logprobs=k))
    return replace(job, echo=echo)


def _job(kind, body, prompts, limits, vocab_size, tokens_key, default_tokens, logprobs) -> Job:
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise ApiError("model is required: the name GET /v1/models lists", "model")
    n = _int(body, "n", 1, limits.max_choices, 1)
    if n * len(prompts) > limits.max_choices:
        raise ApiError(f"prompts x n must be at most {limits.max_choices} (got {len(prompts)} x {n})", "n")
    max_tokens = _int(body, tokens_key, 1, limits.max_tokens, None)
    stream = _bool(body, "stream", False)
    include_usage = _stream_options(body, stream)
    top_k = _int(body, "top_k", -1, vocab_size, 0)
    best_of = _int(body, "best_of", 1, limits.max_choices, None)
    if best_of is not None and best_of != n:
        # best_of > n would rank answers by likelihood and return the best: not implemented, so refused by name
        raise ApiError(f"best_of is supported only equal to n ({n}); got {best_of}", "best_of",
                       "unsupported_parameter")
    _metadata(body.get("metadata"))
    max_tokens_value = max_tokens or default_tokens
    prompt_logprobs = _int(body, "prompt_logprobs", 0, MAX_PROMPT_LOGPROBS, None)
    truncate = body.get("truncate_prompt_tokens")
    if truncate is not None and not (type(truncate) is int and truncate == -1):  # -1: as much as the context holds
        truncate = _int(body, "truncate_prompt_tokens", 1, limits.max_prompt_tokens, None)
    params = SamplingParams(
        max_tokens=max_tokens or default_tokens,
        temperature=_number(body, "temperature", 0.0, 2.0, 1.0),
        top_p=_number(body, "top_p", 0.0, 1.0, 1.0, low_open=True),
        top_k=max(0, top_k),  # -1 (vLLM's "off") and 0 are both off
        min_p=_number(body, "min_p", 0.0, 1.0, 0.0),
        presence_penalty=_number(body, "presence_penalty", -2.0, 2.0, 0.0),
        frequency_penalty=_number(body, "frequency_penalty", -2.0, 2.0, 0.0),
        repetition_penalty=_number(body, "repetition_penalty", 0.0, 10.0, 1.0, low_open=True),
        seed=_int(body, "seed", SEED_MIN, SEED_MAX, None),
        stop=_stop(body.get("stop")),
        ignore_eos=_bool(body, "ignore_eos", False),
        min_tokens=_int(body, "min_tokens", 0, max_tokens_value, 0),
        stop_token_ids=_token_ids(body, "stop_token_ids", vocab_size, MAX_STOP_TOKEN_IDS) or (),
        include_stop_str_in_output=_bool(body, "include_stop_str_in_output", False),
        skip_special_tokens=_bool(body, "skip_special_tokens", True),
        logit_bias=_logit_bias(body.get("logit_bias"), vocab_size),
        allowed_token_ids=_token_ids(body, "allowed_token_ids", vocab_size, vocab_size, empty_ok=False),
        bad_words=_bad_words(body.get("bad_words")),
        prompt_logprobs=prompt_logprobs,
        grammar=_structured(body))
    _bool(body, "spaces_between_special_tokens", True)  # checked; see VLLM_SAMPLING
    return Job(kind=kind, model=model, prompts=prompts, n=n, params=params, max_tokens_given=max_tokens is not None,
               stream=stream, include_usage=include_usage, logprobs=logprobs,
               return_token_ids=_bool(body, "return_token_ids", False), prompt_logprobs=prompt_logprobs,
               truncate_prompt_tokens=truncate)


# POST /tokenize, in vLLM's shape (a small extension of the API: attach mode reads it when a server's tokenizer
# cannot be loaded on the attaching machine): {"prompt"} as-is, or {"messages"} through the chat template.
TOKENIZE_FIELDS = {"model", "prompt", "messages", "add_generation_prompt", "add_special_tokens", "return_token_strs"}


def parse_tokenize(body, limits: ApiLimits) -> tuple[str | None, Prompt, bool, bool]:
    """(model or None, the prompt, add_generation_prompt, return_token_strs), checked as a chat body is."""
    body = _object(body)
    _known(body, TOKENIZE_FIELDS)
    model = body.get("model")
    if model is not None and (not isinstance(model, str) or not model.strip()):
        raise ApiError("model must be the name GET /v1/models lists", "model")
    if ("prompt" in body) == ("messages" in body):
        raise ApiError("give either prompt (a string) or messages", "prompt")
    if "messages" in body:
        prompt = Prompt(messages=_messages(body["messages"], limits))
    else:
        prompt = Prompt(text=_text(body["prompt"], "prompt", [limits.max_prompt_chars]))
    _bool(body, "add_special_tokens", False)  # checked, and neutral: SmolLM-style tokenizers add none
    return model, prompt, _bool(body, "add_generation_prompt", True), _bool(body, "return_token_strs", False)


# ---- tokens -----------------------------------------------------------------------------------------------
def tokenize(job: Job, engine, limits: ApiLimits) -> Job:
    """The job with every prompt's token ids (chat: through the model's own chat template) and each prompt's
    max_tokens settled: a default shrinks to what the context leaves, an explicit one past it is refused."""
    tok = engine.tokenizer
    context = engine.max_model_len
    prompts, params = [], []
    for i, p in enumerate(job.prompts):
        if p.messages is not None:
            text = render_chat(tok, p.messages, p.template)
            ids = tuple(tok(text, add_special_tokens=False)["input_ids"])
        elif p.text is not None:
            text = p.text
            ids = tuple(engine.encode(p.text, chat=False).token_ids)
        else:
            text, ids = "", p.token_ids
        param = "messages" if p.messages is not None else "prompt"
        if not ids:
            raise ApiError("the prompt is empty after tokenizing", param)
        if job.truncate_prompt_tokens is not None:  # vLLM keeps the prompt's end (-1: as much as the context holds)
            keep = context - 1 if job.truncate_prompt_tokens == -1 else job.truncate_prompt_tokens
            if keep > context - 1:
                raise ApiError(f"truncate_prompt_tokens ({keep}) must be below the model's context of {context}",
                               "truncate_prompt_tokens", "invalid_value")
            if len(ids) > keep:
                ids = ids[-keep:]
                text = ""  # the text no longer matches the ids: the engine and echo show the ids' own text
        if job.params.prompt_logprobs is not None and len(ids) > limits.max_prompt_logprobs_tokens:
            raise ApiError(f"prompt_logprobs runs the LM head over every prompt token: the prompt is {len(ids)} "
                           f"tokens, this server takes at most {limits.max_prompt_logprobs_tokens} for it",
                           "prompt_logprobs", "context_length_exceeded")
        limit = min(limits.max_prompt_tokens, context - 1)
        if len(ids) > limit:
            raise ApiError(f"the prompt is {len(ids)} tokens; this server takes at most {limit}", param,
                           "context_length_exceeded")
        room = context - len(ids)
        if job.max_tokens_given and job.params.max_tokens > room:
            raise ApiError(f"this model's context is {context} tokens; the prompt takes {len(ids)} and "
                           f"max_tokens asks for {job.params.max_tokens} more", "max_tokens",
                           "context_length_exceeded")
        prompts.append(replace(p, text=text, token_ids=ids))
        max_tokens = min(job.params.max_tokens, room)
        params.append(replace(job.params, max_tokens=max_tokens, min_tokens=min(job.params.min_tokens, max_tokens)))
    return replace(job, prompts=tuple(prompts), choice_params=tuple(params))


def render_chat(tok, messages, template: Template) -> str:
    """The chat's prompt text through the model's own chat template, with the request's template switches."""
    try:
        return tok.apply_chat_template(list(messages), tokenize=False,
                                       add_generation_prompt=template.add_generation_prompt,
                                       continue_final_message=template.continue_final_message,
                                       **dict(template.kwargs))
    except Exception as exc:  # noqa: BLE001 - a template's own raise_exception() or a jinja error: the request's fault
        raise ApiError(f"the model's chat template refused these messages: {str(exc)[:300]}", "messages",
                       "invalid_value") from None


# ---- fields -----------------------------------------------------------------------------------------------
def _object(body) -> dict:
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    return body


def _known(body: dict, allowed: set[str]) -> None:
    for name, value in body.items():
        if name in allowed:
            continue
        if name in NEUTRAL:
            if value in NEUTRAL[name]:
                continue
            raise ApiError(f"{name} is not supported by this server (only {NEUTRAL[name][0]!r})", name,
                           "unsupported_parameter")
        raise ApiError(f"unknown field {name!r}", str(name)[:64], "unknown_parameter")


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _number(body: dict, name: str, low: float, high: float, default: float, low_open: bool = False) -> float:
    v = body.get(name)
    if v is None:
        return default
    if not _is_number(v) or not math.isfinite(v):
        raise ApiError(f"{name} must be a number", name, "invalid_type")
    if not ((low < v) if low_open else (low <= v)) or v > high:
        raise ApiError(f"{name} must be in {'(' if low_open else '['}{low:g}, {high:g}] (got {v!r})", name,
                       "invalid_value")
    return float(v)


def _int(body: dict, name: str, low: int, high: int, default: int | None) -> int | None:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, float) and v.is_integer() and abs(v) < 2**53:
        v = int(v)
    if not isinstance(v, int) or isinstance(v, bool):
        raise ApiError(f"{name} must be an integer", name, "invalid_type")
    if not low <= v <= high:
        raise ApiError(f"{name} must be in [{low}, {high}] (got {v})", name, "invalid_value")
    return v


def _bool(body: dict, name: str, default: bool) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ApiError(f"{name} must be true or false", name, "invalid_type")
    return v


def _stream_options(body: dict, stream: bool) -> bool:
    opts = body.get("stream_options")
    if opts is None:
        return False
    if not stream:
        raise ApiError("stream_options is only allowed with stream: true", "stream_options")
    if not isinstance(opts, dict):
        raise ApiError("stream_options must be an object", "stream_options", "invalid_type")
    unknown = sorted(set(opts) - {"include_usage"})
    if unknown:
        raise ApiError(f"unknown stream option {unknown[0]!r}", "stream_options", "unknown_parameter")
    return _bool(opts, "include_usage", False)


def _stop(v) -> tuple[str, ...]:
    if v is None:
        return ()
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise ApiError("stop must be a string or a list of strings", "stop", "invalid_type")
    if len(stops) > MAX_STOP_STRINGS:
        raise ApiError(f"stop takes at most {MAX_STOP_STRINGS} strings", "stop", "invalid_value")
    for s in stops:
        if not s or len(s) > MAX_STOP_CHARS:
            raise ApiError(f"each stop string must have 1 to {MAX_STOP_CHARS} characters", "stop", "invalid_value")
        _unicode(s, "stop")
    return tuple(stops)


def _text(v, name: str, budget: list[int]) -> str:
    """A string counted against the request's prompt-character budget (budget[0]: what is left)."""
    if not isinstance(v, str):
        raise ApiError(f"{name} must be a string", name, "invalid_type")
    budget[0] -= len(v)
    if budget[0] < 0:
        raise ApiError("the prompt text is too long for this server", name, "context_length_exceeded")
    return _unicode(v, name)


def _unicode(v: str, name: str) -> str:
    """JSON can carry a lone surrogate ("\\ud800"); the tokenizer cannot read one."""
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ApiError(f"{name} is not valid Unicode (a lone surrogate at index {exc.start})", name,
                       "invalid_value") from None
    return v


def _messages(v, limits: ApiLimits) -> tuple[dict, ...]:
    if not isinstance(v, list) or not v:
        raise ApiError("messages must be a non-empty list", "messages", "invalid_type")
    if len(v) > limits.max_messages:
        raise ApiError(f"at most {limits.max_messages} messages", "messages", "invalid_value")
    budget, out = [limits.max_prompt_chars], []
    for i, m in enumerate(v):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ApiError(f"{where} must be an object", where, "invalid_type")
        extra = sorted(set(m) - {"role", "content", "name"})
        if extra:
            raise ApiError(f"{where}.{extra[0]} is not supported by this server (text messages only)", where,
                           "unsupported_parameter")
        role = CHAT_ROLES.get(m.get("role"))
        if role is None:
            raise ApiError(f"{where}.role must be one of {', '.join(CHAT_ROLES)}", where, "invalid_value")
        if m.get("name") is not None:
            _text(m["name"], f"{where}.name", budget)
        out.append({"role": role, "content": _content(m.get("content"), where, budget)})
    return tuple(out)


def _content(c, where: str, budget: list[int]) -> str:
    if isinstance(c, str):
        return _text(c, f"{where}.content", budget)
    if isinstance(c, list) and c:
        parts = []
        for part in c:
            if not isinstance(part, dict) or part.get("type") != "text" or set(part) - {"type", "text"}:
                raise ApiError(f"{where}.content: only text parts are supported", where, "unsupported_parameter")
            parts.append(_text(part.get("text"), f"{where}.content", budget))
        return "".join(parts)
    raise ApiError(f"{where}.content must be a string or a list of text parts", where, "invalid_type")


def _template(body: dict, messages: tuple[dict, ...]) -> Template:
    generation = _bool(body, "add_generation_prompt", True)
    continue_final = _bool(body, "continue_final_message", False)
    if generation and continue_final:
        raise ApiError("continue_final_message needs add_generation_prompt: false (the answer continues the last "
                       "message instead of starting a new one)", "continue_final_message", "invalid_value")
    if continue_final and messages[-1]["role"] != "assistant":
        raise ApiError("continue_final_message continues the last message, which must be the assistant's",
                       "continue_final_message", "invalid_value")
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        return Template(generation, continue_final)
    if not isinstance(kwargs, dict):
        raise ApiError("chat_template_kwargs must be an object", "chat_template_kwargs", "invalid_type")
    if len(kwargs) > MAX_TEMPLATE_KWARGS:
        raise ApiError(f"chat_template_kwargs takes at most {MAX_TEMPLATE_KWARGS} entries", "chat_template_kwargs",
                       "invalid_value")
    pairs = []
    for k, v in kwargs.items():
        if not k.isidentifier() or len(k) > 64 or k.startswith("_"):
            raise ApiError(f"chat_template_kwargs: {k[:64]!r} is not a template variable name",
                           "chat_template_kwargs", "invalid_value")
        if k in TEMPLATE_RESERVED:
            raise ApiError(f"chat_template_kwargs may not set {k!r} (a field of its own, or not the template's)",
                           "chat_template_kwargs", "invalid_value")
        # scalars only: a template reads flags like enable_thinking; nested values would be a way to smuggle size
        if not (v is None or isinstance(v, (bool, int, float)) or (isinstance(v, str) and len(v) <= 256)):
            raise ApiError(f"chat_template_kwargs.{k} must be a number, a bool, null or a string of at most 256 "
                           "characters", "chat_template_kwargs", "invalid_value")
        pairs.append((k, v))
    return Template(generation, continue_final, tuple(pairs))


def _metadata(v) -> None:
    """OpenAI's metadata (labels for the caller's own bookkeeping): checked to its documented limits, unused."""
    if v is None:
        return
    if not isinstance(v, dict) or len(v) > MAX_METADATA or not all(
            isinstance(k, str) and isinstance(x, str) and len(k) <= 64 and len(x) <= 512 for k, x in v.items()):
        raise ApiError(f"metadata must be an object of at most {MAX_METADATA} string pairs (keys up to 64 "
                       "characters, values up to 512)", "metadata", "invalid_value")


def _token_ids(body: dict, name: str, vocab_size: int, cap: int, empty_ok: bool = True) -> tuple[int, ...] | None:
    v = body.get(name)
    if v is None:
        return None
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise ApiError(f"{name} must be a list of token ids", name, "invalid_type")
    if len(v) > cap or (not v and not empty_ok):
        raise ApiError(f"{name} must hold {0 if empty_ok else 1} to {cap} token ids", name, "invalid_value")
    if any(not 0 <= x < vocab_size for x in v):
        raise ApiError(f"{name}: token ids must be in [0, {vocab_size})", name, "invalid_value")
    return tuple(v)


def _logit_bias(v, vocab_size: int) -> dict[int, float]:
    """OpenAI's logit_bias: {"token id": bias in [-100, 100]} (JSON keys are strings)."""
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ApiError("logit_bias must be an object of token id -> bias", "logit_bias", "invalid_type")
    if len(v) > MAX_LOGIT_BIAS:
        raise ApiError(f"logit_bias takes at most {MAX_LOGIT_BIAS} tokens", "logit_bias", "invalid_value")
    out = {}
    for k, b in v.items():
        if not (isinstance(k, str) and k.isdigit() and len(k) < 10 and int(k) < vocab_size):
            raise ApiError(f"logit_bias: {str(k)[:20]!r} is not a token id in [0, {vocab_size})", "logit_bias",
                           "invalid_value")
        if not _is_number(b) or not -100 <= b <= 100:
            raise ApiError("logit_bias: each bias must be a number in [-100, 100]", "logit_bias", "invalid_value")
        out[int(k)] = float(b)
    return out


def _bad_words(v) -> tuple[str, ...]:
    if v is None:
        return ()
    if not isinstance(v, list) or not all(isinstance(w, str) and w.strip() and len(w) <= 256 for w in v) \
            or len(v) > MAX_BAD_WORDS:
        raise ApiError(f"bad_words must be a list of at most {MAX_BAD_WORDS} non-blank strings of up to 256 "
                       "characters", "bad_words", "invalid_value")
    return tuple(_unicode(w, "bad_words") for w in v)


# structured outputs: vLLM's structured_outputs keys (and the older guided_* fields) -> Grammar constructors
GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
STRUCTURED_KEYS = {"json", "regex", "choice", "grammar", "json_object"}
# keys that only pick an implementation or a fallback: the constraint itself is the same, so they change nothing
STRUCTURED_NEUTRAL = {"backend", "disable_fallback", "disable_any_whitespace"}
ANY_JSON_OBJECT = {"type": "object"}  # OpenAI's json_object mode: "the message is a valid JSON object"


def _structured(body: dict) -> Grammar | None:
    """One Grammar from whichever structured-output field the request uses (at most one may be given)."""
    given = []
    rf = body.get("response_format")
    if rf is not None and rf != {"type": "text"}:
        given.append(("response_format", _response_format(rf)))
    so = body.get("structured_outputs")
    if so is not None:
        given.append(("structured_outputs", _structured_outputs(so, "structured_outputs")))
    for field_name, key in GUIDED.items():
        if body.get(field_name) is not None:
            given.append((field_name, _grammar(key, body[field_name], field_name)))
    backend = body.get("guided_decoding_backend")
    if backend is not None and (not isinstance(backend, str) or len(backend) > 64):
        raise ApiError("guided_decoding_backend must be a backend's name", "guided_decoding_backend", "invalid_type")
    if len(given) > 1:
        raise ApiError(f"give one structured-output constraint, not {len(given)} ({', '.join(n for n, _ in given)})",
                       given[1][0], "invalid_value")
    return given[0][1] if given else None


def _response_format(rf) -> Grammar:
    if not isinstance(rf, dict) or not isinstance(rf.get("type"), str):
        raise ApiError("response_format must be an object with a type", "response_format", "invalid_type")
    kind = rf["type"]
    if kind == "json_object" and set(rf) == {"type"}:
        return _grammar("json", ANY_JSON_OBJECT, "response_format")
    if kind == "json_schema":
        spec = rf.get("json_schema")
        if not isinstance(spec, dict) or set(rf) != {"type", "json_schema"}:
            raise ApiError("response_format json_schema needs {\"type\": \"json_schema\", \"json_schema\": "
                           "{\"name\", \"schema\", ...}}", "response_format", "invalid_value")
        extra = sorted(set(spec) - {"name", "schema", "strict", "description"})
        if extra:
            raise ApiError(f"response_format.json_schema.{extra[0]} is not a field of json_schema", "response_format",
                           "unknown_parameter")
        name = spec.get("name")
        if not isinstance(name, str) or not 1 <= len(name) <= 64:
            raise ApiError("response_format.json_schema.name must be a string of 1 to 64 characters",
                           "response_format", "invalid_value")
        if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
            raise ApiError("response_format.json_schema.strict must be true or false", "response_format",
                           "invalid_type")
        # strict or not, the output is held to the schema: the grammar admits nothing else
        return _grammar("json", spec.get("schema", {}), "response_format")
    raise ApiError(f"response_format type {kind[:40]!r} is not supported (text, json_object, json_schema)",
                   "response_format", "unsupported_parameter")


def _structured_outputs(so, where: str) -> Grammar:
    if not isinstance(so, dict):
        raise ApiError(f"{where} must be an object", where, "invalid_type")
    unknown = sorted(set(so) - STRUCTURED_KEYS - STRUCTURED_NEUTRAL)
    if unknown:
        raise ApiError(f"{where}.{unknown[0][:40]} is not supported by this server (json, regex, choice, grammar, "
                       "json_object)", where, "unsupported_parameter")
    keys = [k for k in STRUCTURED_KEYS if so.get(k) not in (None, False)]
    if len(keys) != 1:
        raise ApiError(f"{where} takes exactly one of json, regex, choice, grammar, json_object", where,
                       "invalid_value")
    if keys[0] == "json_object":
        if so["json_object"] is not True:
            raise ApiError(f"{where}.json_object must be true", where, "invalid_type")
        return _grammar("json", ANY_JSON_OBJECT, where)
    return _grammar(keys[0], so[keys[0]], where)


def _grammar(key: str, value, where: str) -> Grammar:
    """The engine's Grammar for one constraint; its own checks (size, nesting, llguidance's validation) speak."""
    try:
        if key == "json":
            if isinstance(value, str) and len(value) <= MAX_GRAMMAR_CHARS:  # a schema as JSON text (vLLM allows it)
                try:
                    value = json.loads(value)
                except (ValueError, RecursionError):
                    pass  # Grammar.json_schema says what is wrong with it
            return Grammar.json_schema(_closed(value) if value is not ANY_JSON_OBJECT else value)
        if key == "choice":
            return Grammar.choice(value)
        if not isinstance(value, str):
            raise ApiError(f"{where}: {key} must be a string", where, "invalid_type")
        return Grammar.regex(value) if key == "regex" else Grammar.ebnf(value)
    except ApiError:
        raise
    except (TypeError, ValueError) as exc:
        raise ApiError(f"{where}: {str(exc)[:400]}", where, "invalid_value") from None


_SCHEMA_DATA = {"const", "enum", "default", "examples"}
_SCHEMA_MAPS = {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}


def _closed(schema, depth: int = 0):
    """The schema with `additionalProperties: false` on every object that lists its properties and says nothing
    of others. JSON Schema allows extra keys by default, and a small model takes them ({"name", "age",
    "skills": [...]} for "name, age"); vLLM's default structured-output backend (xgrammar's strict mode) admits
    only the listed properties, and OpenAI's strict schemas say so explicitly. Deeper than the grammar's nesting
    limit it stops: Grammar.json_schema refuses such a schema anyway."""
    if depth > MAX_SCHEMA_DEPTH:
        return schema
    if isinstance(schema, list):
        return [_closed(x, depth + 1) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for k, v in schema.items():
        if k in _SCHEMA_DATA:
            out[k] = v  # values, not schemas
        elif k in _SCHEMA_MAPS and isinstance(v, dict):  # name -> schema: a property may be named "properties"
            out[k] = {name: _closed(sub, depth + 1) for name, sub in v.items()}
        else:
            out[k] = _closed(v, depth + 1)
    if isinstance(out.get("properties"), dict) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _prompts(v, limits: ApiLimits, vocab_size: int) -> tuple[Prompt, ...]:
    """A string, a list of strings, a list of token ids, or a list of lists of token ids."""
    budget = [limits.max_prompt_chars]
    if isinstance(v, str):
        return (Prompt(text=_text(v, "prompt", budget)),)
    if isinstance(v, list) and v:
        if all(isinstance(x, str) for x in v):
            items = [Prompt(text=_text(x, "prompt", budget)) for x in v]
        elif all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            items = [Prompt(token_ids=_ids(v, vocab_size, limits))]
        elif all(isinstance(x, list) for x in v):
            items = [Prompt(token_ids=_ids(x, vocab_size, limits)) for x in v]
        else:
            items = []
        if items:
            if len(items) > limits.max_choices:
                raise ApiError(f"at most {limits.max_choices} prompts", "prompt", "invalid_value")
            return tuple(items)
    raise ApiError("prompt must be a string, a list of strings, or token ids", "prompt", "invalid_type")


def _ids(v: list, vocab_size: int, limits: ApiLimits) -> tuple[int, ...]:
    if not v or len(v) > limits.max_prompt_tokens:
        raise ApiError(f"a token-id prompt must hold 1 to {limits.max_prompt_tokens} ids", "prompt", "invalid_value")
    if not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < vocab_size for x in v):
        raise ApiError(f"token ids must be integers in [0, {vocab_size})", "prompt", "invalid_value")
    return tuple(v)
