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

"""Phases C and D: what keyed batching costs the runner, and what the key
functions cost.

C times BatchElements on the FnApiRunner, in two worker processes
(bench.overhead_worker): one imports pristine 2.77.0 (build/base), whose
stateful BatchElements is the denominator of every ratio, and one the
patched tree (build/beam). The workers take the runs of each repetition in
turn, one at a time, in an order that rotates from one repetition to the
next, and each run is a fork of its worker, so both trees are timed alike
and the patch set's changes to the unkeyed path cannot move the ratios.
Each ratio is taken repetition by repetition (a run over the same
repetition's denominator) and reported as the median with its 10th-90th
percentile and min-max.

Two blocks of runs (RUNS):

* min_batch_size = max_batch_size = 8 over elements interleaved across 64
  prefixes: the base's stateful path (one shared key) and the patched tree's,
  and keyed with 8 shards per prefix (512 state keys), 1 (64) and
  PrefixBatchingConfig()'s num_shards, read from the tree.
* min_batch_size=1, max_batch_size=64, 16 elements per prefix: 10,000
  interleaved prefixes keyed with one shard each (10,000 state keys) over
  the base's stateful path on the same elements, and the mean batch at
  10,000 prefixes over the mean batch at 64 (batches counted).

D times the key functions in this process.
"""

import json
import os
import statistics
import subprocess
import sys
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXED_PREFIXES = 64
ELEMENTS_PER_PREFIX = 16
_FIXED = {'min_batch_size': 8, 'max_batch_size': 8}
_ADAPTIVE = {'min_batch_size': 1, 'max_batch_size': 64}
# The unkeyed stateful path buffers for up to 1 s, as keyed batching does by
# default.
_STATEFUL = {'max_batch_duration_secs': 1}


def runs(quick: bool) -> dict[str, dict]:
  """Every run of a repetition: the tree it runs on, BatchElements'
  arguments, whether it is keyed by prefix, the prefixes and the elements."""
  fixed = 3_000 if quick else 30_000
  # Quick keeps more prefixes than the 1,000 state keys the patched tree
  # once kept learned sizes for.
  many = 1_200 if quick else 10_000
  return {
      'stateful': {
          'tree': 'base',
          'batch': {
              **_FIXED, **_STATEFUL
          },
          'keys': FIXED_PREFIXES,
          'elements': fixed,
      },
      'patched_stateful': {
          'tree': 'patched',
          'batch': {
              **_FIXED, **_STATEFUL
          },
          'keys': FIXED_PREFIXES,
          'elements': fixed,
      },
      'keyed_512': {
          'tree': 'patched',
          'batch': {
              **_FIXED, 'num_shards': 8
          },
          'keyed': True,
          'keys': FIXED_PREFIXES,
          'elements': fixed,
      },
      'keyed_64': {
          'tree': 'patched',
          'batch': {
              **_FIXED, 'num_shards': 1
          },
          'keyed': True,
          'keys': FIXED_PREFIXES,
          'elements': fixed,
      },
      'default': {
          'tree': 'patched',
          'batch': {
              **_FIXED, 'num_shards': 'default'
          },
          'keyed': True,
          'keys': FIXED_PREFIXES,
          'elements': fixed,
      },
      'stateful_adaptive': {
          'tree': 'base',
          'batch': {
              **_ADAPTIVE, **_STATEFUL
          },
          'keys': many,
          'elements': many * ELEMENTS_PER_PREFIX,
      },
      'keyed_10000': {
          'tree': 'patched',
          'batch': {
              **_ADAPTIVE, 'num_shards': 1
          },
          'keyed': True,
          'keys': many,
          'elements': many * ELEMENTS_PER_PREFIX,
      },
      'keyed_64_adaptive': {
          'tree': 'patched',
          'batch': {
              **_ADAPTIVE, 'num_shards': 1
          },
          'keyed': True,
          'keys': FIXED_PREFIXES,
          'elements': FIXED_PREFIXES * ELEMENTS_PER_PREFIX,
      },
  }


# The ratios reported: name -> (numerator run, denominator run, measure).
RATIOS = {
    'keyed_512_over_stateful': ('keyed_512', 'stateful', 'seconds'),
    'keyed_64_over_stateful': ('keyed_64', 'stateful', 'seconds'),
    'default_over_stateful': ('default', 'stateful', 'seconds'),
    'patched_stateful_over_stateful': (
        'patched_stateful', 'stateful', 'seconds'),
    'keyed_10000_over_stateful': (
        'keyed_10000', 'stateful_adaptive', 'seconds'),
    'keyed_10000_mean_batch_over_64': (
        'keyed_10000', 'keyed_64_adaptive', 'mean_batch'),
}


def schedule(names: list[str], repetitions: int) -> list[tuple[int, str]]:
  """(repetition, run) in the order they run: every run once per
  repetition, the order rotated by one each repetition so that no run is
  always first or always follows the same one."""
  return [(r, names[(r + i) % len(names)]) for r in range(repetitions)
          for i in range(len(names))]


def percentile(values: list[float], q: float) -> float:
  """The q-th percentile (0-100) of values, linearly interpolated."""
  ordered = sorted(values)
  if not ordered:
    raise ValueError('percentile of no values')
  position = (len(ordered) - 1) * q / 100
  low = int(position)
  high = min(low + 1, len(ordered) - 1)
  return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(numerators: list[float], denominators: list[float]) -> dict:
  """Per-repetition ratios of two runs and their median, 10th and 90th
  percentiles, min and max."""
  if len(numerators) != len(denominators) or not numerators:
    raise ValueError(
        f'{len(numerators)} numerators for {len(denominators)} denominators')
  ratios = [a / b for a, b in zip(numerators, denominators)]
  return {
      'median': statistics.median(ratios),
      'p10': percentile(ratios, 10),
      'p90': percentile(ratios, 90),
      'min': min(ratios),
      'max': max(ratios),
      'per_repetition': ratios,
  }


def measures(result: dict, state_keys) -> dict:
  """A run's figures: seconds, mean batch and state-cache weighings per
  state key (None where the number of state keys is not known)."""
  return {
      'seconds': result['seconds'],
      'mean_batch': result['elements'] / result['batches'],
      'batches': result['batches'],
      'weighings_per_state_key': (
          result['weighings'] / state_keys if state_keys else None),
  }


def state_keys(run: dict, default_num_shards):
  """How many state keys a run has: one shared key unkeyed, prefixes times
  shards keyed (None for a num_shards policy)."""
  if not run.get('keyed'):
    return 1
  shards = run['batch'].get('num_shards', 1)
  if shards == 'default':
    shards = default_num_shards
  return run['keys'] * shards if isinstance(shards, int) else None


def figures(
    plan: dict,
    measured: dict[str, list[dict]],
    repetitions: int,
    default_num_shards) -> tuple[dict, dict]:
  """results.json's `overhead` (each ratio's median) and `overhead_runs`
  (the runs, their figures repetition by repetition, each ratio's
  interval), from what every run measured."""
  ratios = {
      name: summarize([m[measure]
                       for m in measured[a]], [m[measure] for m in measured[b]])
      for name, (a, b, measure) in RATIOS.items()
  }
  overhead = {name: ratio['median'] for name, ratio in ratios.items()}
  keyed_512 = [m['weighings_per_state_key'] for m in measured['keyed_512']]
  overhead['state_cache_weighings_per_key'] = statistics.median(keyed_512)
  return overhead, {
      'repetitions': repetitions,
      'default_num_shards': repr(default_num_shards),
      'runs': {
          name: {
              **plan[name],
              'state_keys': state_keys(plan[name], default_num_shards),
              'median_s': statistics.median(
                  m['seconds'] for m in measured[name]),
              'measured': measured[name],
          }
          for name in plan
      },
      'ratios': ratios,
  }


RUN_WORKER = (
    'import sys; from bench import overhead_worker as w; sys.exit(w.main())')


class Worker:
  """A bench.overhead_worker process on one tree."""
  def __init__(self, sdk: Path):
    self.sdk = sdk.resolve()
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(self.sdk), str(ROOT)]))
    self.process = subprocess.Popen([sys.executable, '-c', RUN_WORKER],
                                    cwd=ROOT,
                                    env=env,
                                    stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE,
                                    text=True)
    imported = Path(self._read()['apache_beam']).resolve()
    if self.sdk not in imported.parents:
      self.close()
      raise RuntimeError(f'the worker for {self.sdk} imported {imported}')

  def _read(self) -> dict:
    assert self.process.stdout is not None
    for line in self.process.stdout:
      if line.startswith('{'):
        return json.loads(line)
    raise RuntimeError(f'the worker for {self.sdk} exited')

  def run(self, run: dict) -> dict:
    assert self.process.stdin is not None
    self.process.stdin.write(json.dumps(run) + '\n')
    self.process.stdin.flush()
    result = self._read()
    if 'error' in result:
      raise RuntimeError(f'{run}: {result["error"]}')
    return result

  def close(self):
    if self.process.stdin:
      self.process.stdin.close()
    self.process.wait(timeout=60)


def overhead(
    quick: bool,
    progress,
    base_sdk: Path,
    patched_sdk: Path,
    default_num_shards) -> tuple[dict, dict]:
  repetitions = 3 if quick else 15
  plan = runs(quick)
  measured: dict[str, list[dict]] = {name: [] for name in plan}
  workers = {'base': Worker(base_sdk), 'patched': Worker(patched_sdk)}
  try:
    order = schedule(list(plan), repetitions)
    for r, name in order:
      run = plan[name]
      progress(
          f'C: repetition {r + 1}/{repetitions}, {name} on the '
          f'{run["tree"]} tree, {run["elements"]} elements')
      result = workers[run['tree']].run(run)
      measured[name].append(
          measures(result, state_keys(run, default_num_shards)))
  finally:
    for worker in workers.values():
      worker.close()
  overhead_figures, runs_ = figures(plan, measured, repetitions,
                                    default_num_shards)
  runs_['order'] = [name for _, name in order[:len(plan)]]
  return overhead_figures, runs_


def _per_call(fn, argument, number) -> float:
  timings = timeit.repeat(lambda: fn(argument), number=number, repeat=7)
  return statistics.median(timings) / number


def key_cost(quick: bool, progress) -> tuple[dict, dict]:
  from apache_beam.ml.inference.prefix_batching import ChatPrefixKeyFn
  from apache_beam.ml.inference.prefix_batching import PromptPrefixKeyFn
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


def _trees() -> tuple[Path, Path]:
  """build/base (extracted from build/beam's base when missing) and the
  patched tree's sdk folders."""
  from beampq.gates.workspace import Workspace
  from beampq.project import Project
  ws = Workspace.open(Project(ROOT))
  return ws.base_sdk, ws.sdk


def main(argv=None) -> int:
  """Runs C and D in a process of their own, so that what the rest of the
  benchmark loaded does not weigh on the state cache; writes them as JSON."""
  import argparse
  parser = argparse.ArgumentParser(prog='python -m bench.overhead')
  parser.add_argument('--quick', action='store_true')
  parser.add_argument('--out', required=True)
  args = parser.parse_args(argv)

  def progress(message):
    print(f'[bench.overhead] {message}', flush=True)

  from apache_beam.ml.inference.prefix_batching import PrefixBatchingConfig
  base_sdk, patched_sdk = _trees()
  results = {}
  results['overhead'], results['overhead_runs'] = overhead(
      args.quick, progress, base_sdk, patched_sdk,
      PrefixBatchingConfig().num_shards)
  results['key_cost'], results['key_cost_runs'] = key_cost(args.quick, progress)
  with open(args.out, 'w') as f:
    json.dump(results, f)
  return 0


if __name__ == '__main__':
  sys.exit(main())
