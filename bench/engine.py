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
worker's cache. The fleet (FLEET: 8 workers, 256 requests) is simulated
for every placement of a frame (seeds x salts); the placement whose
default-over-baseline ratio is the median is replayed for both arms.
Each worker's batches are sent as Beam sends them: in emission order, each
as one completions request, at most MAX_IN_FLIGHT at once, at their
emission times scaled so that the mean worker offers the load one server
sustains. Workers are replayed one after another, the prefix cache reset
before each, every arm's batches of a worker back to back in alternating
order, twice; a worker's engine time runs from its first send to its last
answer (median of the repetitions), and its computed prompt tokens come
from the server's vllm:prefix_cache_* counters.
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

from bench import fleet
from bench import frames
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
# The fleet replayed: W1's shape at 8 workers and 256 requests.
FLEET = ENGINE.scaled(requests=256, workers=8)
# Batches a worker has at the engine at once (Beam's RunInference threads).
MAX_IN_FLIGHT = 12
# Arrival times are scaled so that the mean worker offers this many times
# what one server sustains: every worker is then busy from its first batch
# to its last, and its engine time is its busy time, which throughput needs
# (at 1x, a worker with less work than the baseline's waits for arrivals).
SATURATION = 4
# The decode length of the calibration's decode measurement.
DECODE_TOKENS = 32
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


def calibrate(port, model, batch_size, repetitions) -> dict:
  """The engine's costs, from dedicated batches: a cold prompt, the same
  prompt again (all but its last partial block cached), batch_size copies
  of it, and those copies decoding DECODE_TOKENS more tokens. Medians over
  repetitions of: seconds per computed token, a batch's fixed cost (one
  cached request), each further request's, and a decoded token's per
  request of a full batch."""
  per_token, first, further, decode = [], [], [], []
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
    decoding = complete(
        port, model, [prompt] * batch_size, max_tokens=DECODE_TOKENS + 1)
    decode.append((decoding - many) / (DECODE_TOKENS * batch_size))

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
      'decode_token_s': statistics.median(decode),
      'decode_token_tokens': statistics.median(decode) / seconds_per_token,
      'decode_batch_size': batch_size,
      'repetitions': repetitions,
  }


def replay_worker(port, model, batches, scale) -> dict:
  """Sends one worker's batches at their scaled emission times, at most
  MAX_IN_FLIGHT at once, in order; returns its engine time (first send to
  last answer) and the prompt tokens it computed."""
  _post(port, '/reset_prefix_cache', timeout=60)
  before = engines.prometheus_counters(port, (HITS, QUERIES))
  slots = threading.Semaphore(MAX_IN_FLIGHT)
  first_us = batches[0].emitted_us
  started = time.perf_counter()
  ends = []

  def send(batch):
    try:
      complete(port, model, [prompt_text(r.segments) for r in batch.requests])
      ends.append(time.perf_counter())
    finally:
      slots.release()

  with concurrent.futures.ThreadPoolExecutor(MAX_IN_FLIGHT) as pool:
    futures = []
    for batch in batches:
      due = started + (batch.emitted_us - first_us) / MICROS * scale
      time.sleep(max(0.0, due - time.perf_counter()))
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


def median_placement(
    workload, rate_per_worker, frame, seeds, salts, arms, costs) -> dict:
  """Simulates both arms in every placement of the frame; returns the
  placement whose default-over-baseline ratio is the median, with each
  arm's batches and the workers that placement gives them."""
  runs = []
  for seed in seeds:
    requests = workload.requests_at(rate_per_worker, seed)
    copies = frames.copy_of(requests, frame, seed)
    formed = {
        name: fleet.form_batches(
            requests,
            build(workload, requests, copies, seed),
            workload.batch_size,
            MICROS)
        for name, build in arms.items()
    }
    for salt in salts:
      placed = {}
      for name, batches in formed.items():
        figures = frames.place_and_evaluate(
            batches,
            frame,
            salt,
            workload.workers,
            workload.cache_blocks,
            costs)
        placed[name] = (batches, figures)
      ratio = (
          placed['baseline'][1]['busiest_worker_work'] /
          placed['default'][1]['busiest_worker_work'])
      runs.append((ratio, seed, salt, placed))
  ratios = [run[0] for run in runs]
  ratio, seed, salt, placed = runs[frames.median_index(ratios)]
  return {
      'simulated_ratio': ratio,
      'simulated_ratios': ratios,
      'seed': seed,
      'salt': salt,
      'placed': placed,
  }


def engine_fleet(
    quick: bool,
    port: int,
    model: Path,
    arms: dict,
    seeds,
    salts,
    rate_per_worker,
    costs,
    progress) -> tuple[dict, dict]:
  """arms: {'baseline': build, 'default': build, ...} with build(workload,
  requests, copies, seed) -> route; any further arms are replayed at
  the default's median placement. Returns (engine_fleet,
  engine)."""
  workload = FLEET.scaled(requests=128) if quick else FLEET
  progress('B: warm-up')
  warm = workload.scaled(prefixes=4).requests_at(rate_per_worker, 'warm')
  for i in range(0, 16, MAX_NUM_SEQS):
    complete(
        port,
        model, [prompt_text(r.segments) for r in warm[i:i + MAX_NUM_SEQS]])
  progress('B: calibration')
  calibration = calibrate(port, model, workload.batch_size, 3)
  repetitions = 1 if quick else 2
  out: dict = {}
  details: dict = {}
  for frame in (frames.F2, frames.F3):
    chosen = median_placement(
        workload, rate_per_worker, frame, seeds, salts, arms, costs)
    # Scale time so that the mean worker offers SATURATION times what one
    # server sustains: its simulated work, in seconds, over the run's span.
    base_batches, base_figures = chosen['placed']['baseline']
    span_s = (
        max(b.emitted_us
            for b in base_batches) - min(b.emitted_us
                                         for b in base_batches)) / MICROS
    mean_work_s = (
        base_figures['busiest_worker_work'] /
        base_figures['load_max_over_mean'] * calibration['seconds_per_token'])
    scale = mean_work_s / span_s / SATURATION
    per_worker: dict = {}
    for name, (batches, figures) in chosen['placed'].items():
      placement = figures['placement']
      for batch in sorted(batches, key=lambda b: b.emitted_us):
        per_worker.setdefault(name,
                              {}).setdefault(placement[batch.state_key],
                                             []).append(batch)
    # Worker by worker, every arm's batches of that worker back to back,
    # in alternating order: a change of the machine's load hits the arms
    # alike.
    order = list(chosen['placed'])
    runs: dict = {name: {} for name in order}
    for w in range(workload.workers):
      progress(f'B: {frame.name}, worker {w}, {repetitions} repetitions')
      for repetition in range(repetitions):
        turn = order if (repetition + w) % 2 == 0 else order[::-1]
        for name in turn:
          if w in per_worker[name]:
            runs[name].setdefault(w, []).append(
                replay_worker(port, model, per_worker[name][w], scale))
    arms_out = {}
    for name, (batches, figures) in chosen['placed'].items():
      workers = {
          w: {
              **replays[0],
              'engine_s': statistics.median(r['engine_s'] for r in replays),
              'engine_s_runs': [r['engine_s'] for r in replays],
          }
          for w, replays in sorted(runs[name].items())
      }
      arms_out[name] = {
          'busiest_worker_s': max(w['engine_s'] for w in workers.values()),
          'prompt_tokens_computed': sum(
              w['prompt_tokens_computed'] for w in workers.values()),
          'hit_rate': 1 -
          sum(w['prompt_tokens_computed'] for w in workers.values()) /
          sum(w['prompt_tokens'] for w in workers.values()),
          'simulated_hit_rate': figures['hit_rate'],
          'simulated_prompt_tokens_computed': figures['prompt_tokens_computed'],
          'workers': workers,
      }
    out[frame.name] = {
        'throughput_ratio': arms_out['baseline']['busiest_worker_s'] /
        arms_out['default']['busiest_worker_s'],
        'arms': {
            name: {
                'throughput_ratio': arms_out['baseline']['busiest_worker_s'] /
                arm['busiest_worker_s'],
                'simulated_ratio': chosen['placed']['baseline'][1]
                ['busiest_worker_work'] /
                chosen['placed'][name][1]['busiest_worker_work'],
            }
            for name, arm in arms_out.items()
        },
        'simulated_ratio': chosen['simulated_ratio'],
        'workers': workload.workers,
        'requests': workload.requests,
        'max_in_flight': MAX_IN_FLIGHT,
    }
    details[frame.name] = {
        'seed': chosen['seed'],
        'salt': chosen['salt'],
        'simulated_ratios': chosen['simulated_ratios'],
        'time_scale': scale,
        'arms': arms_out,
    }
  return out, {
      'workload': workload.describe(),
      'rate_per_worker': rate_per_worker,
      'saturation': SATURATION,
      'repetitions': repetitions,
      'model': MODEL,
      'max_num_seqs': MAX_NUM_SEQS,
      'kv_pool_blocks': workload.cache_blocks,
      'calibration': calibration,
      'frames': details,
  }
