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

"""Tuning AdaptiveNumShards on benchmark v4, and research runs beside it.

Phase A's tasks for the tuning workloads (W1, W2, W3) at R0_25 and R4, on
two of the tuning seeds, with the tree's AdaptiveNumShards built from the
given keyword arguments; writes the default's median ratio over its
deployment's baseline at every point, as scored and with each state key's
batches run one at a time (deploy.SERIAL; `table --serial`). Run it on
the patched tree (the bench-tree env's Python,
PYTHONPATH=build/beam/sdks/python), one variant per process:

  python -m bench.research_v4 run NAME '{"run_batches": 1}' --out DIR
  python -m bench.research_v4 table DIR NAME ...

`table` prints the variants side by side (bench/RESEARCH.md quotes it).

`fleet` runs one workload's phase A at another fleet size (workers and
requests) with the tree's default, on the seeds given, and `fleet-table`
prints such runs side by side. A run that measures the default as it is
(W2 at 16 and 64 workers) may use evaluation seeds; one that weighs a
design (`--measuring-spread`) uses the tuning seeds, as tuning does:

  python -m bench.research_v4 fleet NAME W2 --workers 64 \
      --requests 512000 --seeds 52301 52302 --out DIR
  python -m bench.research_v4 fleet-table DIR NAME ...

`--input-order sorted` reads batch pipelines' input grouped by key, as a
file sorted by document would give it, where the benchmark reads it in
arrival order (random with respect to the prefix).
`--measuring-shards` and `--measured-whole-batches` run the model of a batch
pipeline with other values of 0013's _MEASURING_SHARDS and
_MEASURED_WHOLE_BATCHES than the tree's, a what-if of the model alone.
`--cold-scope fleet` pools streaming's cold keys in one meter for the whole
fleet instead of one per measuring process, and `--cold-split-fills` takes
another value of 0013's _COLD_SPLIT_FILLS, what-ifs of the model alone.

`pooled-lru` gives, at one point from its t0 on, the token hit rate of one
LRU cache as large as the whole fleet's, serving every request in arrival
order (what LRU eviction gives a router that pooled the caches
perfectly; not a bound, since LRU can do better split), beside one
worker's cache alone and the bound's hit rate within the fleet's caches:

  python -m bench.research_v4 pooled-lru W4 64 --seed 52301 --t0-s 15.8

`fleet-table --balanced` prints the ratios each strategy would have if
every window's work were spread evenly over the workers, keeping the
cache hits its placement gave (deploy.BALANCED; in batch, the whole
job's), with the default's share of the bound's gain there: what is left
of the default's gap to the bound once imbalance between the workers
is taken out.
"""

import argparse
import collections
import dataclasses
import json
import math
import re
import statistics
from pathlib import Path

from bench import batch as batch_model
from bench import bound
from bench import costs
from bench import deploy
from bench import policies
from bench import v4
from bench import v4_summary
from bench import workloads
from bench.fleet import Batch
from bench.workloads import MICROS

SEEDS = [40905, 40906]
R_KEYS = ('0_25', '4')
WORKLOADS = ('W1', 'W2', 'W3')
GOAL = 0.97


def run(kwargs: dict, groups=('streaming', 'batch')) -> dict:
  """{'ratios': {point: the default's median ratio}, 'ratios_serial': the
  same with each state key's batches run one at a time (deploy.SERIAL)}
  for AdaptiveNumShards(**kwargs)."""
  from apache_beam.transforms.util import AdaptiveNumShards
  v4.EVAL_SEEDS = SEEDS
  v4.r_keys = lambda workload_name, quick=False: R_KEYS
  chosen = [w for w in v4.WORKLOADS if w.name in WORKLOADS]
  done = v4.run_all(
      AdaptiveNumShards(**kwargs),
      costs.GPU,
      False, lambda message: None,
      processes=1,
      chosen=chosen,
      groups=groups)
  out = {}
  for field, serial in (('ratios', False), ('ratios_serial', True)):
    ratios = collections.defaultdict(list)
    for task in done:
      _, workload, r_key, _ = task['task']
      for deployment, figures in task['deployments'].items():
        at = 'whole' if deployment.startswith('batch') else '10s'
        if serial:
          at = deploy.SERIAL
        for decode, arms in figures['figures'].items():
          if 'baseline' not in arms or 'default' not in arms:
            continue
          for base, default in zip(arms['baseline'], arms['default']):
            ratios[f'{deployment}.{workload}.R{r_key}.D{decode}'].append(
                default['capacity'][at] / base['capacity'][at])
    out[field] = {k: statistics.median(v) for k, v in sorted(ratios.items())}
  return out


def _workload(name):
  """Benchmark v4's workload of that name, at its full size."""
  (full, ) = [w for w in v4.WORKLOADS if w.name == name]
  return full


def fleet(
    workload_name: str,
    workers: int,
    requests: int,
    seeds: list,
    groups=('streaming', 'batch'),
    measuring_spread=1,
    input_order='arrival',
    measuring_shards=None,
    measured_whole_batches=None,
    cold_scope='process',
    cold_split_fills=None,
    policy=None,
    rate=None,
    engine=None) -> dict:
  """Phase A for one workload at another fleet size, with the tree's
  AdaptiveNumShards: its default, or the one `policy` gives.

  Args:
    workload_name: one of benchmark v4's workloads (W0 to W4).
    workers: the fleet's workers.
    requests: the run's requests.
    seeds: the seeds to run (3 placements each).
    groups: the deployments to run: 'streaming' (F2 and F3), 'batch'
      (batch and batch_hash).
    measuring_spread: 1, the default's measuring step as the tree has it
      (in batch, a busy key measured in parts); more, the step spread over
      that many measuring keys by request id in the model
      (deploy.Charges.first_stage_spread); 0, the step costs nothing.
    input_order: the order batch pipelines read their input in: 'arrival'
      (as the benchmark reads it) or 'sorted' (grouped by key, as a file
      sorted by document; v4.in_input_order).
    measuring_shards, measured_whole_batches: what the model of a batch
      pipeline takes for 0013's _MEASURING_SHARDS and
      _MEASURED_WHOLE_BATCHES (batch.measuring_shards), in place of the
      tree's; none: the tree's. The tree is not changed: a what-if of the
      model alone.
    cold_scope: where streaming pools the default's cold keys
      (policies.COLD_SCOPES): by measuring process, as the tree does, or in one
      meter for the fleet (a what-if of the model alone).
    cold_split_fills: what the model takes for 0013's _COLD_SPLIT_FILLS
      (policies.COLD_SPLIT_FILLS); none: the tree's.
    policy: keyword arguments of the tree's AdaptiveNumShards for the
      run's "default" strategy, and so for `lpt`, which places the
      default's batches; none: its defaults. This weighs a setting on other
      seeds and fleet sizes than `run` does, without changing the tree.
    rate: requests per second per worker; none: v4.RATE_PER_WORKER's.
    engine: fields of costs.EngineModel to change, as {name: value}.

  Returns:
    {point: figures}: the default's, `lpt`'s and the bound's median ratios,
    the default's share of the bound's gain, whether the point reached
    steady state and its t0, the fleet's workers and the seeds,
    'balanced': the same ratios with every window's work spread evenly
    over the workers (deploy.BALANCED), and 'serial': the same ratios
    with each state key's batches run one at a time (deploy.SERIAL).
  """
  from apache_beam.transforms.util import AdaptiveNumShards
  if measuring_shards is not None and measuring_shards < 2:
    raise ValueError(
        f'measuring_shards must be at least 2, got {measuring_shards!r}')
  if measured_whole_batches is not None and measured_whole_batches < 0:
    raise ValueError(
        'measured_whole_batches must be at least 0, got '
        f'{measured_whole_batches!r}')
  if cold_split_fills is not None and cold_split_fills < 2:
    # At 1 the slot count would halve as soon as it doubled.
    raise ValueError(
        f'cold_split_fills must be at least 2, got {cold_split_fills!r}')
  chosen = [_workload(workload_name).scaled(workers=workers, requests=requests)]
  eval_seeds, v4.EVAL_SEEDS = v4.EVAL_SEEDS, list(seeds)
  model_constants = (
      v4.RATE_PER_WORKER,
      batch_model.MEASURING_SHARDS,
      batch_model.MEASURED_WHOLE_BATCHES,
      policies.COLD_SPLIT_FILLS)
  if measuring_shards is not None:
    batch_model.MEASURING_SHARDS = measuring_shards
  if measured_whole_batches is not None:
    batch_model.MEASURED_WHOLE_BATCHES = measured_whole_batches
  if cold_split_fills is not None:
    policies.COLD_SPLIT_FILLS = cold_split_fills
  if rate is not None:
    v4.RATE_PER_WORKER = rate
  try:
    done = v4.run_all(
        AdaptiveNumShards(**(policy or {})),
        dataclasses.replace(costs.GPU, **(engine or {})),
        False, lambda message: None,
        chosen=chosen,
        groups=tuple(groups),
        measuring_spread=measuring_spread,
        input_order=input_order,
        cold_scope=cold_scope)
  finally:
    v4.EVAL_SEEDS = eval_seeds
    (
        v4.RATE_PER_WORKER,
        batch_model.MEASURING_SHARDS,
        batch_model.MEASURED_WHOLE_BATCHES,
        policies.COLD_SPLIT_FILLS) = model_constants
  meta = {'workers': workers, 'requests': requests, 'seeds': list(seeds)}
  return fleet_points(v4_summary.summarize(done, meta))


def fleet_points(section, workload_name=None, groups=None) -> dict:
  """A v4 section's points as `fleet` gives them: those of one workload
  and of the deployments of groups ('streaming', 'batch'), or all.

  The full run's section (results.json's 'v4') so gives the tree's side of
  a weighing without running it again."""
  out = {}
  for dep, workload, r_key, d_key, point in v4_summary.points(section):
    if workload_name is not None and workload != workload_name:
      continue
    if groups is not None and dep.split('_')[0] not in groups:
      continue
    shape = section['meta']['workloads'][f'{workload}.{r_key}']
    name = f'{dep}.{workload}.{r_key}.{d_key}'
    out[name] = {
        'workers': shape['prefix_count_workload']['workers'],
        'default': point['default']['ratio'],
        'lpt': point['lpt']['ratio'],
        'bound': point['bound']['ratio'],
        'share': point['default']['bound_share'],
        'steady': point[v4_summary.POINT]['steady'],
        't0_s': point[v4_summary.POINT]['t0_s'],
        'seeds': point[v4_summary.POINT]['seeds'],
    }
    if 'ratio_balanced' in point['default']:
      out[name]['balanced'] = {
          strategy: point[strategy]['ratio_balanced']
          for strategy in ('default', 'lpt', 'bound')
      }
    if 'ratio_serial' in point['default']:
      out[name]['serial'] = {
          strategy: point[strategy]['ratio_serial']
          for strategy in ('default', 'lpt', 'bound')
      }
  return out


def lru_hit_rate(requests, blocks: int, t0_cell: int) -> float:
  """The token hit rate, from t0_cell on, of one LRU cache of `blocks`
  serving each request on its own as it arrives (deploy's serving and
  scoring on a fleet of one)."""
  one = deploy.evaluate(
      [Batch(0, 'pool', [request], request.arrival_us) for request in requests],
      deploy.StaticPlacer({'pool': 0}, 1),
      1,
      blocks,
      costs.GPU,
      deploy.Charges(0))
  scored = deploy.scored_requests(requests, t0_cell)
  return deploy.score(one, t0_cell, 0, costs.GPU, 1, scored)['hit_rate']


def pooled_lru(workload_name: str, r_key: str, seed: int, t0_s: float):
  """Hit rates at a streaming point from t0_s on: one LRU cache of the
  fleet's size (pooled), one worker's (one_worker), and the bound's."""
  workload = workloads.at_ratio(_workload(workload_name), v4.RATIOS[r_key])
  requests = workload.requests_at(v4.RATE_PER_WORKER, seed)
  blocks = workloads.CACHE_TOKENS // workloads.BLOCK_TOKENS
  t0_cell = math.ceil(t0_s * MICROS / deploy.CELL_US)
  fleet_cache = bound.FleetCache(
      workload.workers, blocks, round(v4.BUFFERING_S * MICROS))
  return {
      'pooled': lru_hit_rate(requests, workload.workers * blocks, t0_cell),
      'one_worker': lru_hit_rate(requests, blocks, t0_cell),
      'bound': bound.prefill(requests, t0_cell, fleet_cache).hit_rate,
  }


def _header(names) -> list:
  return [
      '| point | ' + ' | '.join(names) + ' |',
      '|---|' + '---|' * len(names),
  ]


def _even_or_serial_cell(f, field) -> str:
  b = f[field]
  share = v4_summary.share_of_gain(b['default'], b['bound'])
  share = '-' if share is None else f'{share:.2f}'
  return (
      f"{b['default']:.2f} (lpt {b['lpt']:.2f}, bound {b['bound']:.2f}, "
      f"share {share})")


def fleet_table(results: dict, balanced=False, serial=False) -> str:
  """Fleet runs side by side: at every point of any of them, the default's
  median ratio with `lpt`'s and the bound's, and whether the point was
  steady (a dash where a run lacks the point). With balanced, the ratios
  with every window's work spread evenly over the workers; with serial,
  the ratios with each state key's batches run one at a time; either way
  with the default's share of the bound's gain there (a dash where a run
  lacks them). Then, over the points every run has, how many of the
  default's ratios are below GOAL and their geometric mean."""
  if balanced and serial:
    raise ValueError('fleet_table takes balanced or serial, not both')
  field = 'balanced' if balanced else 'serial' if serial else None
  names = list(results)
  lines = _header(names)
  points = list(dict.fromkeys(p for n in names for p in results[n]))
  for point in points:
    cells = []
    for n in names:
      f = results[n].get(point)
      if f is None or (field and field not in f):
        cells.append('-')
        continue
      if field:
        cells.append(_even_or_serial_cell(f, field))
        continue
      steady = '' if f['steady'] else ', not steady'
      cells.append(
          f"{f['default']:.2f} (lpt {f['lpt']:.2f}, bound {f['bound']:.2f}"
          f"{steady})")
    lines.append(f'| {point} | ' + ' | '.join(cells) + ' |')
  shared = [
      point for point in points if all(
          point in results[n] and (not field or field in results[n][point])
          for n in names)
  ]
  if shared:
    ratios = {
        n: [(results[n][p][field] if field else results[n][p])['default']
            for p in shared]
        for n in names
    }
    lines.append(
        f'| below {GOAL}, of {len(shared)} shared points | ' +
        ' | '.join(str(sum(1 for r in ratios[n] if r < GOAL))
                   for n in names) + ' |')
    lines.append(
        '| geometric mean, shared points | ' + ' | '.join(
            f'{statistics.geometric_mean(ratios[n]):.3f}'
            for n in names) + ' |')
  return '\n'.join(lines)


def table(results: dict) -> str:
  names = list(results)
  lines = _header(names)
  for point in results[names[0]]:
    lines.append(
        f'| {point} | ' + ' | '.join(f'{results[n][point]:.2f}'
                                     for n in names) + ' |')
  lines.append(
      f'| below {GOAL} | ' + ' | '.join(
          str(sum(1 for r in results[n].values() if r < GOAL))
          for n in names) + ' |')
  lines.append(
      '| geometric mean | ' + ' | '.join(
          f'{statistics.geometric_mean(results[n].values()):.3f}'
          for n in names) + ' |')
  return '\n'.join(lines)


def _write(out: Path, name: str, run_doc: dict) -> None:
  out.mkdir(parents=True, exist_ok=True)
  (out / f'{name}.json').write_text(json.dumps(run_doc, indent=1))


def _read(directory: Path, names, field: str) -> dict:
  out = {}
  for name in names:
    doc = json.loads((directory / f'{name}.json').read_text())
    out[name] = doc[field]
    if doc.get('batch_placement') == 'hash':
      # A run from before batch_hash, which hashed batch's keys under its
      # name (fleet's batch_placement).
      out[name] = {
          re.sub(r'^batch\.', 'batch_hash.', point): figures
          for point, figures in doc[field].items()
      }
  return out


def _add_out_and_groups(parser) -> None:
  """The arguments of a command that writes a run: where, and of which
  deployments."""
  parser.add_argument('--out', type=Path, default=Path('build/research_v4'))
  parser.add_argument(
      '--groups',
      nargs='+',
      default=['streaming', 'batch'],
      choices=['streaming', 'batch'],
      help='the deployments: streaming (F2 and F3), batch (batch and '
      'batch_hash)')


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog='python -m bench.research_v4')
  sub = parser.add_subparsers(dest='command', required=True)
  one = sub.add_parser('run')
  one.add_argument('name')
  one.add_argument('kwargs', type=json.loads)
  _add_out_and_groups(one)
  fleet_parser = sub.add_parser('fleet')
  fleet_parser.add_argument('name')
  fleet_parser.add_argument('workload', choices=[w.name for w in v4.WORKLOADS])
  fleet_parser.add_argument('--workers', type=int, required=True)
  fleet_parser.add_argument('--requests', type=int, required=True)
  fleet_parser.add_argument('--seeds', type=int, nargs='+', required=True)
  _add_out_and_groups(fleet_parser)
  fleet_parser.add_argument(
      '--measuring-spread',
      type=int,
      default=1,
      help='1: as the tree measures; more: spread over that many measuring '
      'keys by request id; 0: the step is free')
  fleet_parser.add_argument(
      '--input-order',
      default='arrival',
      choices=v4.INPUT_ORDERS,
      help='the order batch pipelines read their input in: as it arrived, '
      'or grouped by key (a file sorted by document)')
  fleet_parser.add_argument(
      '--measuring-shards',
      type=int,
      help="the model's 0013 _MEASURING_SHARDS in batch (default: the "
      "tree's)")
  fleet_parser.add_argument(
      '--measured-whole-batches',
      type=int,
      help="the model's 0013 _MEASURED_WHOLE_BATCHES in batch (default: "
      "the tree's)")
  fleet_parser.add_argument(
      '--cold-scope',
      default='process',
      choices=policies.COLD_SCOPES,
      help="where streaming pools the default's cold keys: by measuring "
      "process (the tree's) or in one meter for the fleet")
  fleet_parser.add_argument(
      '--cold-split-fills',
      type=int,
      help="the model's 0013 _COLD_SPLIT_FILLS (default: the tree's)")
  fleet_parser.add_argument(
      '--policy',
      type=json.loads,
      default={},
      help="keyword arguments of the tree's AdaptiveNumShards, as JSON, "
      "for the default strategy and lpt's placing of its batches (default: "
      "{}, its defaults)")
  fleet_parser.add_argument(
      '--rate', type=float, help='requests/s per worker (default: the run\'s)')
  fleet_parser.add_argument(
      '--engine', type=json.loads, help='costs.EngineModel fields, as JSON')
  from_results = sub.add_parser(
      'from-results',
      help="one workload's points of a full run, as a fleet run gives them")
  from_results.add_argument('name')
  from_results.add_argument('workload', choices=[w.name for w in v4.WORKLOADS])
  from_results.add_argument(
      '--results', type=Path, default=Path('bench/results.json'))
  _add_out_and_groups(from_results)
  fleet_table_parser = sub.add_parser('fleet-table')
  fleet_table_parser.add_argument('dir', type=Path)
  fleet_table_parser.add_argument('names', nargs='+')
  fleet_table_parser.add_argument(
      '--balanced',
      action='store_true',
      help='the ratios with every window\'s work spread evenly over the '
      'workers')
  fleet_table_parser.add_argument(
      '--serial',
      action='store_true',
      help="the ratios with each state key's batches run one at a time")
  lru_parser = sub.add_parser('pooled-lru')
  lru_parser.add_argument(
      'workload', choices=[w.name for w in v4.WORKLOADS if w.name != 'W0'])
  lru_parser.add_argument('r_key', choices=list(v4.RATIOS))
  lru_parser.add_argument('--seed', type=int, required=True)
  lru_parser.add_argument(
      '--t0-s',
      type=float,
      required=True,
      help="the point's t0 in seconds (bench/RESULTS.md's t0 column)")
  both = sub.add_parser('table')
  both.add_argument('dir', type=Path)
  both.add_argument('names', nargs='+')
  both.add_argument(
      '--serial',
      action='store_true',
      help="the ratios with each state key's batches run one at a time")
  args = parser.parse_args(argv)
  if args.command == 'run':
    _write(
        args.out,
        args.name,
        {
            'kwargs': args.kwargs,
            'groups': args.groups,
            **run(args.kwargs, tuple(args.groups)),
        })
  elif args.command == 'fleet':
    _write(
        args.out,
        args.name,
        {
            'workload': args.workload,
            'workers': args.workers,
            'requests': args.requests,
            'seeds': args.seeds,
            'groups': args.groups,
            'measuring_spread': args.measuring_spread,
            'input_order': args.input_order,
            'measuring_shards': args.measuring_shards,
            'measured_whole_batches': args.measured_whole_batches,
            'cold_scope': args.cold_scope,
            'cold_split_fills': args.cold_split_fills,
            'policy': args.policy,
            'rate': args.rate,
            'engine': args.engine,
            'points': fleet(
                args.workload,
                args.workers,
                args.requests,
                args.seeds,
                args.groups,
                args.measuring_spread,
                args.input_order,
                args.measuring_shards,
                args.measured_whole_batches,
                args.cold_scope,
                args.cold_split_fills,
                args.policy,
                args.rate,
                args.engine)
        })
  elif args.command == 'from-results':
    results = json.loads(args.results.read_text())
    _write(
        args.out,
        args.name,
        {
            'results': str(args.results),
            'workload': args.workload,
            'groups': args.groups,
            'points': fleet_points(
                results['v4'], args.workload, tuple(args.groups)),
        })
  elif args.command == 'pooled-lru':
    rates = pooled_lru(args.workload, args.r_key, args.seed, args.t0_s)
    print(
        f'{args.workload} R{args.r_key} seed {args.seed}: ' +
        ', '.join(f'{k} {v:.3f}' for k, v in rates.items()))
  elif args.command == 'fleet-table':
    print(
        fleet_table(
            _read(args.dir, args.names, 'points'),
            balanced=args.balanced,
            serial=args.serial))
  else:
    print(
        table(
            _read(
                args.dir,
                args.names,
                'ratios_serial' if args.serial else 'ratios')))
  return 0


if __name__ == '__main__':
  raise SystemExit(main())
