"""OpenAI request bodies -> typed jobs for the room's engine, every field checked before any tokenizer work.

`parse_chat` and `parse_completion` read a decoded JSON body and return a `Job` (or raise `ApiError`, whose
`body()` is OpenAI's error object); `tokenize` then turns the job's prompts into token ids with the engine's
own tokenizer and chat template. Nothing here touches the engine's state.

Fields follow OpenAI's API (names, types, ranges), plus the sampling fields vLLM and SGLang added (`top_k`,
`min_p`, `repetition_penalty`). A field we do not know, or know but do not implement with a value that would
change the answer (`tools`, `logit_bias`, `echo`, ...), is refused by name: a client must not be silently
given something other than what it asked for.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from engine import MAX_STOP_CHARS, MAX_STOP_STRINGS, SamplingParams

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


class ApiError(Exception):
    """An answer in OpenAI's error format: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.code, self.status, self.kind = message, param, code, status, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Prompt:
    """One prompt: a completion's text or token ids, or a chat's messages; `token_ids` filled by `tokenize`."""

    text: str | None = None
    token_ids: tuple[int, ...] | None = None
    messages: tuple[dict, ...] | None = None


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


# Fields every endpoint takes; then each endpoint's own. "user" is metadata that changes nothing.
COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "n", "presence_penalty",
          "frequency_penalty", "repetition_penalty", "stream", "stream_options", "user"}
CHAT_FIELDS = COMMON | {"messages", "logprobs", "top_logprobs", "max_completion_tokens"}
COMPLETION_FIELDS = COMMON | {"prompt", "logprobs"}
# OpenAI fields we know but do not implement: accepted only with the value that changes nothing.
NEUTRAL = {"logit_bias": ({}, None), "response_format": ({"type": "text"}, None), "tools": ([], None),
           "tool_choice": ("none", None), "parallel_tool_calls": (None,), "functions": ([], None),
           "function_call": ("none", None), "echo": (False, None), "suffix": ("", None), "best_of": (1, None),
           "store": (False, None), "metadata": (None,), "service_tier": (None, "auto", "default"),
           "modalities": (["text"], None)}
CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
FINISH = {"eos": "stop", "stop": "stop", "length": "length", "abort": "abort"}


def parse_chat(body, limits: ApiLimits, vocab_size: int) -> Job:
    body = _object(body)
    _known(body, CHAT_FIELDS)
    messages = _messages(body.get("messages"), limits)
    logprobs = _bool(body, "logprobs", False)
    top = _int(body, "top_logprobs", 0, limits.max_top_logprobs, None)
    if top is not None and not logprobs:
        raise ApiError("top_logprobs needs logprobs: true", "top_logprobs")
    if body.get("max_tokens") is not None and body.get("max_completion_tokens") is not None:
        raise ApiError("give max_tokens or max_completion_tokens, not both", "max_completion_tokens")
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    return _job("chat", body, (Prompt(messages=messages),), limits, vocab_size, key,
                limits.default_chat_tokens, (top or 0) if logprobs else None)


def parse_completion(body, limits: ApiLimits, vocab_size: int) -> Job:
    body = _object(body)
    _known(body, COMPLETION_FIELDS)
    prompts = _prompts(body.get("prompt"), limits, vocab_size)
    logprobs = _int(body, "logprobs", 0, limits.max_top_logprobs, None)
    return _job("completion", body, prompts, limits, vocab_size, "max_tokens", limits.default_completion_tokens,
                logprobs)


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
        stop=_stop(body.get("stop")))
    return Job(kind=kind, model=model, prompts=prompts, n=n, params=params, max_tokens_given=max_tokens is not None,
               stream=stream, include_usage=include_usage, logprobs=logprobs)


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
            text = tok.apply_chat_template(list(p.messages), tokenize=False, add_generation_prompt=True)
            ids = tuple(tok(text, add_special_tokens=False)["input_ids"])
        elif p.text is not None:
            text = p.text
            ids = tuple(engine.encode(p.text, chat=False).token_ids)
        else:
            text, ids = "", p.token_ids
        param = "messages" if p.messages is not None else "prompt"
        if not ids:
            raise ApiError("the prompt is empty after tokenizing", param)
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
        params.append(replace(job.params, max_tokens=min(job.params.max_tokens, room)))
    return replace(job, prompts=tuple(prompts), choice_params=tuple(params))


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
