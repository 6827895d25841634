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

"""Phase B: the simulated fleet's batches replayed against a real engine.

A vLLM CPU server runs a random-weight Llama big enough that prefill
dominates a request's time. Its KV pool is sized like one simulated
worker's cache. For each arm (a strategy), the workers' batch sequences
are replayed one worker after another, each batch in emission order as one
completions request, with the prefix cache reset before every worker. A
worker's engine time is the sum of its batches' request times; its computed
prompt tokens come from the server's vllm:prefix_cache_* counters, and the
prefill share from its request_prefill_time and e2e_request_latency
histograms. The arms alternate (ABBA), after a warm-up.
"""

import json
import random
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from bench import fleet
from bench.workloads import BLOCK_TOKENS
from bench.workloads import MICROS
from bench.workloads import FlatWorkload
from bench.workloads import segment
from integration import engines

HITS = 'vllm:prefix_cache_hits_total'
QUERIES = 'vllm:prefix_cache_queries_total'
PREFILL = 'vllm:request_prefill_time_seconds_sum'
E2E = 'vllm:e2e_request_latency_seconds_sum'
COUNTERS = (HITS, QUERIES, PREFILL, E2E)

# Prefill dominates at this size (hidden 512, 6 layers: 20.6M parameters).
MODEL = {'hidden_size': 512, 'intermediate_size': 1536, 'layers': 6, 'heads': 8}
# W1's shape at a size one CPU server replays in minutes: 26-block prefixes
# and 2-block suffixes (896-token prompts), 4 workers.
ENGINE = FlatWorkload(
    'E',
    requests=64,
    workers=4,
    cache_prefixes=4,
    batch_size=8,
    zipf_s=1.1,
    prefixes=32,
    prefix_tokens=832,
    suffix_tokens=64)
MAX_NUM_SEQS = 8
# The segment kind of the calibration prompts.
CALIBRATION = 9


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


def complete(port, model, prompts) -> float:
  """Sends one batch; returns its request time in seconds."""
  started = time.perf_counter()
  answer = _post(
      port,
      '/v1/completions',
      {
          'model': str(model),
          'prompt': prompts,
          'max_tokens': 1,
          'temperature': 0,
      })
  seconds = time.perf_counter() - started
  if len(answer['choices']) != len(prompts):
    raise RuntimeError('the engine lost or duplicated requests')
  return seconds


def replay_arm(port, model, batches) -> dict:
  """Replays an arm's batches worker by worker; returns its raw figures."""
  per_worker = {}
  for batch in sorted(batches, key=lambda b: b.emitted_us):
    per_worker.setdefault(batch.worker, []).append(batch)
  workers = {}
  timed = []
  before_arm = engines.prometheus_counters(port, COUNTERS)
  for worker in sorted(per_worker):
    _post(port, '/reset_prefix_cache', timeout=60)
    before = engines.prometheus_counters(port, COUNTERS)
    seconds = 0.0
    for batch in per_worker[worker]:
      counted = engines.prometheus_counters(port, (HITS, QUERIES))
      took = complete(
          port, model, [prompt_text(r.segments) for r in batch.requests])
      after_batch = engines.prometheus_counters(port, (HITS, QUERIES))
      computed = (after_batch[QUERIES] - counted[QUERIES]) - (
          after_batch[HITS] - counted[HITS])
      timed.append((computed, took))
      seconds += took
    after = engines.prometheus_counters(port, COUNTERS)
    queries = after[QUERIES] - before[QUERIES]
    hits = after[HITS] - before[HITS]
    workers[worker] = {
        'engine_s': seconds,
        'prompt_tokens_computed': queries - hits,
        'prompt_tokens': queries,
        'batches': len(per_worker[worker]),
    }
  after_arm = engines.prometheus_counters(port, COUNTERS)
  return {
      'workers': workers,
      'busiest_worker_s': max(w['engine_s'] for w in workers.values()),
      'prompt_tokens_computed': sum(
          w['prompt_tokens_computed'] for w in workers.values()),
      'hit_rate': 1 -
      sum(w['prompt_tokens_computed'] for w in workers.values()) /
      sum(w['prompt_tokens'] for w in workers.values()),
      'prefill_share': (after_arm[PREFILL] - before_arm[PREFILL]) /
      (after_arm[E2E] - before_arm[E2E]),
      'batches': timed,
  }


def calibrate(port, model, batch_size, repetitions) -> dict:
  """The engine's costs, from dedicated batches: a cold prompt, the same
  prompt again (all but its last partial block cached), and batch_size
  copies of it. Medians over repetitions of: seconds per computed token,
  a batch's fixed cost (one cached request) and each further request's."""
  per_token, first, further = [], [], []
  for repetition in range(repetitions):
    _post(port, '/reset_prefix_cache', timeout=60)
    prompt = prompt_text(
        ((segment(CALIBRATION, repetition), ENGINE.prefix_tokens // 32 + 2), ))
    cold_before = engines.prometheus_counters(port, (HITS, QUERIES))
    cold = complete(port, model, [prompt])
    cold_after = engines.prometheus_counters(port, (HITS, QUERIES))
    warm = complete(port, model, [prompt])
    warm_after = engines.prometheus_counters(port, (HITS, QUERIES))
    many = complete(port, model, [prompt] * batch_size)

    def computed(start, end):
      return (end[QUERIES] - start[QUERIES]) - (end[HITS] - start[HITS])

    extra_tokens = computed(cold_before, cold_after) - computed(
        cold_after, warm_after)
    per_token.append((cold - warm) / extra_tokens)
    first.append(warm)
    further.append((many - warm) / (batch_size - 1))
  seconds_per_token = statistics.median(per_token)
  return {
      'seconds_per_token': seconds_per_token,
      'batch_overhead_s': statistics.median(first),
      'request_overhead_s': statistics.median(further),
      'batch_overhead_tokens': statistics.median(first) / seconds_per_token,
      'request_overhead_tokens': statistics.median(further) / seconds_per_token,
      'repetitions': repetitions,
  }


def fit_overhead(timed) -> dict:
  """Least squares of a batch's seconds on its computed tokens: the
  per-batch overhead, in seconds and in computed-token equivalents."""
  xs = [float(x) for x, _ in timed]
  ys = [y for _, y in timed]
  slope, intercept = statistics.linear_regression(xs, ys)
  return {
      'seconds_per_token': slope,
      'batch_overhead_s': intercept,
      'batch_overhead_tokens': intercept / slope,
      'batches': len(timed),
  }


def engine_fleet(
    quick: bool,
    port: int,
    model: Path,
    arms: dict,
    seed,
    rate_per_worker,
    progress) -> tuple[dict, dict]:
  """arms: name -> builder(workload, requests, seed) -> route (as in
  streaming.strategies). Returns (engine_fleet figures, engine details)."""
  workload = ENGINE.scaled(requests=32 if quick else ENGINE.requests)
  requests = workload.requests_at(rate_per_worker, seed)
  batches = {}
  simulated = {}
  for name, build in arms.items():
    batches[name] = fleet.form_batches(
        requests, build(workload, requests, seed), workload.batch_size, MICROS)
    simulated[name] = fleet.evaluate(
        batches[name], workload.workers, workload.cache_blocks, 0)
  progress('B: warm-up')
  warm = workload.scaled(prefixes=4).requests_at(rate_per_worker, f'{seed}/w')
  for i in range(0, 16, MAX_NUM_SEQS):
    complete(
        port,
        model, [prompt_text(r.segments) for r in warm[i:i + MAX_NUM_SEQS]])
  progress('B: calibration')
  calibration = calibrate(port, model, workload.batch_size, 3)
  repetitions = 1 if quick else 2
  runs: dict = {name: [] for name in arms}
  order = list(arms)
  for repetition in range(repetitions):
    for name in order if repetition % 2 == 0 else order[::-1]:
      progress(f'B: {name}, repetition {repetition + 1}/{repetitions}')
      runs[name].append(replay_arm(port, model, batches[name]))
  calibration['fit_over_replayed_batches'] = fit_overhead([
      pair for arm_runs in runs.values() for run in arm_runs
      for pair in run['batches']
  ])
  figures = {
      name: {
          field: statistics.median(run[field] for run in arm_runs)
          for field in (
              'prompt_tokens_computed', 'busiest_worker_s', 'prefill_share',
              'hit_rate')
      }
      for name, arm_runs in runs.items()
  }
  for name in arms:
    figures[name]['simulated_prompt_tokens_computed'] = simulated[name][
        'prompt_tokens_computed']
    figures[name]['simulated_hit_rate'] = simulated[name]['hit_rate']
    figures[name]['throughput_ratio'] = (
        figures['baseline']['busiest_worker_s'] /
        figures[name]['busiest_worker_s'])
  figures['throughput_ratio'] = figures['default']['throughput_ratio']
  for arm_runs in runs.values():
    for run in arm_runs:
      run['batches'] = [[x, round(y, 6)] for x, y in run['batches']]
  return figures, {
      'workload': workload.describe(),
      'rate_per_worker': rate_per_worker,
      'seed': seed,
      'repetitions': repetitions,
      'model': MODEL,
      'max_num_seqs': MAX_NUM_SEQS,
      'kv_pool_blocks': workload.cache_blocks,
      'calibration': calibration,
      'runs': runs,
  }
