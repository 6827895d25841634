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

"""Phase A: every batching strategy on the streaming fleet (stdlib only).

For each workload, arrival rate, seed and sweep point, every strategy forms
its batches from the same timed requests (fleet.form_batches) and is
scored by fleet.evaluate. Throughput is requests over the busiest worker's
busy time, so a strategy's throughput against the baseline is the
baseline's busiest work over its own.
"""

import multiprocessing
import statistics
import time

from bench import fleet
from bench.workloads import MICROS

FIELDS = (
    'hit_rate',
    'load_max_over_mean',
    'throughput_vs_baseline',
    'p50_delay_s',
    'p99_delay_s',
    'mean_batch_size',
    'purity',
    'prompt_tokens_computed',
    'throughput_pct_of_oracle',
    'hit_rate_pct_of_oracle',
)


def strategies(default_shards, batch_size: int, adaptive=None) -> dict:
  """name -> builder(workload, requests, seed) -> route. num_shards specs
  are whatever BatchElements takes; adaptive, when given, makes a
  num_shards callable for a workload."""
  def keyed(spec, picker='random'):
    def build(workload, requests, seed):
      chosen = (
          fleet.RandomPicker(f'{seed}/shards') if picker == 'random' else
          fleet.StickyPicker(f'{seed}/shards', batch_size))
      resolved = spec(requests, workload) if callable(spec) and getattr(
          spec, 'per_run', False) else spec
      return fleet.KeyedRoute(resolved, chosen, workload.workers)

    return build

  def sized(requests, workload):
    return fleet.traffic_shards(requests, workload.workers)

  sized.per_run = True
  built = {
      'baseline': lambda workload, requests, seed: fleet.baseline_route,
      'keyed_1': keyed(1),
      'keyed_8': keyed(8),
      'default': keyed(default_shards),
      'keyed_8_sticky': keyed(8, 'sticky'),
      'traffic_sized': keyed(sized),
  }
  if adaptive is not None:

    def learned(requests, workload):
      return adaptive(workload)

    learned.per_run = True
    built['adaptive'] = keyed(learned)
  built['oracle'] = lambda workload, requests, seed: fleet.OracleRoute(
      requests, workload.workers, workload.batch_size, workload.epoch_of)
  return built


def run_point(
    workload, rate, seed, builders, overhead, buffering_s=1.0) -> dict:
  """Every strategy on one workload, rate and seed: name -> figures.
  overhead: (per batch, per further request), in computed tokens."""
  requests = workload.requests_at(rate, seed)
  figures = {}
  for name, build in builders.items():
    route = build(workload, requests, seed)
    batches = fleet.form_batches(
        requests, route, workload.batch_size, round(buffering_s * MICROS))
    figures[name] = fleet.evaluate(
        batches, workload.workers, workload.cache_blocks, *overhead)
  base = figures['baseline']['busiest_worker_work']
  best = figures['oracle']
  for row in figures.values():
    row['throughput_vs_baseline'] = base / row['busiest_worker_work']
  for row in figures.values():
    row['throughput_pct_of_oracle'] = 100 * (
        row['throughput_vs_baseline'] / best['throughput_vs_baseline'])
    row['hit_rate_pct_of_oracle'] = 100 * row['hit_rate'] / best['hit_rate']
  figures['bound'] = fleet.bound(requests)
  return figures


def summarize(per_seed: list[dict]) -> dict:
  """Medians over seeds of every strategy's fields, with their spread."""
  out = {}
  for name in per_seed[0]:
    if name == 'bound':
      values = [run[name]['hit_rate'] for run in per_seed]
      out[name] = {
          'hit_rate': statistics.median(values),
          'spread': {
              'hit_rate': [min(values), max(values)]
          }
      }
      continue
    row = {}
    spread = {}
    for field in FIELDS:
      values = [run[name][field] for run in per_seed]
      row[field] = statistics.median(values)
      spread[field] = [min(values), max(values)]
    out[name] = {**row, 'spread': spread}
  return out


def sweep_points(workload, rates, middle_rate, caches, zipfs):
  """(label, workload, rate): the arrival rates at the workload's own
  cache and Zipf exponent, then cache sizes and Zipf exponents at the
  middle rate."""
  points = [('rate', workload, rate) for rate in rates]
  points += [('cache_prefixes', workload.scaled(cache_prefixes=c), middle_rate)
             for c in caches if c != workload.cache_prefixes]
  points += [('zipf_s', workload.scaled(zipf_s=z), middle_rate) for z in zipfs
             if z != workload.zipf_s]
  return points


# The strategies of the running phase, for the forked processes that run
# its points (closures do not pickle; a fork inherits them).
_BUILDERS: dict = {}


def _run_task(task):
  point, rate, seed, overhead = task
  return run_point(point, rate, seed, _BUILDERS, overhead)


def phase(
    workloads,
    seeds,
    rates,
    builders,
    overhead,
    cache_factors,
    zipfs,
    progress=print,
    side_fraction=1.0,
    processes=1) -> tuple[dict, list, list]:
  """Runs phase A: (streaming at the middle rate, the sweep, raw runs).

  Every rate runs the workload's own requests; the cache and Zipf points
  run side_fraction of them. processes > 1 runs the points in that many
  forked processes; the figures do not depend on it.
  """
  middle = sorted(rates)[len(rates) // 2]
  points = []
  for workload in workloads:
    caches = sorted(
        {max(1, round(workload.cache_prefixes * f))
         for f in cache_factors})
    for label, varied, rate in sweep_points(workload, rates, middle, caches,
                                            zipfs):
      point = varied if label == 'rate' else varied.scaled(
          requests=round(varied.requests * side_fraction))
      points.append((workload.name, label, point, rate))
  tasks = [(point, rate, seed, overhead) for _, _, point, rate in points
           for seed in seeds]
  _BUILDERS.clear()
  _BUILDERS.update(builders)
  started = time.monotonic()
  if processes > 1:
    with multiprocessing.get_context('fork').Pool(processes) as pool:
      done = []
      for figures in pool.imap(_run_task, tasks):
        done.append(figures)
        if len(done) % len(seeds) == 0:
          name, label, point, rate = points[len(done) // len(seeds) - 1]
          progress(
              f'A {name}: {label} rate={rate} cache={point.cache_prefixes} '
              f'zipf={point.zipf_s}: {time.monotonic() - started:.0f}s in')
  else:
    done = [_run_task(task) for task in tasks]
  streaming, sweep, runs = {}, [], []
  for index, (name, label, point, rate) in enumerate(points):
    per_seed = done[index * len(seeds):(index + 1) * len(seeds)]
    for seed, figures in zip(seeds, per_seed):
      runs.append({
          'workload': name,
          'rate_per_worker': rate,
          'cache_prefixes': point.cache_prefixes,
          'zipf_s': point.zipf_s,
          'requests': point.requests,
          'seed': seed,
          'figures': figures,
      })
    summary = summarize(per_seed)
    sweep.append({
        'workload': name,
        'varied': label,
        'rate_per_worker': rate,
        'cache_prefixes': point.cache_prefixes,
        'zipf_s': point.zipf_s,
        'requests': point.requests,
        'strategies': summary,
    })
    if label == 'rate' and rate == middle:
      streaming[name] = summary
  return streaming, sweep, runs
