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

"""Policy research in the simulator (stdlib only), for bench/RESEARCH.md.

`python -m bench.research CASE [CASE ...]` runs named candidate policies
on W1-W3 in the frames of bench.frames and prints medians over
placements (seeds x salts) with min-max. Nothing here needs Beam: 0013's
AdaptiveNumShards is replayed by SimAdaptive, a line-for-line copy of its
algorithm.
"""

import argparse
import math
import multiprocessing
import statistics
import sys
import time

from bench import fleet
from bench import frames
from bench import policies
from bench import workloads
from bench.workloads import MICROS

SEEDS = (40905, 40906, 40907)
SALTS = ('a', 'b', 'c')
COSTS = frames.Costs(60.5, 14.0)


class SimAdaptive:
  """0013's AdaptiveNumShards, replayed without Beam."""
  def __init__(
      self,
      max_shards=32,
      share_per_shard=0.005,
      half_life=4096,
      max_tracked_keys=1024,
      min_elements=1024):
    self.max_shards = max_shards
    self.share_per_shard = share_per_shard
    self.max_tracked_keys = max_tracked_keys
    self._growth = 2.0**(1.0 / half_life)
    self._min_total = min(min_elements, 1 / (1 - 1 / self._growth))
    self._scale = 1.0
    self._total = 0.0
    self._weights: dict = {}

  def __call__(self, key):
    scale = self._scale = self._scale * self._growth
    self._total += scale
    weight = self._weights.get(key, 0.0) + scale
    self._weights[key] = weight
    share = weight / max(self._total, self._min_total * scale)
    if len(self._weights) > self.max_tracked_keys:
      keep = max(1, self.max_tracked_keys // 2)
      heaviest = sorted(self._weights.items(), key=lambda kv: kv[1])[-keep:]
      self._weights = dict(heaviest)
    if scale > 1e100:
      self._weights = {k: w / scale for k, w in self._weights.items()}
      self._total /= scale
      self._scale = 1.0
    return max(1, min(self.max_shards, math.ceil(share / self.share_per_shard)))


def candidates(workload, frame, requests, copies, seed, rate):
  """name -> route, for every candidate of the research."""
  w = workload.workers
  b = workload.batch_size
  out = {
      'baseline': policies.PerProcessKey(copies),
      'keyed_1': policies.CopiedShards(1, copies, seed),
      'keyed_8': policies.CopiedShards(8, copies, seed),
      'adaptive_copy': policies.CopiedShards(SimAdaptive(), copies, seed),
      'adaptive_process': policies.CopiedShards(
          SimAdaptive(), copies, seed, 'process'),
      'adaptive_fleet': policies.CopiedShards(
          SimAdaptive(), copies, seed, 'fleet'),
      'adaptive_2w_process': policies.CopiedShards(
          SimAdaptive(share_per_shard=1 / (2 * w), max_shards=64),
          copies,
          seed,
          'process'),
      'adaptive_2w_copy': policies.CopiedShards(
          SimAdaptive(share_per_shard=1 / (2 * w), max_shards=64),
          copies,
          seed,
          'copy'),
      'known_2w_random': policies.KnownShares(requests, w, 2, seed),
      'known_2w_runs': policies.KnownShares(requests, w, 2, seed, 'runs', b),
      'known_4w_runs': policies.KnownShares(requests, w, 4, seed, 'runs', b),
      'known_1w_runs': policies.KnownShares(requests, w, 1, seed, 'runs', b),
  }
  for r0 in (2, 4, 8, 16):
    out[f'two_stage_r{r0}_runs'] = policies.TwoStage(r0, run_length=b)
    out[f'two_stage_r{r0}_random'] = policies.TwoStage(
        r0, pick='random', seed=seed)
  return out


def parse(name, workload, seed):
  """A candidate named 'two_stage:r=2,max=256,pick=runs,tau=30' (any of
  the settings), or None."""
  kind, _, settings = name.partition(':')
  if kind != 'two_stage' or not settings:
    return None
  given = dict(item.split('=') for item in settings.split(','))
  return policies.TwoStage(
      float(given.get('r', 8)),
      tau_s=float(given.get('tau', 30)),
      min_span_s=float(given.get('span', 1)),
      max_shards=int(given.get('max', 64)),
      pick=given.get('pick', 'runs'),
      run_length=int(given.get('run', workload.batch_size)),
      run_timeout_s=float(given.get('timeout', 1)),
      split_from=float(given.get('fill', 0)),
      seed=seed)


def run_case(args):
  workload, frame, rate, seed, names, costs = args
  requests = workload.requests_at(rate, seed)
  copies = frames.copy_of(requests, frame, seed)
  routes = candidates(workload, frame, requests, copies, seed, rate)
  routes['baseline_worker'] = policies.PerWorkerKey()
  out = {}
  wanted = ['baseline'] + [n for n in names if n != 'baseline']
  for name in wanted:
    if name == 'oracle':
      route = fleet.OracleRoute(
          requests, workload.workers, workload.batch_size, workload.epoch_of)
      batches = fleet.form_batches(
          requests, lambda r: (route(r)[0], 0), workload.batch_size, MICROS)
      figs = frames.lpt_evaluate(
          batches,
          workload.workers,
          workload.cache_blocks,
          costs,
          apart=lambda k: k[0]
          if isinstance(k, tuple) and len(k) == 3 else None)
      out[name] = [figs] * len(SALTS)
      continue
    if name == 'stateless':
      batches = frames.bundle_batches(
          requests, copies, workload.batch_size, MICROS // 10)
      placement = {b.state_key: b.worker for b in batches}
      figs = frames.evaluate(
          batches, placement, workload.workers, workload.cache_blocks, costs)
      out[name] = [figs] * len(SALTS)
      continue
    route = routes.get(name) or parse(name, workload, seed)
    batches = fleet.form_batches(requests, route, workload.batch_size, MICROS)
    out[name] = []
    for salt in SALTS:
      figs = frames.place_and_evaluate(
          batches,
          frame,
          salt,
          workload.workers,
          workload.cache_blocks,
          costs,
          on_reader=name == 'baseline_worker' or
          (name == 'baseline' and frame.baseline_on_reader))
      figs.pop('work_by_key')
      out[name].append(figs)
  return out


def run(workload, frame, rate, names, costs=COSTS, seeds=SEEDS, processes=2):
  tasks = [(workload, frame, rate, s, names, costs) for s in seeds]
  if processes > 1:
    with multiprocessing.get_context('fork').Pool(processes) as pool:
      per_seed = pool.map(run_case, tasks)
  else:
    per_seed = [run_case(t) for t in tasks]
  summary = {}
  for name in per_seed[0]:
    ratios, hits, loads, sizes, p99 = [], [], [], [], []
    for result in per_seed:
      for base, figs in zip(result['baseline'], result[name]):
        ratios.append(base['busiest_worker_work'] / figs['busiest_worker_work'])
        hits.append(figs['hit_rate'])
        loads.append(figs['load_max_over_mean'])
        sizes.append(figs['mean_batch_size'])
        p99.append(figs['p99_delay_s'])
    summary[name] = {
        'ratio': statistics.median(ratios),
        'min': min(ratios),
        'max': max(ratios),
        'hit': statistics.median(hits),
        'load': statistics.median(loads),
        'batch': statistics.median(sizes),
        'p99': statistics.median(p99),
    }
  return summary


def show(title, summary):
  print(f'## {title}')
  print(
      f'{"strategy":28s} {"ratio":>6s} {"min-max":>11s} {"hit":>5s} '
      f'{"load":>5s} {"batch":>5s} {"p99":>5s}')
  for name, s in summary.items():
    print(
        f'{name:28s} {s["ratio"]:6.2f} {s["min"]:5.2f}-{s["max"]:<5.2f} '
        f'{s["hit"]:5.3f} {s["load"]:5.2f} {s["batch"]:5.2f} {s["p99"]:5.2f}')
  sys.stdout.flush()


WORKLOADS = {w.name: w for w in (workloads.W1, workloads.W2, workloads.W3)}
FRAMES = {f.name: f for f in frames.FRAMES}


def v3(args):
  """The bench's phase A (frames at full scale, or the sweep) with a
  candidate two-stage spec as the default."""
  from bench import streaming
  given = dict(
      item.split('=')
      for item in args.candidate.split(',')) if (args.candidate) else {}
  spec = policies.TwoStageSpec(
      rate_per_shard=float(given['r']) if 'r' in given else None,
      split_from=float(given['fill']) if 'fill' in given else None,
      max_shards=int(given.get('max', 64)),
      decay_secs=float(given.get('tau', 30)),
      run_batches=int(given.get('runs', 4)))
  chosen = streaming.strategies(spec, SimAdaptive(), {'buffering_s': 1.0})
  if args.frames_only:
    chosen = {
        n: s
        for n, s in chosen.items() if n in ('baseline', 'default', 'keyed_8')
    }
  wl = [
      WORKLOADS[w].scaled(requests=round(WORKLOADS[w].requests * args.scale))
      for w in args.workloads.split(',')
  ]
  costs = frames.Costs(60.5, 14.0, 0, args.decode_cost)
  streaming._STATE['strategies'] = chosen
  names = [n for n in streaming.TABLE if n in chosen]
  tasks = [(
      w, args.rate, seed, [f.name for f in frames.FRAMES], SALTS, costs, names)
           for w in wl for seed in SEEDS[:args.seeds]]
  done = streaming._run(tasks, 2, lambda m: None, 'frames')
  print(f'## {spec!r} scale {args.scale}')
  for frame in ('F3', 'F2', 'F2_P16', 'F2_P32', 'F1'):
    for i, w in enumerate(wl):
      per_seed = [done[i * args.seeds + j][frame] for j in range(args.seeds)]
      summary = streaming.summarize(per_seed, names)
      cells = '  '.join(
          f'{n} {r["throughput_vs_baseline"]:.2f} ({r["throughput_min"]:.2f}-'
          f'{r["throughput_max"]:.2f}) h{r["hit_rate"]:.3f} '
          f'l{r["load_max_over_mean"]:.2f}' for n, r in summary.items()
          if n != 'baseline')
      print(f'{frame:7s} {w.name} {cells}')
  sys.stdout.flush()


def main(argv=None):
  parser = argparse.ArgumentParser(prog='python -m bench.research')
  parser.add_argument('--workloads', default='W1,W2,W3')
  parser.add_argument('--frames', default='F2,F3')
  parser.add_argument('--rate', type=float, default=16)
  parser.add_argument('--scale', type=float, default=1.0)
  parser.add_argument('--cache', type=float, default=1.0)
  parser.add_argument('--decode', type=int, default=0)
  parser.add_argument('--decode-cost', type=float, default=2.0)
  parser.add_argument('--zipf', type=float, default=None)
  parser.add_argument('--seeds', type=int, default=3)
  parser.add_argument('--v3', action='store_true')
  parser.add_argument('--candidate', default='')
  parser.add_argument('--frames-only', action='store_true')
  parser.add_argument('names', nargs='*')
  args = parser.parse_args(argv)
  if args.v3:
    return v3(args)
  costs = frames.Costs(60.5, 14.0, args.decode, args.decode_cost)
  for wname in args.workloads.split(','):
    workload = WORKLOADS[wname]
    changes = {'requests': round(workload.requests * args.scale)}
    if args.cache != 1.0:
      changes['cache_prefixes'] = max(
          1, round(workload.cache_prefixes * args.cache))
    if args.zipf is not None:
      changes['zipf_s'] = args.zipf
    workload = workload.scaled(**changes)
    for fname in args.frames.split(','):
      started = time.monotonic()
      summary = run(
          workload,
          FRAMES[fname],
          args.rate,
          args.names,
          costs,
          seeds=SEEDS[:args.seeds])
      show(
          f'{wname} {fname} rate {args.rate} cache x{args.cache} decode '
          f'{args.decode} ({time.monotonic() - started:.0f}s)',
          summary)


if __name__ == '__main__':
  main()
