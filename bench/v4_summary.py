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

"""Benchmark v4's results.json section, from phase A's tasks (stdlib
only): `v4.<deployment>.<workload>.R<r>.D<d>.<strategy>` (see
summarize)."""

import math
import statistics

from bench import deploy
from bench import v4

PRIMARY = {
    'streaming_F2': '10s',
    'streaming_F3': '10s',
    'batch': 'whole',
    'batch_hash': 'whole'
}
# Keys of a point beside its strategies.
POINT = 'point'


def _ratios(numerators, denominators, window):
  return [
      a['capacity'][window] / b['capacity'][window]
      for a, b in zip(numerators, denominators)
  ]


def _row(per_seed, name, deployment):
  """A strategy's figures at a point, from its per-seed figures:
  [(its figures per salt or one for all salts, the baseline's per
  salt)]."""
  out = {}
  windows = ['2s', '10s', '60s', 'whole']
  for extra in (deploy.FROM_START, deploy.BALANCED, deploy.SERIAL):
    if all(extra in f['capacity'] for figures, base in per_seed
           for f in figures + base):
      windows.append(extra)
  for window in windows:
    ratios = []
    for figures, base in per_seed:
      if name == 'aa':
        numerators = base[1:] + base[:1]
      elif len(figures) == 1:
        numerators = figures * len(base)
      else:
        numerators = figures
      ratios += _ratios(numerators, base, window)
    out[window] = ratios
  primary = out[PRIMARY[deployment]]
  row = {
      'ratio': statistics.median(primary),
      'ratio_min': min(primary),
      'ratio_max': max(primary),
      'ratios': primary,
      'ratio_2s': statistics.median(out['2s']),
      'ratio_10s': statistics.median(out['10s']),
      'ratio_60s': statistics.median(out['60s']),
      'ratio_whole': statistics.median(out['whole']),
  }
  if deploy.FROM_START in out:
    row['ratio_from_start'] = statistics.median(out[deploy.FROM_START])
  if deploy.BALANCED in out:
    row['ratio_balanced'] = statistics.median(out[deploy.BALANCED])
  if deploy.SERIAL in out:
    row['ratio_serial'] = statistics.median(out[deploy.SERIAL])
    row['ratios_serial'] = out[deploy.SERIAL]
  figures = [f for mine, _ in per_seed for f in mine]
  if name == 'aa':
    figures = [f for _, base in per_seed for f in base]
  for field in ('hit_rate', 'mean_batch_size', 'p99_delay_s'):
    values = [f[field] for f in figures if field in f]
    if values:
      row[field] = statistics.median(values)
  return row


def share_of_gain(ratio, bound):
  """A ratio's share of the bound's gain over the baseline, (ratio - 1) /
  (bound - 1); None where the bound gains nothing."""
  gain = bound - 1
  return (ratio - 1) / gain if gain > 0 else None


def _point(tasks_of_point, deployment, decode):
  per_seed = {}
  names = ('baseline', 'default', 'adaptive_v3', 'keyed_8', 'lpt', 'bound')
  if deployment.startswith('streaming'):
    names += ('stateless', )
  for task in tasks_of_point:
    figures = task['deployments'][deployment]['figures'][decode]
    for name in names + ('aa', 'bound_shuffled'):
      source = figures['baseline'] if name == 'aa' else figures[name]
      per_seed.setdefault(name, []).append((source, figures['baseline']))
  point = {
      name: _row(rows, name, deployment)
      for name, rows in per_seed.items()
  }
  for name in ('default', 'adaptive_v3'):
    point[name]['bound_share'] = share_of_gain(
        point[name]['ratio'], point['bound']['ratio'])
  infos = [t['deployments'][deployment] for t in tasks_of_point]
  point[POINT] = {
      't0_s': statistics.median(i['t0_s'] for i in infos),
      'requests_scored': statistics.median(i['requests_scored'] for i in infos),
      'steady': all(i['steady'] for i in infos),
      'all_warm_share': sum(i['all_warm'] for i in infos) / len(infos),
      'placements': len(tasks_of_point) * len(v4.SALTS),
      'seeds': [t['task'][3] for t in tasks_of_point],
  }
  return point


def _p_sweep(tasks_of_point):
  out = {}
  for task in tasks_of_point:
    figures = task['deployments']['streaming_F2']['figures']
    if 'p_sweep' not in figures:
      return None
  for p in v4.P_SWEEP:
    ratios = []
    for task in tasks_of_point:
      figures = task['deployments']['streaming_F2']['figures']
      rows = (
          figures[0] if p == v4.PROCESSES_PER_WORKER else figures['p_sweep'][p])
      ratios += _ratios(rows['default'], rows['baseline'], '10s')
    out[str(p)] = {
        'ratio': statistics.median(ratios),
        'ratio_min': min(ratios),
        'ratio_max': max(ratios),
    }
  return out


def summarize(done, meta) -> dict:
  """results.json's v4 section from the tasks' results."""
  by_point: dict = {}
  shapes: dict = {}
  for task in done:
    _, workload, r_key, _ = task['task']
    for dep in task['deployments']:
      by_point.setdefault((dep, workload, r_key), []).append(task)
    shapes[(workload, r_key)] = task['shape']
  out = {'meta': meta}
  for (dep, workload, r_key), tasks_of_point in sorted(by_point.items()):
    tasks_of_point.sort(key=lambda t: t['task'][3])
    r_keys = [r_key]
    if workload == 'W0':
      r_keys = sorted({r for r, _ in v4.REQUIRED})
    decodes = tasks_of_point[0]['deployments'][dep]['figures']
    for decode in [d for d in v4.DECODES if d in decodes]:
      point = _point(tasks_of_point, dep, decode)
      for r in r_keys:
        out.setdefault(dep,
                       {}).setdefault(workload,
                                      {}).setdefault(f'R{r}',
                                                     {})[f'D{decode}'] = point
    if dep == 'streaming_F2' and workload == 'W1' and r_key == '4':
      sweep = _p_sweep(tasks_of_point)
      if sweep:
        out[dep]['p_sweep'] = {'point': 'W1.R4.D0', 'processes': sweep}
  out['meta']['workloads'] = {
      f'{w}.R{r}': {
          **shape,
          'ratio': v4.RATIOS[r],
          'ratio_over_workers': (
              v4.RATIOS[r] / shape['prefix_count_workload']['workers']),
      }
      for (w, r), shape in sorted(shapes.items())
  }
  return out


def missing_points(section) -> list:
  """The required points the section lacks."""
  missing = []
  for dep in v4.DEPLOYMENTS:
    for workload in ('W0', 'W1', 'W2', 'W3', 'W4'):
      wanted = [(r, d) for r, d in v4.REQUIRED]
      if (dep, workload) in v4.FULL_GRID:
        wanted = [(r, d) for r in v4.RATIOS for d in v4.DECODES]
      for r, d in wanted:
        point = section.get(dep, {}).get(workload, {}).get(f'R{r}',
                                                           {}).get(f'D{d}')
        if point is None or any(s not in point
                                for s in ('default', 'adaptive_v3', 'keyed_8',
                                          'lpt', 'bound', 'baseline')):
          missing.append(f'{dep}.{workload}.R{r}.D{d}')
  return missing


NEVER_SLOWER = 0.97
WIN_TARGETS = {
    'streaming_F2': 1.5, 'streaming_F3': 1.5, 'batch': 2.0, 'batch_hash': 2.0
}
SHARE_TARGET = 0.5
# The least coverage of the interval given for a point's median over
# seeds: with 4 seeds, their least and greatest median give 87.5%.
INTERVAL_COVERAGE = 0.85


def seed_medians(ratios):
  """A strategy's ratios at a point (seed-major, one per salt) as one
  median per seed: a seed's salts share its requests and batches, so the
  seeds, not the placements, are independent draws."""
  salts = len(v4.SALTS)
  return [
      statistics.median(ratios[i:i + salts])
      for i in range(0, len(ratios), salts)
  ]


def median_interval(values, coverage=INTERVAL_COVERAGE):
  """A distribution-free interval for the median of what values sample:
  (low, high, its coverage), the k-th least and k-th greatest value for
  the largest k whose coverage is at least coverage. The median lies below
  the k-th least value with the chance that fewer than k of the n values
  lie below it, P(Binomial(n, 1/2) < k), and above the k-th greatest with
  the same chance. None when n values are too few to give it."""
  ordered = sorted(values)
  n = len(ordered)
  best = None
  outside = 0
  for k in range(1, n // 2 + 1):
    # outside: P(Binomial(n, 1/2) < k) so far.
    outside += math.comb(n, k - 1) / 2**n
    if 1 - 2 * outside < coverage:
      break
    best = (ordered[k - 1], ordered[n - k], 1 - 2 * outside)
  return best


def points(section):
  """(deployment, workload, R key, D key, point) of every point, W0 once
  (its R keys hold one run)."""
  for dep in v4.DEPLOYMENTS:
    for workload, by_r in sorted(section.get(dep, {}).items()):
      if workload == 'p_sweep':
        continue
      for r_key, by_d in by_r.items():
        if workload == 'W0' and r_key != 'R4':
          continue
        for d_key, point in by_d.items():
          yield dep, workload, r_key, d_key, point


def window_text(meta, name='10s') -> str:
  """A scoring window of the run (deploy.WINDOWS' name) as text: '10 s',
  or 'the whole run'."""
  seconds = meta['window_seconds'][name]
  return f'{seconds:g} s' if isinstance(
      seconds, (int, float)) else 'the whole run'


def tree_text(meta) -> str:
  """The patched tree the run measured, as figures cite it: its tree
  object, the same in every build of the same patches, or, in runs from
  before it was recorded, the commit of the build that ran them, which
  depends on who built it."""
  tree = meta.get('beam_tree_object')
  if tree:
    return f'the tree object `{tree[:12]}`'
  return f'the tree at `{meta["beam_tree_commit"][:12]}`'


def tree_object_text(meta) -> str:
  """' (tree object ...)' for a run that recorded it, else ''."""
  tree = meta.get('beam_tree_object')
  return f' (tree object `{tree}`, that of every build of its patches)' if (
      tree) else ''


def goals(section, name='default') -> dict:
  """Where a strategy meets and misses the goals of issue 23, and where it
  is below 0.97 scored over 2 s windows, against 2.77.0's stateless path
  in streaming, or in streaming scored from the run's start (None where the
  results have no such figure). With the balanced figure (every window's
  work spread evenly over the workers, deploy.BALANCED) on every row, also
  the points below 0.97 that way, worst first, and the shares that way.
  With the serial figure (each state key's batches run one at a time,
  deploy.SERIAL) on every row, also the points below 0.97 that way, worst
  first, and the shares that way."""
  below = []
  below_2s = []
  below_stateless = []
  # None for results from before the from-start figure.
  below_from_start = None
  streaming = 0
  total = 0
  shares = []
  below_balanced = []
  # Whether every row has the balanced figure: results from before it have
  # none, and one without it is not taken as above the floor.
  has_balanced = all(
      'ratio_balanced' in point[name] for *_, point in points(section))
  below_serial = []
  has_serial = all(
      'ratio_serial' in point[name] for *_, point in points(section))
  for dep, workload, r_key, d_key, point in points(section):
    total += 1
    row = point[name]
    at = f'{dep}.{workload}.{r_key}.{d_key}'
    if row['ratio_2s'] < NEVER_SLOWER:
      below_2s.append(at)
    if 'stateless' in point:
      # Over 2.77.0's stateless path at each placement: both ratios share
      # the placement's baseline.
      streaming += 1
      over = statistics.median(
          a / b for a, b in zip(row['ratios'], point['stateless']['ratios']))
      if over < NEVER_SLOWER:
        below_stateless.append({'at': at, 'ratio': over})
      if 'ratio_from_start' in row:
        if below_from_start is None:
          below_from_start = []
        if row['ratio_from_start'] < NEVER_SLOWER:
          below_from_start.append({'at': at, 'ratio': row['ratio_from_start']})
    if row['ratio'] < NEVER_SLOWER:
      below.append({
          'at': at,
          'ratio': row['ratio'],
          'ratio_min': row['ratio_min'],
          'interval': median_interval(seed_medians(row['ratios'])),
          'aa_min': point['aa']['ratio_min'],
          'bound_shuffled': point['bound_shuffled']['ratio'],
          # None for results from before the balanced figure.
          'ratio_balanced': row.get('ratio_balanced'),
      })
    if has_balanced and row['ratio_balanced'] < NEVER_SLOWER:
      below_balanced.append((row['ratio_balanced'], at))
    if has_serial and row['ratio_serial'] < NEVER_SLOWER:
      below_serial.append({
          'at': at,
          'ratio': row['ratio_serial'],
          'ratio_threads': row['ratio'],
          'keyed_8': point['keyed_8']['ratio_serial'],
          # Over 2.77.0's stateless path (streaming), whose per-thread
          # bundles are not held back by state keys.
          'over_stateless': (
              statistics.median(
                  a / b for a, b in zip(
                      row['ratios_serial'], point['stateless']
                      ['ratios_serial'])) if 'stateless' in point else None),
      })
    if d_key in ('D64', 'D256') and workload != 'W0':
      shares.append({
          'at': at,
          'share': share_of_gain(row['ratio'], point['bound']['ratio']),
          'ratio': row['ratio'],
          'bound': point['bound']['ratio'],
      })
      if has_balanced:
        # The same share with every window's work spread evenly.
        shares[-1]['share_balanced'] = share_of_gain(
            row['ratio_balanced'], point['bound']['ratio_balanced'])
      if has_serial:
        shares[-1]['share_serial'] = share_of_gain(
            row['ratio_serial'], point['bound']['ratio_serial'])
  wins = []
  for dep in v4.DEPLOYMENTS:
    for workload in ('W1', 'W2', 'W4'):
      point = section.get(dep, {}).get(workload, {}).get('R4', {}).get('D0')
      if point is None:
        continue
      wins.append({
          'deployment': dep,
          'workload': workload,
          'ratio': point[name]['ratio'],
          'target': WIN_TARGETS[dep],
          'bound': point['bound']['ratio'],
          'met': point[name]['ratio'] >= WIN_TARGETS[dep],
      })
  below.sort(key=lambda b: b['ratio'])
  below_serial.sort(key=lambda b: b['ratio'])
  below_stateless.sort(key=lambda b: b['ratio'])
  if below_from_start is not None:
    below_from_start.sort(key=lambda b: b['ratio'])
  met = [
      s for s in shares if s['share'] is not None and s['share'] >= SHARE_TARGET
  ]
  return {
      'points': total,
      'below': below,
      # The points below with every window's work spread evenly over the
      # workers, the baseline's too; None for results from before it.
      # The worst first.
      'below_balanced': ([at for _, at in sorted(below_balanced)]
                         if has_balanced else None),
      'below_2s': below_2s,
      'streaming_points': streaming,
      'below_stateless': below_stateless,
      'below_from_start': below_from_start,
      'wins': wins,
      'shares': shares,
      'shares_met': len(met),
      # None for results from before the balanced figure.
      'shares_met_balanced': (
          sum(
              1 for s in shares if s['share_balanced'] is not None and
              s['share_balanced'] >= SHARE_TARGET) if has_balanced else None),
      # With each state key's batches run one at a time; None for results
      # from before that figure.
      'below_serial': below_serial if has_serial else None,
      'shares_met_serial': (
          sum(
              1 for s in shares if s['share_serial'] is not None and
              s['share_serial'] >= SHARE_TARGET) if has_serial else None),
  }
