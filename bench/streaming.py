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

"""Phase A (v3): every strategy in every frame, placement and sweep point.

For each workload and seed, every strategy forms its batches from the same
timed requests (fleet.form_batches over a route of bench.policies), and
every frame of bench.frames places them, once per salt: a placement is a
(seed, salt) pair. Throughput against the baseline is taken placement by
placement, the baseline placed in the same frame with the same salt; the
figures are medians over placements, with the min and max of the ratio.

Work is shared where the figures cannot differ: a strategy whose batches do
not depend on the number of DoFn copies forms them once, F1 and the F2
variants place a keyed strategy's state keys as F2 does, and the oracle's
placement is its own (LPT) in every frame.
"""

import dataclasses
import multiprocessing
import statistics
import time
from typing import Callable

from bench import fleet
from bench import frames
from bench import policies
from bench.workloads import MICROS

# The strategies of the frame tables, in report order.
TABLE = ('baseline', 'stateless', 'default', 'keyed_8', 'adaptive', 'oracle')
# The strategies of the sweep: the figures sweep_min and cache_x8 report,
# and #40905's reviewed 8 shards beside them.
SWEEP = ('baseline', 'default', 'keyed_8')
FIELDS = (
    'hit_rate',
    'load_max_over_mean',
    'mean_batch_size',
    'p50_delay_s',
    'p99_delay_s',
    'purity',
    'state_keys',
    'prompt_tokens_computed',
)
# The stateless path's bundles: what one copy reads in this long.
BUNDLE_S = 0.1


@dataclasses.dataclass(frozen=True)
class Strategy:
  """build(workload, requests, copies, seed) -> route. per_copy: its
  batches depend on how many DoFn copies read the requests."""
  name: str
  build: Callable
  per_copy: bool = False
  label: str = ''
  # Strategies with the same id form the same batches (a keyed default of
  # 8 shards is keyed_8), which are then formed and placed once.
  same_as: str = ''


def keyed(name, spec, batching, label=''):
  """WithBatchKey (or the two-stage policy) with a num_shards spec as
  BatchElements takes it."""
  def build(workload, requests, copies, seed):
    return policies.route_for(
        spec,
        copies,
        seed,
        batch_size=workload.batch_size,
        buffering_s=batching['buffering_s'])

  return Strategy(
      name,
      build,
      policies.learns_per_copy(spec),
      label,
      f'num_shards={policies.describe(spec)}')


def strategies(default_spec, adaptive_spec, batching) -> dict:
  """name -> Strategy. default_spec: PrefixBatchingConfig()'s num_shards;
  adaptive_spec: 0010's policy at its defaults (None: not in the tree)."""
  out = {
      'baseline': Strategy(
          'baseline', lambda w, r, copies, seed: policies.PerProcessKey(copies),
          True,
          "2.77.0's stateful BatchElements (a UUID key per SDK process)"),
      'stateless': Strategy(
          'stateless',
          None,
          True,
          "2.77.0's stateless BatchElements (per bundle, where read)"),
      'default': keyed(
          'default',
          default_spec,
          batching,
          f'PrefixBatchingConfig() default ({policies.describe(default_spec)})'
      ),
      'keyed_8': keyed('keyed_8', 8, batching, '8 shards per key (#40905)'),
  }
  if adaptive_spec is not None:
    out['adaptive'] = keyed(
        'adaptive',
        adaptive_spec,
        batching,
        f'0010 at its defaults ({policies.describe(adaptive_spec)})')
  out['oracle'] = Strategy(
      'oracle', None, False, 'oracle: known traffic, LPT over measured work')
  return out


def _strip(figures):
  return {
      k: v
      for k, v in figures.items() if k not in ('work_by_key', 'placement')
  }


def run_seed(
    workload,
    rate,
    seed,
    chosen_frames,
    salts,
    costs,
    chosen: dict,
    buffering_s=1.0) -> dict:
  """One workload, rate and seed: {frame: {strategy: [figures per salt]}}."""
  requests = workload.requests_at(rate, seed)
  copies_by_shape = {}
  for frame in chosen_frames:
    shape = (frame.processes, frame.threads)
    if shape not in copies_by_shape:
      copies_by_shape[shape] = frames.copy_of(requests, frame, seed)
  batching_us = round(buffering_s * MICROS)
  batches_cache: dict = {}
  evaluated: dict = {}
  w, cache_blocks = workload.workers, workload.cache_blocks

  def batches_of(strategy, frame):
    shape = (frame.processes, frame.threads)
    on_reader = strategy.name == 'baseline' and frame.baseline_on_reader
    key = (
        strategy.same_as or strategy.name,
        shape if strategy.per_copy else None,
        on_reader)
    if key not in batches_cache:
      copies = copies_by_shape[shape]
      if strategy.name == 'stateless':
        batches_cache[key] = frames.bundle_batches(
            requests, copies, workload.batch_size, round(BUNDLE_S * MICROS))
      elif on_reader:
        batches_cache[key] = fleet.form_batches(
            requests, policies.PerWorkerKey(), workload.batch_size, batching_us)
      else:
        route = strategy.build(workload, requests, copies, seed)
        batches_cache[key] = fleet.form_batches(
            requests, route, workload.batch_size, batching_us)
    return key, batches_cache[key]

  def oracle():
    if 'oracle' not in evaluated:
      route = fleet.OracleRoute(
          requests, w, workload.batch_size, workload.epoch_of)
      batches = fleet.form_batches(
          requests, lambda r: (route(r)[0], 0),
          workload.batch_size,
          batching_us)
      evaluated['oracle'] = _strip(
          frames.lpt_evaluate(
              batches, w, cache_blocks, costs, apart=policies.oracle_group))
    return evaluated['oracle']

  out: dict = {}
  for frame in chosen_frames:
    rows = out[frame.name] = {}
    for name, strategy in chosen.items():
      if name == 'oracle':
        rows[name] = [oracle()] * len(salts)
        continue
      key, batches = batches_of(strategy, frame)
      rows[name] = []
      for salt in salts:
        if name == 'stateless':
          cache_key = (key, 'reader')
        elif name == 'baseline' and frame.baseline_on_reader:
          cache_key = (key, 'reader')
        else:
          cache_key = (key, frame.placement, salt)
        if cache_key not in evaluated:
          if cache_key[1] == 'reader':
            placement = {b.state_key: b.worker for b in batches}
            if name == 'baseline':
              placement = {b.state_key: b.state_key[1] for b in batches}
            figures = frames.evaluate(
                batches, placement, w, cache_blocks, costs)
          else:
            figures = frames.place_and_evaluate(
                batches, frame, salt, w, cache_blocks, costs)
          evaluated[cache_key] = _strip(figures)
        rows[name].append(evaluated[cache_key])
  return out


def summarize(per_seed: list, strategy_names) -> dict:
  """Medians over placements (every seed's salts) for one frame:
  {strategy: {throughput_vs_baseline, throughput_min, throughput_max,
  fields...}}."""
  out = {}
  for name in strategy_names:
    if name not in per_seed[0]:
      continue
    ratios = []
    values: dict = {f: [] for f in FIELDS}
    for rows in per_seed:
      for base, figures in zip(rows['baseline'], rows[name]):
        ratios.append(
            base['busiest_worker_work'] / figures['busiest_worker_work'])
        for f in FIELDS:
          values[f].append(figures[f])
    out[name] = {
        'throughput_vs_baseline': statistics.median(ratios),
        'throughput_min': min(ratios),
        'throughput_max': max(ratios),
        'ratios': ratios,
        **{
            f: statistics.median(v)
            for f, v in values.items()
        },
    }
  return out


# The forked processes of a phase inherit its strategies (closures do not
# pickle).
_STATE: dict = {}


def _task(task):
  workload, rate, seed, frame_names, salts, costs, names = task
  chosen = {n: _STATE['strategies'][n] for n in names}
  chosen_frames = [f for f in frames.FRAMES if f.name in frame_names]
  return run_seed(workload, rate, seed, chosen_frames, salts, costs, chosen)


def _run(tasks, processes, progress, label):
  started = time.monotonic()
  if processes > 1:
    with multiprocessing.get_context('fork').Pool(processes) as pool:
      done = []
      for result in pool.imap(_task, tasks):
        done.append(result)
        progress(
            f'A {label}: {len(done)}/{len(tasks)} '
            f'({time.monotonic() - started:.0f}s)')
      return done
  return [_task(t) for t in tasks]


def sweep_points(workload, rates, middle, cache_factors, zipfs, decodes):
  """(varied, value, workload, rate, decode tokens): one thing at a time."""
  points = [('rate', r, workload, r, 0) for r in rates if r != middle]
  points += [('zipf_s', z, workload.scaled(zipf_s=z), middle, 0) for z in zipfs
             if z != workload.zipf_s]
  points += [(
      'cache',
      f,
      workload.scaled(
          cache_prefixes=max(1, round(workload.cache_prefixes * f))),
      middle,
      0) for f in cache_factors if f != 1]
  points += [('decode_tokens', d, workload, middle, d) for d in decodes if d]
  return points


def phase(
    workloads,
    seeds,
    salts,
    rates,
    cache_factors,
    zipfs,
    decodes,
    strategies_: dict,
    costs: frames.Costs,
    progress=print,
    side_fraction=1.0,
    processes=1) -> dict:
  """Runs phase A: the frames at the middle rate, then the sweep. Returns
  the v3 sections of results.json: frames, sweep, sweep_min, cache_x8."""
  middle = sorted(rates)[len(rates) // 2]
  _STATE['strategies'] = strategies_
  names = [n for n in TABLE if n in strategies_]
  frame_names = [f.name for f in frames.FRAMES]
  tasks = [(w, middle, seed, frame_names, salts, costs, names)
           for w in workloads for seed in seeds]
  done = _run(tasks, processes, progress, 'frames')
  out: dict = {'frames': {}}
  for frame in frames.FRAMES:
    section = out['frames'][frame.name] = {
        'placements': len(seeds) * len(salts),
        'frame': frame.describe(),
    }
    for i, w in enumerate(workloads):
      per_seed = [
          done[i * len(seeds) + j][frame.name] for j in range(len(seeds))
      ]
      section[w.name] = summarize(per_seed, names)
  sweep_names = [n for n in SWEEP if n in strategies_]
  if 'adaptive' in strategies_ and policies.describe(
      strategies_['adaptive']) != policies.describe(strategies_['default']):
    sweep_names.append('adaptive')
  sweep_frames = ['F2', 'F3']
  points = []
  for w in workloads:
    for varied, value, varied_w, rate, decode in sweep_points(
        w, rates, middle, cache_factors + (8, ), zipfs, decodes):
      point = varied_w.scaled(requests=round(varied_w.requests * side_fraction))
      point_costs = dataclasses.replace(costs, decode_tokens=decode)
      points.append((w.name, varied, value, point, rate, point_costs))
  tasks = [(point, rate, seed, sweep_frames, salts, point_costs, sweep_names)
           for _, _, _, point, rate, point_costs in points for seed in seeds]
  done = _run(tasks, processes, progress, 'sweep')
  sweep = []
  for i, (wname, varied, value, point, rate, point_costs) in enumerate(points):
    runs = done[i * len(seeds):(i + 1) * len(seeds)]
    entry = {
        'workload': wname,
        'varied': varied,
        'value': value,
        'rate_per_worker': rate,
        'cache_prefixes': point.cache_prefixes,
        'zipf_s': point.zipf_s,
        'decode_tokens': point_costs.decode_tokens,
        'requests': point.requests,
        'frames': {},
    }
    for frame in sweep_frames:
      entry['frames'][frame] = summarize([r[frame] for r in runs], sweep_names)
    sweep.append(entry)
  out['sweep'] = sweep
  out['sweep_min'], out['cache_x8'] = sweep_figures(
      sweep, out['frames'], [w.name for w in workloads], sweep_frames,
      sweep_names)
  return out


def sweep_figures(sweep, frame_tables, workload_names, sweep_frames, names):
  """sweep_min: per frame and strategy, the least of every sweep point's
  median (cache x8 apart) and of the frame table's own (the middle rate,
  the workload's own cache, Zipf and no decoding), with where it is;
  cache_x8: the cache x8 points."""
  sweep_min: dict = {}
  cache_x8: dict = {}
  for frame in sweep_frames:
    sweep_min[frame] = {}
    cache_x8[frame] = {}
    for name in names:
      if name == 'baseline':
        continue
      candidates = [(
          frame_tables[frame][w][name]['throughput_vs_baseline'], {
              'workload': w, 'varied': 'none', 'value': None
          }) for w in workload_names if name in frame_tables[frame][w]]
      for entry in sweep:
        if entry['varied'] == 'cache' and entry['value'] == 8:
          continue
        row = entry['frames'][frame].get(name)
        if row is not None:
          candidates.append((
              row['throughput_vs_baseline'],
              {
                  'workload': entry['workload'],
                  'varied': entry['varied'],
                  'value': entry['value']
              }))
      value, where = min(candidates, key=lambda c: c[0])
      by_workload = {
          w: min(v for v, at in candidates if at['workload'] == w)
          for w in workload_names
      }
      sweep_min[frame][name] = {
          'throughput_vs_baseline': value,
          'at': where,
          'by_workload': by_workload,
      }
    for entry in sweep:
      if entry['varied'] == 'cache' and entry['value'] == 8:
        cache_x8[frame][entry['workload']] = {
            name: {
                'throughput_vs_baseline': row['throughput_vs_baseline'],
                'throughput_min': row['throughput_min'],
                'throughput_max': row['throughput_max'],
                'hit_rate': row['hit_rate'],
            }
            for name, row in entry['frames'][frame].items()
        }
  return sweep_min, cache_x8
