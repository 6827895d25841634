#
# Licensed to the Apache Software Foundation (ASF) under one or more
# contributor license agreements.  See the NOTICE file distributed with
# this work for additional information regarding copyright ownership.
# The ASF licenses this file to You under the Apache License, Version 2.0
# (the "License"); you may not use this file except in compliance with
# the License.  You may obtain a copy of the License at
#
#    http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
#

"""Phase B: benchmark v4's batches replayed against a real engine.

A vLLM CPU server runs a random-weight Llama big enough that prefill
dominates a request's time. fit_curve measures its throughput at 1 to 8
requests in flight, prefill and decode apart, and fits the form that
bench.costs assumes. replay then runs three of v4's points at a small
scale (RUNS): the simulator forms and places both arms' batches (the
deployment's baseline and the default) for every evaluation placement,
and the placement whose ratio is the median is replayed. This is a
per-worker replay on one server, not a fleet: each worker's batches are
sent back to back (a saturated worker), in its order, each batch as one
completions request decoding DECODE_TOKENS tokens, at most IN_FLIGHT
batches at once; the prefix cache is reset before each worker, the arms
alternate, and a worker's time runs from its first send to its last
answer. The ratio is the baseline's busiest worker's time over the
default's.
"""

import concurrent.futures
import json
import random
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from bench import batch as batch_model
from bench import costs
from bench import deploy
from bench import fleet
from bench import frames
from bench import policies
from bench import v4
from bench.workloads import BLOCK_TOKENS
from bench.workloads import MICROS
from bench.workloads import FlatWorkload
from bench.workloads import UniqueWorkload
from integration import engines

HITS = 'vllm:prefix_cache_hits_total'
QUERIES = 'vllm:prefix_cache_queries_total'
PREFILL = 'vllm:request_prefill_time_seconds_sum'
E2E = 'vllm:e2e_request_latency_seconds_sum'
COUNTERS = (HITS, QUERIES, PREFILL, E2E)

# Prefill dominates at this size (hidden 512, 6 layers: 20.6M parameters).
MODEL = {'hidden_size': 512, 'intermediate_size': 1536, 'layers': 6, 'heads': 8}
MAX_NUM_SEQS = 8
# The engine's KV pool, in 32-token blocks: at least the KV of the
# requests it runs at once (8 of up to 15 blocks); the replays' C.
KV_BLOCKS = 128
# W1's shape at a size one CPU server on 2 shared cores replays in
# minutes: 13-block prefixes, 1-block suffixes, 4 workers, 128 requests per
# arm, at R4.
ENGINE_W1 = FlatWorkload(
    'W1',
    requests=128,
    workers=4,
    cache_prefixes=1,
    batch_size=8,
    zipf_s=1.1,
    prefixes=32,
    prefix_tokens=416,
    suffix_tokens=32)
ENGINE_W0 = UniqueWorkload(
    'W0',
    requests=128,
    workers=4,
    cache_prefixes=1,
    batch_size=8,
    zipf_s=0.0,
    prompt_tokens=448)
# SDK processes per replayed worker, in both arms. Phase A's 8 would leave
# each measuring process 4 of a replay's 128 requests, too few to fill a
# batch; phase A's W0 gives each 125. One (as a worker that holds one copy
# of a model runs) gives each 32.
PROCESSES = 1
# (deployment, workload, R) replayed.
RUNS = (('streaming_F3', 'W1', 4.0), ('batch', 'W1', 4.0), ('batch', 'W0', 4.0))
DECODE_TOKENS = 32
# Batches a worker has at the engine at once (its DoFn threads).
IN_FLIGHT = 2
CURVE_IN_FLIGHT = (1, 2, 4, 8)
# The segment kind of the curve's prompts.
CURVE = 9


def model_path(out_models: Path) -> Path:
  return engines.tiny_llama_hf(out_models / 'prefill-llama-hf', **MODEL)


def start_server(
    model: Path, port: int, gpu_blocks: int, log: Path) -> subprocess.Popen:
  """Starts vLLM's OpenAI server; wait_for_server waits until it serves."""
  command = [
      sys.executable,
      '-m',
      'vllm.entrypoints.openai.api_server',
      '--model',
      str(model),
      '--port',
      str(port),
      '--num-gpu-blocks-override',
      str(gpu_blocks),
      '--max-num-seqs',
      str(MAX_NUM_SEQS),
  ]
  for flag, value in engines.VLLM_CPU_SERVER_KWARGS.items():
    command += [f'--{flag}'] + ([] if value is None else [value])
  log.parent.mkdir(parents=True, exist_ok=True)
  with open(log, 'w') as out:
    return subprocess.Popen(
        command,
        stdout=out,
        stderr=subprocess.STDOUT,
        env=dict(engines.environ_for_vllm(), VLLM_SERVER_DEV_MODE='1'))


def wait_for_server(server: subprocess.Popen, port: int, log: Path) -> None:
  deadline = time.monotonic() + 600
  while time.monotonic() < deadline:
    if server.poll() is not None:
      raise RuntimeError(f'vLLM exited; see {log}')
    try:
      urllib.request.urlopen(f'http://127.0.0.1:{port}/v1/models', timeout=5)
      return
    except OSError:
      time.sleep(2)
  server.kill()
  raise RuntimeError('vLLM did not start in 10 minutes')


def prompt_text(segments) -> str:
  """A prompt whose characters (one token each) are fixed by its segments:
  requests that share a segment share its text."""
  parts = []
  for name, count in segments:
    rng = random.Random(name)
    parts.append(
        ''.join(
            rng.choice('abcdefghijklmnopqrstuvwxyz')
            for _ in range(count * BLOCK_TOKENS)))
  return ''.join(parts)


def _post(port, path, body=None, timeout=600):
  request = urllib.request.Request(
      f'http://127.0.0.1:{port}{path}',
      data=None if body is None else json.dumps(body).encode(),
      headers={'Content-Type': 'application/json'},
      method='POST')
  with urllib.request.urlopen(request, timeout=timeout) as response:
    return json.loads(response.read() or b'null')


def complete(port, model, prompts, max_tokens=1) -> float:
  """Sends one batch; returns its request time in seconds."""
  started = time.perf_counter()
  answer = _post(
      port,
      '/v1/completions',
      {
          'model': str(model),
          'prompt': prompts,
          'max_tokens': max_tokens,
          'min_tokens': max_tokens,
          'ignore_eos': True,
          'temperature': 0,
      })
  seconds = time.perf_counter() - started
  if len(answer['choices']) != len(prompts):
    raise RuntimeError('the engine lost or duplicated requests')
  return seconds


def fit_curve(port, model, repetitions=2) -> dict:
  """Throughput at 1 to 8 requests in flight: prefill (distinct 512-token
  prompts, 1 token decoded) and decode (distinct 32-token prompts, 64
  tokens decoded), each fitted to peak * n / (n + half)."""
  measured: dict = {'prefill': [], 'decode': []}
  serial = 0
  for n in CURVE_IN_FLIGHT:
    for kind, (prompt_blocks, tokens) in (('prefill', (16, 1)), ('decode',
                                                                 (1, 64))):
      rates = []
      for _ in range(repetitions):
        prompts = []
        for _ in range(n):
          serial += 1
          prompts.append(
              prompt_text(((CURVE * 10**9 + serial, prompt_blocks), )))
        with concurrent.futures.ThreadPoolExecutor(n) as pool:
          started = time.perf_counter()
          list(
              pool.map(
                  lambda p: complete(port, model, [p], max_tokens=tokens),
                  prompts))
          seconds = time.perf_counter() - started
        work = prompt_blocks * BLOCK_TOKENS if kind == 'prefill' else tokens
        rates.append(n * work / seconds)
      measured[kind].append((n, statistics.median(rates)))
  out = {}
  for kind, points in measured.items():
    half, peak = costs.fit_half(points)
    out[kind] = {
        'tokens_per_s': {
            str(n): r
            for n, r in points
        },
        'half': half,
        'peak_tokens_per_s': peak,
    }
  return out


def replay_worker(port, model, batches) -> dict:
  """Sends one worker's batches back to back, at most IN_FLIGHT at once,
  in order; returns its engine time and the prompt tokens it computed."""
  _post(port, '/reset_prefix_cache', timeout=60)
  before = engines.prometheus_counters(port, (HITS, QUERIES))
  slots = threading.Semaphore(IN_FLIGHT)
  started = time.perf_counter()
  ends = []

  def send(batch):
    try:
      complete(
          port,
          model, [prompt_text(r.segments) for r in batch.requests],
          max_tokens=DECODE_TOKENS)
      ends.append(time.perf_counter())
    finally:
      slots.release()

  with concurrent.futures.ThreadPoolExecutor(IN_FLIGHT) as pool:
    futures = []
    for batch in batches:
      slots.acquire()
      futures.append(pool.submit(send, batch))
    for future in futures:
      future.result()
  after = engines.prometheus_counters(port, (HITS, QUERIES))
  return {
      'engine_s': max(ends) - started,
      'prompt_tokens_computed': (after[QUERIES] - before[QUERIES]) -
      (after[HITS] - before[HITS]),
      'prompt_tokens': after[QUERIES] - before[QUERIES],
      'batches': len(batches),
      'requests': sum(len(b.requests) for b in batches),
  }


def _arms(deployment, workload, seed, salt, spec):
  """{arm: (batches, placement)} of one placement, as v4 forms them."""
  requests = workload.requests_at(v4.RATE_PER_WORKER, seed)
  w, bs = workload.workers, workload.batch_size
  if deployment == 'batch':
    base = batch_model.stateless_batches(requests, w, bs, salt)
    grouped = v4.batch_groups(spec, requests, seed, w, bs, PROCESSES)
    weights = {
        k: batch_model.key_work(v, costs.GPU, DECODE_TOKENS, deploy.Charges())
        for k, v in grouped.items()
    }
    return {
        'baseline': base,
        'default': batch_model.keyed_batches(grouped, w, salt, weights)
    }
  copies = frames.copy_of(
      requests,
      frames.Frame('F', 'hash', PROCESSES, v4.THREADS_PER_PROCESS),
      seed)
  routes = {
      'baseline': policies.PerProcessKey(copies),
      'default': policies.route_for(
          spec,
          copies,
          seed,
          batch_size=bs,
          buffering_s=v4.BUFFERING_S,
          cold_key=policies.cold_key_of(seed, w, PROCESSES)),
  }
  out = {}
  for arm, route in routes.items():
    batches = fleet.form_batches(
        requests, route, bs, round(v4.BUFFERING_S * MICROS))
    placer = deploy.RangePlacer(w, salt)
    placement = {}
    for b in sorted(batches, key=lambda b: b.emitted_us):
      placement[b.state_key] = placer(b.state_key, b.emitted_us)
    out[arm] = (batches, placement)
  return out


def _simulated(arms, workload):
  figures = {}
  for arm, (batches, placement) in arms.items():
    run = deploy.evaluate(
        batches,
        deploy.StaticPlacer(placement, workload.workers),
        workload.workers,
        KV_BLOCKS,
        costs.GPU,
        deploy.Charges(0),
        cell_us=2**62)
    figures[arm] = deploy.score(
        run, 0, DECODE_TOKENS, costs.GPU, IN_FLIGHT, workload.requests)
  return (
      figures['default']['capacity']['whole'] /
      figures['baseline']['capacity']['whole'])


def replay(port, model, spec, quick, progress) -> tuple[dict, dict]:
  """Runs RUNS; returns (v4.engine, its details)."""
  out: dict = {}
  details: dict = {}
  for deployment, name, ratio in RUNS:
    shape = ENGINE_W1 if name == 'W1' else ENGINE_W0
    workload = shape.with_shareable_tokens(ratio * KV_BLOCKS * BLOCK_TOKENS)
    if quick:
      workload = workload.scaled(requests=32)
    placements = []
    for seed in v4.EVAL_SEEDS:
      for salt in v4.salts_of(seed):
        arms = _arms(deployment, workload, seed, salt, spec)
        placements.append((_simulated(arms, workload), seed, salt, arms))
    simulated = [p[0] for p in placements]
    chosen = placements[frames.median_index(simulated)]
    arms = chosen[3]
    runs: dict = {arm: {} for arm in arms}
    for w in range(workload.workers):
      progress(f'B: {deployment} {name}, worker {w}')
      order = list(arms) if w % 2 == 0 else list(arms)[::-1]
      for arm in order:
        batches, placement = arms[arm]
        mine = [b for b in batches if placement[b.state_key] == w]
        if mine:
          runs[arm][w] = replay_worker(port, model, mine)
    busiest = {
        arm: max(r['engine_s'] for r in workers.values())
        for arm, workers in runs.items()
    }
    out.setdefault(deployment, {})[name] = {
        'ratio': busiest['baseline'] / busiest['default'],
        'simulated_ratio': chosen[0],
        'workers': workload.workers,
        'processes_per_worker': PROCESSES,
        'requests': workload.requests,
        'decode_tokens': DECODE_TOKENS,
        'in_flight_batches': IN_FLIGHT,
        'regime': ratio,
    }
    details.setdefault(deployment, {})[name] = {
        'seed': chosen[1],
        'salt': chosen[2],
        'simulated_ratios': simulated,
        'workload': workload.describe(),
        'arms': {
            arm: {
                'busiest_worker_s': busiest[arm],
                'mean_batch_size': statistics.fmean(
                    len(b.requests) for b in arms[arm][0]),
                'hit_rate': 1 -
                sum(r['prompt_tokens_computed'] for r in workers.values()) /
                sum(r['prompt_tokens'] for r in workers.values()),
                'workers': workers,
            }
            for arm, workers in runs.items()
        },
    }
  return out, details
