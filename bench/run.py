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

"""What prefix-aware batching buys, and what it costs: `tox -e bench`.

Runs on the patched tree (build/beam), side by side in one run:

A. Routing and cache reuse: batches from the real transforms on the
   FnApiRunner, placed on a modelled fleet of LLM servers with prefix caches
   (bench/prefix_cache.py), for the reference workloads W1 and W2.
B. A real engine: a Beam pipeline with RunInference against a vLLM server on
   127.0.0.1, unkeyed and keyed, alternating repetitions.
C. Overhead: keyed BatchElements against today's stateful and stateless
   implementations, alternating repetitions.
D. Key cost: PromptPrefixKeyFn on a 1 KB and an 8 MB prompt, and
   ChatPrefixKeyFn.

Writes build/bench/results.json, report.md and the plots. --quick runs the
same measurements at a smaller scale.
"""

import argparse
import os
import pickle
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / 'bench'))
sys.path.insert(0, str(ROOT))
# pylint: disable=wrong-import-position
import prefix_cache
from prefix_cache import Batch

import apache_beam as beam
from apache_beam import coders
from apache_beam.ml.inference.base import RunInference
from apache_beam.ml.inference.prefix_batching import ChatPrefixKeyFn
from apache_beam.ml.inference.prefix_batching import PrefixBatchingConfig
from apache_beam.ml.inference.prefix_batching import PromptPrefixKeyFn
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.transforms import util
from apache_beam.utils import subprocess_server
from integration import engines

OUT = ROOT / 'build' / 'bench'
SHARDS = (1, 2, 4, 8, 16, 32)
STARTED = time.monotonic()


def progress(message: str) -> None:
  print(f'[bench {time.monotonic() - STARTED:6.1f}s] {message}', flush=True)


def check_tree() -> None:
  tree = ROOT / 'build' / 'beam' / 'sdks' / 'python'
  if not Path(beam.__file__).resolve().is_relative_to(tree):
    sys.exit(
        f'bench: apache_beam comes from {beam.__file__}, not {tree}; '
        'run it through `tox -e bench`')


def run_pipeline(build) -> list:
  """Runs build(pipeline) -> PCollection on the FnApiRunner; returns its
  elements."""
  with tempfile.TemporaryDirectory() as scratch:
    path = os.path.join(scratch, 'out.pickle')
    with beam.Pipeline(runner=FnApiRunner()) as pipeline:
      _ = (
          build(pipeline)
          | beam.combiners.ToList()
          | beam.Map(_write_pickle, path))
    with open(path, 'rb') as f:
      return pickle.load(f)


def _write_pickle(elements, path):
  with open(path, 'wb') as f:
    pickle.dump(elements, f)


# --------------------------------------------------------------------------
# A. Routing and cache reuse.


def _prefix(request):
  return request[1]


def _keep_state_key(keyed):
  state_key, request = keyed
  return state_key, (state_key, request)


def keyed_batches(workload, requests, num_shards) -> list[Batch]:
  """Batches as BatchElements(key_fn=prefix, num_shards=num_shards) makes
  them, each with the state key that routes it.

  BatchElements(key_fn=...) expands to ParDo(WithBatchKey) followed by the
  stateful batching DoFn, and drops the state key. This applies those two
  ParDos with the same arguments and copies the state key into each element
  between them, so that each batch can be placed where its key routes it.
  """
  size = workload.batch_size

  def build(pipeline):
    keyed = (
        pipeline
        | beam.Create(requests, reshuffle=False)
        | beam.ParDo(util.WithBatchKey(_prefix, num_shards)).with_output_types(
            tuple[tuple[str, int], tuple[int, int]]))
    return (
        keyed
        | beam.Map(_keep_state_key).with_output_types(
            tuple[tuple[str, int], tuple[tuple[str, int], tuple[int, int]]])
        | beam.ParDo(
            util._pardo_stateful_batch_elements(
                coders.FastPrimitivesCoder(),
                util._BatchSizeEstimator(
                    min_batch_size=size, max_batch_size=size),
                util._DEFAULT_KEYED_MAX_BATCH_DURATION_SECS))
        | beam.Map(lambda batch: (batch[0][0], [r for _, r in batch])))

  return [
      Batch(prefix_cache.worker_of(state_key, workload.workers), batch)
      for state_key, batch in run_pipeline(build)
  ]


def batch_elements_batches(workload, requests) -> list:
  """The batches of BatchElements(key_fn=prefix) itself, one shard."""
  size = workload.batch_size
  return run_pipeline(
      lambda pipeline: pipeline
      | beam.Create(requests, reshuffle=False)
      | util.BatchElements(
          min_batch_size=size, max_batch_size=size, key_fn=_prefix))


def baseline_batches(workload, requests) -> list[Batch]:
  """Today's batching: every request lands on a uniformly random worker,
  whose BatchElements batches what it gets."""
  rng = random.Random(workload.seed + 1)
  placed = [(request, prefix, rng.randrange(workload.workers))
            for request, prefix in requests]
  size = workload.batch_size

  def build(pipeline):
    parts = (
        pipeline
        | beam.Create(placed, reshuffle=False)
        | beam.Partition(lambda e, n: e[2], workload.workers))
    return [
        part
        | f'Batch{w}' >> util.BatchElements(
            min_batch_size=size, max_batch_size=size)
        | f'Place{w}' >>
        beam.Map(lambda batch, w=w: (w, [(r, p) for r, p, _ in batch]))
        for w, part in enumerate(parts)
    ] | beam.Flatten()

  return [Batch(w, batch) for w, batch in run_pipeline(build)]


def routing(workload) -> tuple[dict, dict]:
  prefixes = workload.prefix_of_requests()
  requests = list(enumerate(prefixes))
  figures = {}
  progress(
      f'A {workload.name}: baseline ({workload.requests} requests, '
      f'{workload.workers} workers)')
  figures['baseline'] = prefix_cache.evaluate(
      workload, baseline_batches(workload, requests))
  notes = {}
  for shards in SHARDS:
    progress(f'A {workload.name}: keyed, {shards} shards')
    batches = keyed_batches(workload, requests, shards)
    figures[f'keyed_{shards}'] = prefix_cache.evaluate(workload, batches)
    if shards == 1:
      real = batch_elements_batches(workload, requests)
      notes['composition_matches_batch_elements'] = sorted(
          sorted(b)
          for b in real) == sorted(sorted(b.requests) for b in batches)
  figures['bound'] = prefix_cache.bound(workload, prefixes)
  notes['distinct_prefixes'] = len(set(prefixes))
  return figures, notes


# --------------------------------------------------------------------------
# B. A real engine: vLLM on this CPU.

HITS = 'vllm:prefix_cache_hits_total'
QUERIES = 'vllm:prefix_cache_queries_total'

ENGINE_GPU_BLOCKS = 40


def start_vllm(model, port, gpu_blocks=ENGINE_GPU_BLOCKS) -> subprocess.Popen:
  """Starts vLLM's OpenAI server; wait_for_vllm waits until it serves."""
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
      '8',
  ]
  for flag, value in engines.VLLM_CPU_SERVER_KWARGS.items():
    command += [f'--{flag}'] + ([] if value is None else [value])
  OUT.mkdir(parents=True, exist_ok=True)
  with open(OUT / 'vllm-server.log', 'w') as log:
    return subprocess.Popen(
        command,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=dict(engines.environ_for_vllm(), VLLM_SERVER_DEV_MODE='1'))


def wait_for_vllm(server: subprocess.Popen, port: int) -> None:
  deadline = time.monotonic() + 600
  while time.monotonic() < deadline:
    if server.poll() is not None:
      raise RuntimeError(f'vLLM exited; see {OUT / "vllm-server.log"}')
    try:
      urllib.request.urlopen(f'http://127.0.0.1:{port}/v1/models', timeout=5)
      return
    except OSError:
      time.sleep(2)
  server.kill()
  raise RuntimeError('vLLM did not start in 10 minutes')


def engine_prompts(count, templates, rng) -> list[str]:
  heads = [
      f'Template {t}: ' +
      ''.join(rng.choice('abcdefghijklmnopqrstuvwxyz ') for _ in range(240))
      for t in range(templates)
  ]
  return [
      f'{heads[rng.randrange(templates)]}\n\nRequest {i}: ' +
      ''.join(rng.choice('abcdefghijklmnopqrstuvwxyz') for _ in range(24))
      for i in range(count)
  ]


def engine_arm(model, port, prompts, keyed) -> dict[str, float]:
  urllib.request.urlopen(
      urllib.request.Request(
          f'http://127.0.0.1:{port}/reset_prefix_cache', method='POST'),
      timeout=30)
  before = engines.prometheus_counters(port, (HITS, QUERIES))
  # Imported here: vllm_inference imports vllm and torch, and Beam's state
  # cache walks every loaded module's globals whenever it sizes an entry,
  # which would slow phases A and C down.
  from vllm_handler import BenchVLLMHandler  # pylint: disable=import-outside-toplevel
  handler = BenchVLLMHandler(
      str(model),
      port,
      min_batch_size=8,
      max_batch_size=8,
      prefix_batching_config=(
          PrefixBatchingConfig(num_shards=1) if keyed else None))
  started = time.perf_counter()
  outputs = run_pipeline(
      lambda pipeline: pipeline
      | beam.Create(prompts, reshuffle=False)
      | RunInference(
          handler, inference_args={
              'max_tokens': 1, 'temperature': 0
          })
      | beam.Map(lambda result: result.example))
  wall = time.perf_counter() - started
  if sorted(outputs) != sorted(prompts):
    raise RuntimeError('the engine lost or duplicated requests')
  after = engines.prometheus_counters(port, (HITS, QUERIES))
  hits, queries = after[HITS] - before[HITS], after[QUERIES] - before[QUERIES]
  return {
      'prompt_tokens_computed': queries - hits,
      'hit_rate': hits / queries,
      'wall_s': wall,
  }


def engine(quick: bool, server: subprocess.Popen, model: Path,
           port: int) -> tuple[dict, dict]:
  rng = random.Random(40905)
  prompts = engine_prompts(48 if quick else 160, 6, rng)
  repetitions = 2 if quick else 5
  progress('B: waiting for vLLM')
  wait_for_vllm(server, port)
  runs: dict[str, list] = {'unkeyed': [], 'keyed': []}
  for repetition in range(repetitions):
    for arm in ('unkeyed', 'keyed'):
      progress(f'B: {arm}, repetition {repetition + 1}/{repetitions}')
      runs[arm].append(engine_arm(model, port, prompts, arm == 'keyed'))
  figures = {
      arm: {
          name: float(statistics.median(run[name] for run in arm_runs))
          for name in ('prompt_tokens_computed', 'hit_rate', 'wall_s')
      }
      for arm, arm_runs in runs.items()
  }
  return {'name': 'vllm-cpu 0.32.0', **figures}, {
      'prompts': len(prompts), 'templates': 6, 'repetitions': repetitions,
      'runs': runs
  }


# --------------------------------------------------------------------------
# C. Overhead, and D. key cost.


def overhead(quick: bool) -> tuple[dict, dict]:
  count = 3_000 if quick else 100_000
  repetitions = 3 if quick else 5
  elements = [(i, f'prefix-{i % 64}') for i in range(count)]
  variants = {
      'stateless': {},
      'stateful': {
          'max_batch_duration_secs': 1
      },
      'keyed': {
          'key_fn': _prefix, 'num_shards': 8
      },
      'keyed_one_shard': {
          'key_fn': _prefix
      },
  }
  times: dict[str, list[float]] = {name: [] for name in variants}
  for repetition in range(repetitions):
    for name, kwargs in variants.items():
      progress(f'C: {name}, {count} elements, repetition {repetition + 1}')
      started = time.perf_counter()
      with beam.Pipeline(runner=FnApiRunner()) as pipeline:
        _ = (
            pipeline
            | beam.Create(elements, reshuffle=False)
            | util.BatchElements(min_batch_size=8, max_batch_size=8, **kwargs)
            | beam.combiners.Count.Globally())
      times[name].append(time.perf_counter() - started)
  medians = {name: statistics.median(t) for name, t in times.items()}
  return {
      'keyed_over_stateful': medians['keyed'] / medians['stateful'],
      'keyed_over_stateless': medians['keyed'] / medians['stateless'],
  }, {
      'elements': count, 'keys': 64 * 8, 'medians_s': medians, 'times_s': times
  }


def _per_call(fn, argument, number) -> float:
  timings = timeit.repeat(lambda: fn(argument), number=number, repeat=7)
  return statistics.median(timings) / number


def key_cost(quick: bool) -> tuple[dict, dict]:
  progress('D: key functions')
  number = 2_000 if quick else 20_000
  head = 'You answer questions about Apache Beam. ' * 5
  small = (head + 'x' * 1024)[:1024]
  huge = head + 'x' * (8 << 20)
  chat = [
      {
          'role': 'system', 'content': head + 'Be brief.'
      },
      {
          'role': 'user', 'content': 'What is a PCollection?'
      },
  ]
  prompt_key = PromptPrefixKeyFn()
  seconds = {
      'prompt_1kb': _per_call(prompt_key, small, number),
      'prompt_8mb': _per_call(prompt_key, huge, number),
      'chat': _per_call(ChatPrefixKeyFn(), chat, number),
  }
  return {
      'prompt_8mb_over_1kb': seconds['prompt_8mb'] / seconds['prompt_1kb']
  }, {
      'per_call_us': {
          name: s * 1e6
          for name, s in seconds.items()
      }
  }


# --------------------------------------------------------------------------
# Report.

STRATEGY_LABELS = {
    'baseline': "today's BatchElements (per worker)",
    **{
        f'keyed_{n}': f'keyed, {n} shard{"s" if n > 1 else ""}'
        for n in SHARDS
    },
    'bound': 'bound: each prefix computed once',
}


def _shard_panel(ax, figures, metric, ylabel, title):
  """Plots a metric of the keyed strategies against the shard count, with
  today's batching as a line and the default of 8 marked."""
  ax.plot(
      SHARDS, [figures[f'keyed_{n}'][metric] for n in SHARDS],
      'o-',
      label='keyed')
  ax.axhline(
      figures['baseline'][metric],
      color='red',
      ls='--',
      label="today's batching")
  ax.axvline(8, color='grey', lw=0.5)
  ax.set(
      xscale='log',
      xticks=SHARDS,
      xticklabels=SHARDS,
      xlabel='shards per prefix (num_shards)',
      ylabel=ylabel,
      title=title)


def plot(results: dict, out: Path) -> list[Path]:
  # pylint: disable=import-outside-toplevel
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  paths = []
  for name, figures in results['workloads'].items():
    fig, (hit_ax, load_ax) = plt.subplots(1, 2, figsize=(10, 4))
    _shard_panel(
        hit_ax,
        figures,
        'hit_rate',
        'prompt-token cache hit rate',
        f'{name}: reuse')
    hit_ax.axhline(
        figures['bound']['hit_rate'], color='green', ls=':', label='bound')
    hit_ax.set(ylim=(0, 1))
    hit_ax.legend()
    _shard_panel(
        load_ax,
        figures,
        'load_max_over_mean',
        'worker load, max / mean',
        f'{name}: balance')
    load_ax.legend()
    fig.tight_layout()
    path = out / f'{name.lower()}_shards.png'
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)
  arms = results['engine']
  fig, axes = plt.subplots(1, 3, figsize=(10, 3.5))
  for ax, (metric,
           label) in zip(axes,
                         (('prompt_tokens_computed', 'prompt tokens computed'),
                          ('hit_rate', 'prefix-cache hit rate'),
                          ('wall_s', 'wall time (s)'))):
    ax.bar(['unkeyed', 'keyed'],
           [arms['unkeyed'][metric], arms['keyed'][metric]],
           color=['red', 'tab:blue'])
    ax.set_title(label)
  fig.suptitle(f'{arms["name"]}: RunInference, unkeyed vs keyed (medians)')
  fig.tight_layout()
  path = out / 'engine.png'
  fig.savefig(path, dpi=110)
  plt.close(fig)
  paths.append(path)
  return paths


def report(results: dict, notes: dict, args, plots: list[Path]) -> str:
  lines = [
      '# Prefix-aware batching: benchmark report',
      '',
      f'Command: `{" ".join(["tox -e bench"] + (["-- --quick"] if args.quick else []))}`'
      f' ({"quick scale" if args.quick else "full scale"}), '
      f'{time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}, '
      f'{time.monotonic() - STARTED:.0f} s.',
      f'Machine: {platform.machine()}, {os.cpu_count()} cores, '
      f'{platform.python_implementation()} {platform.python_version()}, '
      f'apache_beam from the patched tree, pure-Python (no compiled '
      f'extensions).',
      '',
      '## A. Routing and cache reuse (real transforms, modelled fleet)',
      '',
      'Batches come from the patched transforms on the FnApiRunner: '
      '`WithBatchKey` and the stateful batching DoFn, which '
      '`BatchElements(key_fn=..., num_shards=...)` expands to, with the '
      'state key copied into each element between them so that the batch '
      'can be placed on the worker a runner routes its key to (a stable hash '
      'of the state key). Today\'s batching is `BatchElements` run per '
      'worker, each request landing on a uniformly random worker. Each '
      "worker's server is modelled by bench/prefix_cache.py: 16-token "
      'content-hashed blocks, LRU, room for a fixed number of prefixes.',
      '',
  ]
  for name, figures in results['workloads'].items():
    w = notes['workloads'][name]
    lines += [
        f'### {name}: {w["prefixes"]} prefixes (Zipf {w["zipf_s"]}), '
        f'{w["prefix_tokens"]}-token prefixes, {w["suffix_tokens"]}-token '
        f'suffixes, {w["requests"]} requests, {w["workers"]} workers, '
        f'caches of {w["cache_prefixes"]} prefixes, batches of '
        f'{w["batch_size"]}',
        '',
        '| strategy | hit rate | load max/mean | purity | mean batch size |',
        '|---|---|---|---|---|',
    ]
    for strategy, label in STRATEGY_LABELS.items():
      row = figures[strategy]
      if strategy == 'bound':
        lines.append(f'| {label} | {row["hit_rate"]:.3f} | | | |')
      else:
        lines.append(
            f'| {label} | {row["hit_rate"]:.3f} | '
            f'{row["load_max_over_mean"]:.2f} | {row["purity"]:.3f} | '
            f'{row["mean_batch_size"]:.2f} |')
    lines += [
        '',
        f'{w["distinct_prefixes"]} distinct prefixes were drawn. The keyed '
        'batches with 1 shard equal those of `BatchElements(key_fn=...)` '
        'itself: '
        f'{"yes" if w["composition_matches_batch_elements"] else "NO"}.',
        '',
        f'![{name}]({name.lower()}_shards.png)',
        '',
    ]
  engine_notes = notes['engine']
  arms = results['engine']
  lines += [
      f'## B. A real engine: {arms["name"]}',
      '',
      'A FnApiRunner pipeline with `RunInference(VLLMCompletionsModelHandler)` '
      'against one vLLM CPU server on 127.0.0.1 (a tiny random-weight Llama '
      'made locally, character-level tokens, 32-token blocks, a KV pool of '
      f'{ENGINE_GPU_BLOCKS} blocks so that prefixes evict each other, at most '
      f'8 running sequences). {engine_notes["prompts"]} prompts, each one of '
      f'{engine_notes["templates"]} 250-character templates and a blank '
      'line, then a unique request; batches of 8; `max_tokens=1`. Unkeyed: '
      'today\'s batching. Keyed: `prefix_batching_config='
      'PrefixBatchingConfig(num_shards=1)`. The prefix cache is reset before '
      f'every run; {engine_notes["repetitions"]} repetitions per arm, '
      'alternating; medians. Counters: `vllm:prefix_cache_queries_total` and '
      '`vllm:prefix_cache_hits_total` (prompt tokens).',
      '',
      '| arm | prompt tokens computed | hit rate | wall time (s) |',
      '|---|---|---|---|',
  ]
  for arm in ('unkeyed', 'keyed'):
    row = arms[arm]
    lines.append(
        f'| {arm} | {row["prompt_tokens_computed"]:.0f} | '
        f'{row["hit_rate"]:.3f} | {row["wall_s"]:.2f} |')
  lines += ['', '![engine](engine.png)', '']
  over = notes['overhead']
  lines += [
      '## C. Overhead',
      '',
      f'{over["elements"]} elements through `BatchElements(min_batch_size=8, '
      'max_batch_size=8)` on the FnApiRunner: stateless (default), stateful '
      '(`max_batch_duration_secs=1`, one key per worker) and keyed (64 keys '
      f'x 8 shards = {over["keys"]} state keys; and, for comparison, the same '
      '64 keys with one shard each); alternating repetitions, median wall '
      'time.',
      '',
      '| variant | median (s) | all runs (s) |',
      '|---|---|---|',
  ]
  for name, median in over['medians_s'].items():
    runs = ', '.join(f'{t:.2f}' for t in over['times_s'][name])
    lines.append(f'| {name} | {median:.2f} | {runs} |')
  over_results = results['overhead']
  lines += [
      '',
      f'keyed / stateful = {over_results["keyed_over_stateful"]:.2f}, '
      f'keyed / stateless = {over_results["keyed_over_stateless"]:.2f}.',
      '',
      '## D. Key cost',
      '',
      '| key function | median per call (µs) |',
      '|---|---|',
  ]
  for name, micros in notes['key_cost']['per_call_us'].items():
    lines.append(f'| {name} | {micros:.2f} |')
  lines += [
      '',
      'PromptPrefixKeyFn on an 8 MB prompt / on a 1 KB prompt = '
      f'{results["key_cost"]["prompt_8mb_over_1kb"]:.2f}.',
      '',
      '## What the numbers mean',
      '',
      '* hit rate: prompt tokens served from a prefix cache / all prompt '
      'tokens.',
      '* load max/mean: requests on the busiest worker / the mean over '
      'workers (1.0 is perfect balance).',
      '* purity: share of batches whose requests all share one prefix.',
      '* mean batch size: requests per batch (partial batches are flushed '
      'when the input ends).',
      '* bound: the hit rate if every distinct prefix were computed exactly '
      'once, fleet-wide.',
      '',
      'Files: ' + ', '.join(f'`{p.name}`' for p in plots) + ', `results.json`.',
  ]
  return '\n'.join(lines) + '\n'


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument(
      '--quick',
      action='store_true',
      help='the same measurements at a smaller scale (a few minutes)')
  parser.add_argument('--out', type=Path, default=OUT)
  args = parser.parse_args(argv)
  check_tree()
  args.out.mkdir(parents=True, exist_ok=True)
  workloads = [prefix_cache.W1, prefix_cache.W2]
  if args.quick:
    workloads = [prefix_cache.W1.scaled(1_200), prefix_cache.W2.scaled(1_500)]
  results: dict[str, Any] = {'workloads': {}}
  notes: dict[str, Any] = {'workloads': {}}
  # vLLM takes half a minute to start: it starts now, phase A (which counts,
  # and does not time) runs beside it, and the timed phases run once it has
  # settled.
  model, (port,) = engines.tiny_llama_hf(), subprocess_server.pick_port(None)
  progress('B: starting vLLM (vllm-cpu) on 127.0.0.1 in the background')
  server = start_vllm(model, port)
  try:
    for workload in workloads:
      figures, workload_notes = routing(workload)
      results['workloads'][workload.name] = figures
      notes['workloads'][workload.name] = {**vars(workload), **workload_notes}
    wait_for_vllm(server, port)
    results['overhead'], notes['overhead'] = overhead(args.quick)
    results['key_cost'], notes['key_cost'] = key_cost(args.quick)
    # Last: it loads vllm and torch into this process.
    results['engine'], notes['engine'] = engine(args.quick, server, model, port)
  finally:
    server.terminate()
    server.wait(timeout=60)
  engines.dump(args.out / 'results.json', results)
  plots = plot(results, args.out)
  (args.out / 'report.md').write_text(report(results, notes, args, plots))
  engines.dump(args.out / 'notes.json', notes)
  progress(
      f'wrote {args.out / "results.json"}, report.md and {len(plots)} '
      'plots')
  return 0


if __name__ == '__main__':
  sys.exit(main())
