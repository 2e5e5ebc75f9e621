"""One API request's answer in OpenAI's shapes: whole (`Reply.whole`) or as server-sent events (`Reply.events`).

`Reply` gathers the run's deltas (app/openai_run.py: one per sampled token, with its text, its id, its
log-probabilities when asked for, and the prompt log-probabilities that came with the choice's first token) and
writes them as OpenAI writes them, with vLLM's additions where the request asked for them:
`return_token_ids` (prompt_token_ids and each choice's token_ids), `prompt_logprobs` (per prompt position None or
{token id: {logprob, rank, decoded_token}}) and completions' `echo` (the prompt's text, and with logprobs its
tokens, before the answer).
"""
from __future__ import annotations

import json
import secrets
import time

from .openai_run import Delta, RoomRun, TokenInfo
from .openai_schema import ApiError, Job


class Reply:
    def __init__(self, job: Job, model: str, run: RoomRun):
        self.job, self.model, self.run = job, model, run
        self.chat = job.kind == "chat"
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + secrets.token_hex(12)
        self.created = int(time.time())
        count = len(job.prompts) * job.n
        self.text = [""] * count
        self.tokens = [[] for _ in range(count)]  # (TokenInfo, top alternatives) per token, with logprobs
        self.token_ids = [[] for _ in range(count)]
        self.prompt_lp = [[] for _ in range(count)]  # PromptLogprob records, position order
        self.finish = [None] * count
        self._started = [False] * count  # streamed: whether the choice's first chunk went out

    # ---- gathering ------------------------------------------------------------------------------------------
    def add(self, deltas: list[Delta]) -> None:
        for d in deltas:
            self.text[d.index] += d.text
            self.token_ids[d.index].append(d.token_id)
            self.prompt_lp[d.index].extend(d.prompt)
            if d.token is not None:
                self.tokens[d.index].append((d.token, d.top))
            if d.finish_reason:
                self.finish[d.index] = d.finish_reason

    def _prompt(self, index: int):
        return self.job.prompts[index // self.job.n]

    def _echo_text(self, index: int) -> str:
        """The prompt as text (a token-id or truncated prompt: its ids decoded, as vLLM echoes them)."""
        p = self._prompt(index)
        return p.text or self.run.engine.tokenizer.decode(list(p.token_ids))

    def usage(self) -> dict:
        done = sum(self.run.tokens)
        return {"prompt_tokens": self.run.prompt_tokens, "completion_tokens": done,
                "total_tokens": self.run.prompt_tokens + done}

    # ---- the whole answer -----------------------------------------------------------------------------------
    def whole(self) -> dict:
        job, choices = self.job, []
        for i, text in enumerate(self.text):
            if self.chat:
                lp = self._chat_logprobs(self.tokens[i]) if job.logprobs is not None else None
                choice = {"index": i, "message": {"role": "assistant", "content": text}, "logprobs": lp,
                          "finish_reason": self.finish[i]}
            else:
                echo = self._echo_text(i) if job.echo else ""
                lp = None
                if job.logprobs is not None:
                    lp = self._completion_logprobs(self._echo_entries(i) if job.echo else [], self.tokens[i], 0)
                choice = {"index": i, "text": echo + text, "logprobs": lp, "finish_reason": self.finish[i]}
                if job.prompt_logprobs is not None:
                    choice["prompt_logprobs"] = self._vllm_prompt_logprobs(i)
                if job.return_token_ids:
                    choice["prompt_token_ids"] = list(self._prompt(i).token_ids)
            if job.return_token_ids:
                choice["token_ids"] = self.token_ids[i]
            choices.append(choice)
        out = {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
               "created": self.created, "model": self.model, "choices": choices, "usage": self.usage()}
        if self.chat and job.return_token_ids:
            out["prompt_token_ids"] = list(job.prompts[0].token_ids)
        if self.chat and job.prompt_logprobs is not None:
            out["prompt_logprobs"] = self._vllm_prompt_logprobs(0)
        return out

    # ---- log-probabilities ----------------------------------------------------------------------------------
    def _chat_logprobs(self, tokens) -> dict:
        return {"content": [dict(_entry(t), top_logprobs=[_entry(x) for x in top]) for t, top in tokens]}

    def _echo_entries(self, index: int) -> list[tuple[TokenInfo, tuple[TokenInfo, ...]]]:
        """The prompt's tokens as logprob entries (the first has none: nothing predicts it)."""
        entries = []
        for r in self.prompt_lp[index]:
            top = tuple(self.run.info(t, lp) for t, lp in zip(r.top_ids, r.top_logprobs))
            entries.append((self.run.info(r.token_id, r.logprob), top))
        return entries

    def _completion_logprobs(self, echoed, tokens, offset: int) -> dict:
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for n, (t, top) in enumerate((*echoed, *tokens)):
            out["tokens"].append(t.text)
            out["token_logprobs"].append(t.logprob)
            first = n == 0 and bool(echoed)  # OpenAI: the prompt's first token has no logprob and no alternatives
            out["top_logprobs"].append(None if first else {x.text: x.logprob for x in (*top, t)})
            out["text_offset"].append(offset)
            offset += len(t.text)
        return out

    def _vllm_prompt_logprobs(self, index: int) -> list:
        out = []
        for r in self.prompt_lp[index]:
            if r.logprob is None:
                out.append(None)
                continue
            entry = {str(r.token_id): {"logprob": r.logprob, "rank": r.rank,
                                       "decoded_token": self.run.info(r.token_id, None).text}}
            for rank, (t, lp) in enumerate(zip(r.top_ids, r.top_logprobs), start=1):
                entry.setdefault(str(t), {"logprob": lp, "rank": rank, "decoded_token": self.run.info(t, None).text})
            out.append(entry)
        return out

    # ---- streaming --------------------------------------------------------------------------------------
    def _chunk(self, choices: list[dict], usage=None, **top) -> str:
        data = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": choices, **top}
        if self.job.include_usage:
            data["usage"] = usage
        return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"

    def _delta_choice(self, d: Delta) -> dict:
        job, lp = self.job, None
        if job.logprobs is not None and d.token is not None:
            if self.chat:
                lp = self._chat_logprobs([(d.token, d.top)])
            else:
                lp = self._completion_logprobs([], [(d.token, d.top)], self._offset(d))
        if self.chat:
            delta = {"content": d.text} if d.text or not d.finish_reason else {}
            choice = {"index": d.index, "delta": delta, "logprobs": lp, "finish_reason": d.finish_reason}
        else:
            choice = {"index": d.index, "text": d.text, "logprobs": lp, "finish_reason": d.finish_reason}
        if job.return_token_ids:
            choice["token_ids"] = [d.token_id]
        return choice

    def _offset(self, d: Delta) -> int:
        """Where the delta's text starts in the choice's whole text (the echoed prompt included)."""
        echo = len(self._echo_text(d.index)) if self.job.echo else 0
        return echo + len(self.text[d.index]) - len(d.text)

    def _first_chunks(self, d: Delta) -> list[str]:
        """What goes out before a completion choice's first token: its echo (text and, with logprobs, the prompt's
        tokens) or, where asked, its prompt_token_ids and prompt_logprobs on the first token's own chunk."""
        job = self.job
        extra = {}
        if job.return_token_ids:
            extra["prompt_token_ids"] = list(self._prompt(d.index).token_ids)
        if job.prompt_logprobs is not None:
            extra["prompt_logprobs"] = self._vllm_prompt_logprobs(d.index)
        if not job.echo:
            return [], extra
        lp = None
        if job.logprobs is not None:
            lp = self._completion_logprobs(self._echo_entries(d.index), [], 0)
        choice = {"index": d.index, "text": self._echo_text(d.index), "logprobs": lp, "finish_reason": None, **extra}
        return [self._chunk([choice])], {}

    async def events(self):
        """Server-sent events: (chat) each choice's role first, then a chunk per token that released text,
        carries logprobs or token ids, or ends its choice; the usage chunk when asked for; "[DONE]". An engine
        failure ends the stream with an error object, as OpenAI's own streams do."""
        job = self.job
        if self.chat:
            top = {"prompt_token_ids": list(job.prompts[0].token_ids)} if job.return_token_ids else {}
            for i in range(len(self.text)):
                yield self._chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                    "finish_reason": None}], **(top if i == 0 else {}))
        while True:
            try:
                deltas = await self.run.next()
            except ApiError as exc:
                yield f"data: {json.dumps(exc.body())}\n\n"
                break
            if deltas is None:
                break
            self.add(deltas)
            for d in deltas:  # one choice per chunk, as OpenAI's own streams send them
                extra, top = {}, {}
                if not self._started[d.index]:
                    self._started[d.index] = True
                    if self.chat:
                        if job.prompt_logprobs is not None and d.index == 0:
                            top = {"prompt_logprobs": self._vllm_prompt_logprobs(0)}
                    else:
                        chunks, extra = self._first_chunks(d)
                        for c in chunks:
                            yield c
                if d.text or d.finish_reason or job.logprobs is not None or job.return_token_ids or extra or top:
                    yield self._chunk([{**self._delta_choice(d), **extra}], **top)
        if job.include_usage:
            yield self._chunk([], self.usage())
        yield "data: [DONE]\n\n"


def _entry(t: TokenInfo) -> dict:
    return {"token": t.text, "logprob": t.logprob, "bytes": t.bytes}
