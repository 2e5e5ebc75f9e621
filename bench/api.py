"""An OpenAI-compatible /v1 under load, measured as vLLM's serving benchmark measures it (`vllm bench serve`),
against the same requests run one after another through transformers' `generate`.

    python bench/api.py [--num-prompts 16] [--random-input-len 64] [--random-output-len 32]
                        [--request-rate inf] [--max-concurrency 4] [--seed 0] [--rounds 1]
                        [--reference transformers|none] [--base-url URL] [--api-key K] [--model NAME]
                        [--weights fp32] [--kv-memory-mb 256] [--json FILE]
    python bench/api.py --dataset-name stories [--clients 8] [--max-tokens 64] [--rounds 3]
                        [--endpoint chat|completions] [--base-url URL]

Without --base-url (or its older name --target) it starts the lab (`python -m app` on a free port, with a random
key, --weights and --kv-memory-mb as given) and measures its /v1: the requests are owners in the room's shared
engine, so requests in flight together are batched into the same engine steps. With --base-url URL (a vLLM,
SGLang or llama.cpp server, or another lab) it measures that server; --model defaults to the first model its
/v1/models lists.

--dataset-name random (the default) is vLLM's request shape (vllm/benchmarks/serve.py, datasets.py RandomDataset,
endpoint_request_func.py async_request_openai_completions):
  * prompts: --num-prompts texts of --random-input-len tokens, built as RandomDataset builds them: token ids
    (offset + i + arange(len)) % |allowed| over the bundled model's vocabulary less its special tokens (offsets
    from numpy's default_rng(--seed)), decoded to text, re-encoded and cut or padded back to the length (up to ten
    tries). They are sent as text, so a server with another tokenizer sees other counts (the prompt_tokens it
    reports are compared with ours and the mismatches printed).
  * each request: POST /v1/completions {prompt, max_tokens = --random-output-len, ignore_eos: true,
    temperature 0.0 (vLLM's default: greedy), repetition_penalty 1.0, logprobs null, stream: true,
    stream_options.include_usage}; a request succeeds when it answers 200, streams text and its usage chunk says
    exactly max_tokens completion tokens (ignore_eos must run it to the end); otherwise it is counted failed.
  * arrivals: --request-rate R sends requests as a Poisson process of R per second (exponential gaps, rescaled
    so that the last is sent at N/R s, as vLLM does), inf = all at once; --max-concurrency C lets at most C run
    at a time (0: no limit). Both may be given.
  * measured at the client: TTFT = request sent -> first streamed chunk whose choice has text (current vLLM stamps the
    first chunk with a choice even if its text is empty: the same here unless a stream opens with an empty chunk);
    ITL = the gaps between the chunks with a choice after it; E2E latency = request sent -> the last chunk with a
    choice; TPOT = (E2E - TTFT) / (output tokens - 1) per request; benchmark duration = first request sent -> last
    request done; throughputs = completed requests, output tokens, input + output tokens per second of it.
  * printed: vLLM's "Serving Benchmark Result" block (mean, median, P99 by numpy's percentile, as vLLM).

The reference, in the same run (--reference transformers): the same prompts' token ids (as our tokenizer encodes the
prompt text) through transformers' `generate` on the bundled fp32 weights (the started lab's default --weights),
greedy, exactly --random-output-len new tokens (min_new_tokens = max_new_tokens), one request after another, in this
process while the server idles. It is what one would do without a server that batches: the ratio "served / one after
another" is how many times the requests' throughput the served lab reaches (duration: how many times faster the same
work finishes). With --rounds R the served benchmark and the reference alternate R times (a machine's drift hits
both alike) and the ratio is of the medians. The reference runs the bundled model: against a --base-url serving
another model the ratio compares unlike models, so pass --reference none there.

--dataset-name stories (the earlier benchmark of this file): each round runs, interleaved, one client alone (the
reference), then --clients clients at once, each with its own story prompt, streaming chat (or completions)
through the official `openai` client. TTFT = request sent -> first chunk with text; tokens = the usage chunk's
completion_tokens; a client's tok/s = tokens / (last chunk - request sent); aggregate tok/s = all tokens / (last
client's end - first client's start). Prints a row per round, then min and median over rounds and the ratios
"N clients / alone" (aggregate throughput, per-client speed, TTFT).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is no package: soak.py sits beside this file
from soak import free_port, wait_up  # noqa: E402

# ---- the stories benchmark: N clients at once against one alone ----

TOPICS = ["a dragon who learns to read", "a lighthouse keeper on Mars", "a robot that bakes bread",
          "a river that flows uphill", "a cat who runs a library", "the last tree in a city",
          "a clock that runs backwards", "a whale who sings opera", "a girl who talks to storms",
          "a train that never stops", "a painter who paints sounds", "a village under the ice"]


@dataclass
class Stream:
    start: float
    first: float | None = None
    end: float | None = None
    tokens: int = 0
    error: str = ""

    @property
    def ttft(self) -> float | None:
        return None if self.first is None else self.first - self.start

    @property
    def tok_s(self) -> float | None:
        return self.tokens / (self.end - self.start) if self.end and self.tokens else None


def percentile(values: list[float], p: float) -> float:
    """Nearest rank: with few samples the value is one that was really observed."""
    s = sorted(values)
    return s[max(0, math.ceil(p * len(s)) - 1)]


async def one_stream(client, args, i: int) -> Stream:
    topic = TOPICS[i % len(TOPICS)]
    common = dict(model=args.model, max_tokens=args.max_tokens, temperature=0, stream=True,
                  stream_options={"include_usage": True})
    s = Stream(time.perf_counter())
    try:
        if args.endpoint == "chat":
            stream = await client.chat.completions.create(
                messages=[{"role": "user", "content": f"Write a long story about {topic}."}], **common)
        else:
            stream = await client.completions.create(prompt=f"Here is a long story about {topic}. Once upon a time,",
                                                     **common)
        async for chunk in stream:
            now = time.perf_counter()
            if chunk.choices:
                c = chunk.choices[0]
                text = c.delta.content if args.endpoint == "chat" else c.text
                if text and s.first is None:
                    s.first = now
            if getattr(chunk, "usage", None):
                s.tokens = chunk.usage.completion_tokens
            s.end = now
    except Exception as exc:  # noqa: BLE001 - a failed client is counted and named, the run goes on
        s.error = f"{type(exc).__name__}: {exc}"[:200]
    return s


async def phase(client, args, n: int) -> dict:
    streams = await asyncio.gather(*(one_stream(client, args, i) for i in range(n)))
    ok = [s for s in streams if not s.error and s.end]
    ttfts = [s.ttft for s in ok if s.ttft is not None]
    wall = max(s.end for s in ok) - min(s.start for s in ok) if ok else float("nan")
    tokens = sum(s.tokens for s in ok)
    return {"clients": n, "errors": [s.error for s in streams if s.error], "tokens": tokens,
            "agg_tok_s": tokens / wall if ok else float("nan"),
            "client_tok_s": statistics.median([s.tok_s for s in ok if s.tok_s]) if ok else float("nan"),
            "ttft_p50": percentile(ttfts, 0.5) if ttfts else float("nan"),
            "ttft_p95": percentile(ttfts, 0.95) if ttfts else float("nan"),
            "streams": [asdict(s) for s in streams]}


async def stories_measure(base: str, args) -> list[tuple[dict, dict]]:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base + "/v1", api_key=args.api_key or "none", max_retries=0, timeout=600)
    if not args.model:
        args.model = (await client.models.list()).data[0].id
    print(f"target {base}/v1, model {args.model}, {args.endpoint}, max_tokens {args.max_tokens}, temperature 0")
    await one_stream(client, args, 0)  # warm-up: first-request costs stay out of the rounds
    rounds = []
    for r in range(args.rounds):
        alone = await phase(client, args, 1)
        many = await phase(client, args, args.clients)
        rounds.append((alone, many))
        for p in (alone, many):
            if p["errors"]:
                print(f"  round {r + 1}, {p['clients']} client(s): {len(p['errors'])} failed: {p['errors'][0]}")
        print(f"round {r + 1}: alone {alone['agg_tok_s']:.1f} tok/s, TTFT {alone['ttft_p50']:.3f} s | "
              f"{args.clients} clients {many['agg_tok_s']:.1f} tok/s in all, {many['client_tok_s']:.1f} per client, "
              f"TTFT p50 {many['ttft_p50']:.3f} s p95 {many['ttft_p95']:.3f} s", flush=True)
    return rounds


def stories_report(rounds: list[tuple[dict, dict]], clients: int) -> None:
    def stat(values):
        values = [v for v in values if not math.isnan(v)]
        return (min(values), statistics.median(values)) if values else (float("nan"), float("nan"))

    rows = [("aggregate tok/s", "agg_tok_s"), ("tok/s per client", "client_tok_s"), ("TTFT p50 s", "ttft_p50"),
            ("TTFT p95 s", "ttft_p95")]
    print(f"\n| measure (min / median of {len(rounds)} rounds) | 1 client alone | {clients} clients at once | "
          "ratio of medians |")
    print("|---|---:|---:|---:|")
    for label, key in rows:
        a, m = stat([x[key] for x, _ in rounds]), stat([y[key] for _, y in rounds])
        print(f"| {label} | {a[0]:.3f} / {a[1]:.3f} | {m[0]:.3f} / {m[1]:.3f} | {m[1] / a[1]:.2f}x |")
    tokens = sum(y["tokens"] for _, y in rounds)
    errors = sum(len(x["errors"]) + len(y["errors"]) for x, y in rounds)
    print(f"\n{tokens} tokens streamed to the concurrent clients over {len(rounds)} rounds; {errors} failed streams")


# ---- vLLM's serving benchmark: random prompts, ignore_eos, fixed output length ----

@dataclass
class RequestOutput:
    """One request as vLLM's RequestFuncOutput records it (seconds, perf_counter clock)."""
    prompt_len: int
    start_time: float = 0.0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0
    server_prompt_tokens: int | None = None
    generated_text: str = ""
    success: bool = False
    error: str = ""


def bundled_tokenizer():
    """The bundled model's tokenizer (the one the lab serves), without loading the model's weights."""
    from transformers import AutoTokenizer
    from engine.loader import bundled_dir

    return AutoTokenizer.from_pretrained(str(bundled_dir()))


def decode_to_target_len(tok, ids: list[int], target: int, rng, max_retry: int = 10) -> tuple[str, list[int]]:
    """vLLM's gen_prompt_decode_to_target_len: decode, re-encode, pad with random ids or cut, until the text
    re-encodes to `target` tokens (N ids may decode to a text that encodes to more or fewer)."""
    tries = max_retry
    while True:
        prompt = tok.decode(ids)
        ids = tok.encode(prompt, add_special_tokens=False)
        if tries <= 0 or len(ids) == target:
            return prompt, ids
        if len(ids) < target:
            ids.extend(rng.integers(0, tok.vocab_size, size=target - len(ids)).tolist())
        else:
            ids = ids[:target]
        tries -= 1


def random_requests(tok, n: int, input_len: int, output_len: int, seed: int) -> list[tuple[str, list[int], int]]:
    """(prompt text, its token ids, output length) x n, as vLLM's RandomDataset samples them with range_ratio 0
    and no prefix (the rng calls in its order, so a seed gives vLLM's offsets for the same vocabulary)."""
    rng = np.random.default_rng(seed)
    rng.integers(input_len, input_len + 1, size=n)  # get_sampling_params draws the lengths first (fixed here)
    rng.integers(output_len, output_len + 1, size=n)
    offsets = rng.integers(0, tok.vocab_size, size=n)
    allowed = np.array(sorted(set(range(tok.vocab_size)) - set(tok.all_special_ids)))
    out = []
    for i in range(n):
        seq = allowed[(int(offsets[i]) + i + np.arange(input_len)) % len(allowed)].tolist()
        prompt, ids = decode_to_target_len(tok, seq, input_len, rng)
        out.append((prompt, ids, output_len))
    return out


async def completion_request(client: httpx.AsyncClient, url: str, headers: dict, model: str, prompt: str,
                             prompt_len: int, output_len: int) -> RequestOutput:
    """vLLM's async_request_openai_completions with ignore_eos, and the exact-length check."""
    payload = {"model": model, "prompt": prompt, "repetition_penalty": 1.0, "max_tokens": output_len,
               "logprobs": None, "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True,
               "temperature": 0.0}
    out = RequestOutput(prompt_len)
    st = time.perf_counter()
    out.start_time, last, first = st, st, False
    try:
        async with client.stream("POST", url, json=payload, headers=headers) as r:
            if r.status_code != 200:
                out.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return out
            async for line in r.aiter_lines():
                if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                    continue
                data = json.loads(line[5:])
                if choices := data.get("choices"):
                    now = time.perf_counter()
                    text = choices[0].get("text") or ""
                    if not first:
                        if not text:
                            continue  # TTFT is the first chunk with text; nothing before it is a token gap
                        first, out.ttft = True, now - st
                    else:
                        out.itl.append(now - last)
                    last = now
                    out.generated_text += text
                if usage := data.get("usage"):
                    out.output_tokens = usage.get("completion_tokens") or 0
                    out.server_prompt_tokens = usage.get("prompt_tokens")
        out.latency = last - st
        if not first:
            out.error = "no streamed chunk with text"
        elif out.output_tokens != output_len:
            out.error = (f"{out.output_tokens} completion tokens, not max_tokens = {output_len} (ignore_eos)"
                         if out.output_tokens else "no usage chunk (stream_options.include_usage)")
        out.success = not out.error
    except (httpx.HTTPError, ValueError) as exc:  # a broken stream is a failed request; the run goes on
        out.error = f"{type(exc).__name__}: {exc}"[:300]
    return out


def arrival_times(n: int, rate: float, rng) -> list[float]:
    """vLLM's get_request (burstiness 1): cumulative exponential gaps, rescaled so the last is at n / rate."""
    if math.isinf(rate):
        return [0.0] * n
    t = np.cumsum(rng.gamma(shape=1.0, scale=1.0 / rate, size=n))
    return (t * (n / rate) / t[-1]).tolist()


async def serve_round(base: str, args, requests) -> tuple[list[RequestOutput], float]:
    url = base + "/v1/completions"
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limit = args.max_concurrency or len(requests)
    async with httpx.AsyncClient(timeout=httpx.Timeout(30, read=6 * 3600),
                                 limits=httpx.Limits(max_connections=limit, max_keepalive_connections=limit)) as client:
        gate = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else contextlib.nullcontext()

        async def limited(prompt, ids, out_len):
            async with gate:
                return await completion_request(client, url, headers, args.model, prompt, len(ids), out_len)

        delays = arrival_times(len(requests), args.request_rate, np.random.default_rng(args.seed))
        t0 = time.perf_counter()
        tasks = []
        for delay, req in zip(delays, requests):
            wait = t0 + delay - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            tasks.append(asyncio.create_task(limited(*req)))
        outputs = await asyncio.gather(*tasks)
        return outputs, time.perf_counter() - t0


def serve_metrics(outputs: list[RequestOutput], duration: float, percentiles: list[float]) -> dict:
    """vLLM's calculate_metrics (no goodput): milliseconds, numpy's mean / median / percentile."""
    ok = [o for o in outputs if o.success]
    ttfts = [o.ttft for o in ok]
    tpots = [(o.latency - o.ttft) / (o.output_tokens - 1) for o in ok if o.output_tokens > 1]
    itls = [x for o in ok for x in o.itl]
    e2els = [o.latency for o in ok]
    total_in, total_out = sum(o.prompt_len for o in ok), sum(o.output_tokens for o in ok)
    m = {"completed": len(ok), "failed": len(outputs) - len(ok), "duration": duration, "total_input": total_in,
         "total_output": total_out, "request_throughput": len(ok) / duration,
         "output_throughput": total_out / duration, "total_token_throughput": (total_in + total_out) / duration}
    for name, values in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        v = values or [0.0]
        m[f"mean_{name}_ms"] = float(np.mean(v)) * 1e3
        m[f"median_{name}_ms"] = float(np.median(v)) * 1e3
        for p in percentiles:
            m[f"p{p:g}_{name}_ms"] = float(np.percentile(v, p)) * 1e3
    # vLLM's peaks: output tokens per whole second since the first request (its token stamps: TTFT, then each
    # gap), and the most requests in flight at once (half-open intervals, departures before arrivals)
    if ok:
        t0 = min(o.start_time for o in ok)
        buckets = np.zeros(int(np.ceil(max(o.start_time + o.latency for o in ok) - t0)) + 1)
        for o in ok:
            t = o.start_time + o.ttft
            for gap in [0.0, *o.itl]:
                t += gap
                buckets[int(t - t0)] += 1
        events = sorted([(o.start_time, 1) for o in ok] + [(o.start_time + o.latency, -1) for o in ok])
        now = peak = 0
        for _, d in events:
            now += d
            peak = max(peak, now)
        m["max_output_tokens_per_s"], m["max_concurrent_requests"] = float(buckets.max()), peak
    else:
        m["max_output_tokens_per_s"], m["max_concurrent_requests"] = 0.0, 0
    return m


def print_vllm_block(m: dict, args, percentiles: list[float], metrics: list[str]) -> None:
    """The block `vllm bench serve` prints, line for line in its format (the metrics it shows by default)."""
    line = "{:<40} {:<10}".format
    num = "{:<40} {:<10.2f}".format
    print("{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="))
    print(line("Successful requests:", m["completed"]))
    print(line("Failed requests:", m["failed"]))
    if args.max_concurrency:
        print(line("Maximum request concurrency:", args.max_concurrency))
    if not math.isinf(args.request_rate):
        print(num("Request rate configured (RPS):", args.request_rate))
    print(num("Benchmark duration (s):", m["duration"]))
    print(line("Total input tokens:", m["total_input"]))
    print(line("Total generated tokens:", m["total_output"]))
    print(num("Request throughput (req/s):", m["request_throughput"]))
    print(num("Output token throughput (tok/s):", m["output_throughput"]))
    print(num("Peak output token throughput (tok/s):", m["max_output_tokens_per_s"]))
    print(num("Peak concurrent requests:", m["max_concurrent_requests"]))
    print(num("Total token throughput (tok/s):", m["total_token_throughput"]))
    for key, name, header in (("ttft", "TTFT", "Time to First Token"),
                              ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
                              ("itl", "ITL", "Inter-token Latency"), ("e2el", "E2EL", "End-to-end Latency")):
        if key not in metrics:
            continue
        print("{s:{c}^{n}}".format(s=header, n=50, c="-"))
        print(num(f"Mean {name} (ms):", m[f"mean_{key}_ms"]))
        print(num(f"Median {name} (ms):", m[f"median_{key}_ms"]))
        for p in percentiles:
            print(num(f"P{p:g} {name} (ms):", m[f"p{p:g}_{key}_ms"]))
    print("=" * 50)


def load_reference(args):
    """transformers' model on the bundled fp32 weights, on the compute thread our engine uses (one OpenMP team,
    the same threads), or None."""
    if args.reference == "none":
        return None
    from engine import compute  # before torch: engine/openmp_env.py sets the OpenMP policy
    from engine.loader import bundled_dir
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # its bar would sit between the benchmark's lines
    return compute.run(lambda: AutoModelForCausalLM.from_pretrained(str(bundled_dir()),
                                                                    dtype=torch.float32).eval())


def reference_round(hf, requests) -> tuple[float, int]:
    """The same requests one after another through `generate`: (seconds, output tokens)."""
    from engine import compute
    import torch

    def run():
        tokens = 0
        t = time.perf_counter()
        with torch.inference_mode():
            for _, ids, out_len in requests:
                y = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                max_new_tokens=out_len, min_new_tokens=out_len, do_sample=False, temperature=None,
                                top_p=None, top_k=None, pad_token_id=hf.config.eos_token_id)
                tokens += y.shape[1] - len(ids)
        return time.perf_counter() - t, tokens

    return compute.run(run)


async def warm_up(base: str, args, requests) -> None:
    """vLLM's initial single-prompt test run: the first request's one-time costs stay out of the measurement,
    and a misconfigured target fails here, before any numbers."""
    outs, _ = await serve_round(base, argparse.Namespace(**{**vars(args), "max_concurrency": 1,
                                                            "request_rate": math.inf}), requests[:1])
    if not outs[0].success:
        sys.exit(f"the initial test request failed: {outs[0].error}")


def run_random(base: str, args) -> dict:
    percentiles = [float(p) for p in args.metric_percentiles.split(",")]
    metrics = [m.strip() for m in args.percentile_metrics.split(",")]
    tok = bundled_tokenizer()
    requests = random_requests(tok, args.num_prompts, args.random_input_len, args.random_output_len, args.seed)
    if not args.model:
        headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        args.model = httpx.get(base + "/v1/models", headers=headers, timeout=30).json()["data"][0]["id"]
    print(f"target {base}/v1/completions, model {args.model}; {args.num_prompts} prompts x "
          f"{args.random_input_len} input tokens (vLLM's random dataset, seed {args.seed}), max_tokens "
          f"{args.random_output_len} with ignore_eos, temperature 0")
    print(f"Traffic request rate: {args.request_rate}\nBurstiness factor: 1.0 (Poisson process)\n"
          f"Maximum request concurrency: {args.max_concurrency or None}")
    hf = load_reference(args)
    asyncio.run(warm_up(base, args, requests))
    if hf is not None:
        reference_round(hf, [(p, ids, 2) for p, ids, _ in requests[:1]])  # warm-up: generate's first call
    served, ref = [], []
    for r in range(args.rounds):
        outputs, duration = asyncio.run(serve_round(base, args, requests))
        served.append((outputs, serve_metrics(outputs, duration, percentiles)))
        if hf is not None:
            ref.append(reference_round(hf, requests))
        if args.rounds > 1:
            m = served[-1][1]
            print(f"round {r + 1}: served {m['duration']:.2f} s, {m['output_throughput']:.1f} tok/s, "
                  f"{m['failed']} failed" + (f" | one after another {ref[-1][0]:.2f} s, "
                                             f"{ref[-1][1] / ref[-1][0]:.1f} tok/s" if ref else ""), flush=True)
    # the round with the median duration is the one printed in vLLM's format
    outputs, m = sorted(served, key=lambda s: s[1]["duration"])[len(served) // 2]
    failed = [o.error for o in outputs if not o.success]
    if failed:
        print("Failed requests during benchmark run detected (capping to 10):")
        for i, err in enumerate(failed[:10]):
            print(f"Error {i}: {err}")
    mismatched = sum(1 for o in outputs
                     if o.server_prompt_tokens is not None and o.server_prompt_tokens != o.prompt_len)
    if mismatched:
        print(f"note: the server counted other prompt lengths than ours for {mismatched} of {len(outputs)} prompts "
              f"(another tokenizer, or special tokens added); the input totals are ours, as vLLM's are")
    print_vllm_block(m, args, percentiles, metrics)
    if ref:
        report_reference(served, ref, args)
    return {"served": [{"metrics": mm, "outputs": [asdict(o) for o in oo]} for oo, mm in served],
            "reference": [{"seconds": s, "output_tokens": t} for s, t in ref]}


def report_reference(served, ref, args) -> None:
    med = statistics.median
    n = args.num_prompts
    s_dur = med(m["duration"] for _, m in served)
    s_tok = med(m["output_throughput"] for _, m in served)
    s_req = med(m["request_throughput"] for _, m in served)
    r_dur = med(s for s, _ in ref)
    r_tok = med(t / s for s, t in ref)
    conc = f"max concurrency {args.max_concurrency}" if args.max_concurrency else "no concurrency limit"
    print(f"\nThe same {n} requests, served (/v1, streaming, {conc}, request rate {args.request_rate}) against one "
          f"after another through transformers' `generate` (fp32, greedy, exactly {args.random_output_len} new "
          f"tokens each), in this run{f', median of {len(served)} rounds' if len(served) > 1 else ''}:")
    print("| measure | served | one after another (transformers) | served / one after another |")
    print("|---|---:|---:|---:|")
    print(f"| duration s | {s_dur:.2f} | {r_dur:.2f} | {r_dur / s_dur:.2f}x faster |")
    print(f"| request throughput req/s | {s_req:.2f} | {n / r_dur:.2f} | {s_req / (n / r_dur):.2f}x |")
    print(f"| output token throughput tok/s | {s_tok:.1f} | {r_tok:.1f} | {s_tok / r_tok:.2f}x |")
    print("(above 1x: serving the requests together through the lab's API finishes the same work sooner than "
          "running them one by one in transformers; with --request-rate the served side also waits for arrivals)")


def start_lab(args) -> tuple[subprocess.Popen, str]:
    port = free_port()
    args.api_key = args.api_key or secrets.token_urlsafe(12)
    log = Path(tempfile.mkdtemp(prefix="bench-api-")) / "server.log"
    out = open(log, "w")
    proc = subprocess.Popen([sys.executable, "-m", "app", "--port", str(port), "--api-key", args.api_key,
                             "--kv-memory-mb", str(args.kv_memory_mb), "--weights", args.weights], cwd=ROOT,
                            stdout=out, stderr=subprocess.STDOUT,
                            env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"})
    base = f"http://127.0.0.1:{port}"
    try:
        wait_up(base + "/healthz", proc, args.ready_timeout, lambda r: r.json().get("ready"))
    except RuntimeError as exc:
        proc.terminate()
        sys.exit(f"the lab did not start: {exc}; its log: {log}")
    print(f"lab started on {base} (log {log})")
    return proc, base


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset-name", choices=("random", "stories"), default="random",
                    help="random: vLLM's serving benchmark (default); stories: N story clients against one alone")
    ap.add_argument("--base-url", "--target", dest="target", default="",
                    help="an OpenAI-compatible server's base URL (default: start the lab)")
    ap.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", ""))
    ap.add_argument("--model", default="", help="default: the first model the server lists")
    ap.add_argument("--rounds", type=int, default=None, help="random: 1 (served and reference alternate); stories: 3")
    # vLLM's serving benchmark (--dataset-name random), its flag names
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--random-input-len", type=int, default=64)
    ap.add_argument("--random-output-len", type=int, default=32)
    ap.add_argument("--request-rate", type=float, default=math.inf,
                    help="requests per second, Poisson arrivals; inf: all at once")
    ap.add_argument("--max-concurrency", type=int, default=4, help="requests running at once at most; 0: no limit")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--percentile-metrics", default="ttft,tpot,itl", help="of ttft,tpot,itl,e2el")
    ap.add_argument("--metric-percentiles", default="99")
    ap.add_argument("--reference", choices=("transformers", "none"), default="transformers",
                    help="the same requests one after another through transformers' generate (bundled model)")
    # the stories benchmark (--dataset-name stories)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--endpoint", choices=("chat", "completions"), default="chat")
    # the started lab
    ap.add_argument("--weights", default="fp32", help="the started lab's weight format (the lab's default, fp32)")
    ap.add_argument("--kv-memory-mb", type=int, default=256, help="the started lab's KV pool")
    ap.add_argument("--ready-timeout", type=float, default=600.0)
    ap.add_argument("--json", default="", help="write every request's numbers here")
    args = ap.parse_args()
    stories = args.dataset_name == "stories"
    args.rounds = args.rounds if args.rounds is not None else (3 if stories else 1)
    if args.clients < 1 or args.rounds < 1 or args.max_tokens < 1:
        ap.error("--clients, --rounds and --max-tokens must be at least 1")
    if args.num_prompts < 1 or args.random_input_len < 1 or args.random_output_len < 1 or args.max_concurrency < 0 \
            or not args.request_rate > 0:
        ap.error("--num-prompts, --random-input-len and --random-output-len at least 1, --max-concurrency >= 0, "
                 "--request-rate > 0")
    if not stories:
        import engine  # noqa: F401  (before torch: engine/openmp_env.py sets the OpenMP policy)
    proc = None
    base = args.target.rstrip("/").removesuffix("/v1")
    if not base:
        proc, base = start_lab(args)
    try:
        if stories:
            rounds = asyncio.run(stories_measure(base, args))
        else:
            result = run_random(base, args)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
    if stories:
        stories_report(rounds, args.clients)
        result = {"rounds": rounds}
    if args.json:
        Path(args.json).write_text(json.dumps({"args": {k: v for k, v in vars(args).items() if k != "api_key"},
                                               **result}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
