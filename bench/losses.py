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

"""The sentences on where a strategy loses against its deployment's
baseline, or falls short of half the bound's gain, for the blocks that
bench.blocks writes (stdlib only)."""

from bench import v4_summary


def sentence(results, name='default', limit=8):
  """Where a strategy is below the floor of issue 24's goals, as the
  blocks quote it: the worst points, which the run cannot tell from the
  floor, which stay below with the work spread evenly, and the measures
  beside the goals' own."""
  goals = v4_summary.goals(results['v4'], name)
  below = goals['below']
  if not below:
    return (
        f'It is at least {v4_summary.NEVER_SLOWER:.2f}x its deployment\'s '
        f'baseline at all {goals["points"]} points.' + _spread_evenly(goals) +
        serial(goals))
  return (
      f'It is below {v4_summary.NEVER_SLOWER:.2f}x its deployment\'s '
      f'baseline at {len(below)} of {goals["points"]} points, the worst '
      f'{_worst(below, limit, more=True)}.' + _within_noise(below) +
      _spread_evenly(goals) + _other_references(goals, results['v4']['meta']) +
      serial(goals))


def serial(goals, limit=3):
  """Where a strategy is below the floor with each state key's batches run
  one at a time, as a sentence with a leading space (empty for results
  without that figure)."""
  below = goals.get('below_serial')
  if below is None:
    return ''
  return (
      ' With each state key\'s batches run one at a time, as Dataflow, '
      'Prism and Flink run a key\'s work (its model calls fused after it, one after '
      'another; the baseline\'s state key is the SDK process), it is below '
      f'{v4_summary.NEVER_SLOWER:.2f}x at {len(below)} of {goals["points"]} '
      'points' + (f', the worst {_worst(below, limit)}' if below else '') + '.')


def _listed(names, limit, more=True):
  """The first names, and how many more are left out (with more)."""
  left = len(names) - limit
  return ', '.join(
      names[:limit]) + (f', and {left} more' if more and left > 0 else '')


def _worst(rows, limit, more=False):
  """The first rows as 'point (ratio)', with how many more are left out."""
  return _listed(
      [f'{b["at"].replace(".", " ")} ({b["ratio"]:.2f}x)' for b in rows],
      limit,
      more)


def _spread_evenly(goals, limit=3):
  """Which points below stay below with every window's work spread evenly,
  and which fall below only then (nothing for results without that
  figure)."""
  if goals['below_balanced'] is None:
    return ''
  below = {b['at'] for b in goals['below']}
  stay = [at for at in goals['below_balanced'] if at in below]
  fall = [at for at in goals['below_balanced'] if at not in below]

  def listed(points):
    names = [at.replace('.', ' ') for at in points]
    return f' ({_listed(names, limit)})' if points else ''

  parts = [
      f'{len(stay)} of them {"stays" if len(stay) == 1 else "stay"} below'
      f'{listed(stay)} and the others lose to imbalance between the workers'
  ] if below else []
  if fall:
    parts.append(
        f'{len(fall)} other {"point falls" if len(fall) == 1 else "points fall"}'
        f' below{listed(fall)}, where the baseline\'s imbalance is the larger')
  return (
      ' With every window\'s work spread evenly over the workers, the '
      f'baseline\'s too, {"; ".join(parts)}.') if parts else ''


def _within_noise(below):
  """How many points below the floor a run can and cannot tell from it."""
  highs = [b['interval'][1] for b in below if b['interval'] is not None]
  reaching = sum(1 for high in highs if high >= v4_summary.NEVER_SLOWER)
  return (
      f' An interval of at least {v4_summary.INTERVAL_COVERAGE:.0%} for '
      'the median over seeds (a seed\'s placements share its requests) '
      f'reaches {v4_summary.NEVER_SLOWER:.2f}x at {reaching} of them, '
      'which the run cannot tell from the floor, and stays below it at '
      f'{len(highs) - reaching}' + (
          f'; {len(below) - len(highs)} '
          f'{"has" if len(below) - len(highs) == 1 else "have"} too few '
          'seeds for one' if len(highs) < len(below) else '') + '.')


def _other_references(goals, meta, limit=3):
  """Where the default loses by measures beside the goals' own."""
  stateless = goals['below_stateless']
  listed = _worst(stateless, limit)
  return (
      ' Against 2.77.0\'s stateless path, the second streaming reference '
      '(per-bundle batches on the reading worker, no shuffle), it is below '
      f'{v4_summary.NEVER_SLOWER:.2f}x at {len(stateless)} of '
      f'{goals["streaming_points"]} streaming points'
      f'{", the worst " + listed if stateless else ""}. Scored over '
      f'{v4_summary.window_text(meta, "2s")} windows instead of '
      f'{v4_summary.window_text(meta)}, {len(goals["below_2s"])} of '
      f'{goals["points"]} points are below its deployment\'s baseline.' +
      _from_start(goals, meta))


def _from_start(goals, meta, limit=3):
  """Streaming scored from the run's start, as a sentence with a leading
  space (empty for results without it)."""
  below = goals['below_from_start']
  if below is None:
    return ''
  listed = _worst(below, limit)
  return (
      f' Scored from the run\'s start over {v4_summary.window_text(meta)} '
      'windows, cold caches included, '
      f'{len(below)} of {goals["streaming_points"]} streaming points are '
      'below it' + (f', the worst {listed}' if below else '') + '.')


def _span(values, digits=2) -> str:
  low, high = min(values), max(values)
  if f'{low:.{digits}f}' == f'{high:.{digits}f}':
    return f'{low:.{digits}f}'
  return f'{low:.{digits}f} to {high:.{digits}f}'


def decoding(results) -> str:
  """Where the default misses half of the bound's gain with decoding: how
  many misses are streaming, how many streaming points reach it with every
  window's work spread evenly, and, by ratio of prefixes to a worker's
  cache, those that stay under half that way with the bound's ratio that
  way and their token hit rates (the default's, `lpt`'s and the
  bound's)."""
  section = results['v4']
  goals = v4_summary.goals(section)
  shares = {s['at']: s for s in goals['shares']}

  def reached(share):
    # None where the bound gains nothing: no share to reach.
    return share is not None and share >= v4_summary.SHARE_TARGET

  missed = [at for at, s in shares.items() if not reached(s['share'])]
  streaming = []
  for dep, workload, r_key, d_key, point in v4_summary.points(section):
    at = f'{dep}.{workload}.{r_key}.{d_key}'
    if at in shares and dep.startswith('streaming'):
      streaming.append((r_key, workload, shares[at], point))
  head = (
      f'{len(missed)} of the {len(shares)} points with decoding miss half '
      'of the bound\'s gain, '
      f'{sum(at.startswith("streaming") for at in missed)} of them in '
      'streaming.')
  if any('share_balanced' not in s for _, _, s, _ in streaming):
    # Results from before the balanced figure.
    return head
  as_scored = sum(reached(s['share']) for _, _, s, _ in streaming)
  evenly = sum(reached(s['share_balanced']) for _, _, s, _ in streaming)
  under = {}
  for r_key, workload, s, point in streaming:
    if not reached(s['share_balanced']):
      under.setdefault(r_key, []).append((workload, s, point))
  parts = []
  for r_key in sorted(under, key=lambda r: float(r[1:].replace('_', '.'))):
    rows = under[r_key]
    hits = {
        name: _span([point[name]['hit_rate'] for _, _, point in rows])
        for name in ('default', 'lpt', 'bound')
    }
    shares_of_rows = [
        s['share_balanced'] for _, s, _ in rows
        if s['share_balanced'] is not None
    ]
    share_text = (
        f'share{"s" if len(shares_of_rows) > 1 else ""} '
        f'{_span(shares_of_rows)}' if shares_of_rows else 'no share')
    parts.append(
        f'{len(rows)} at {r_key} ('
        f'{", ".join(sorted({w for w, _, _ in rows}))}; {share_text} of a '
        'bound at '
        f'{_span([p["bound"]["ratio_balanced"] for _, _, p in rows])}x; '
        'token hit '
        f'rates {hits["default"]} for the default, {hits["lpt"]} for '
        f'`lpt`, {hits["bound"]} for the bound)')
  window = v4_summary.window_text(section['meta'])
  text = (
      f'{head} With each {window} window\'s work spread evenly over '
      'the workers, the default reaches half of the bound\'s gain at '
      f'{evenly} of the {len(streaming)} streaming points with decoding '
      f'({as_scored} as scored).')
  if parts:
    text += (
        f' Of the {len(streaming) - evenly} that stay under half that way, ' +
        '; '.join(parts) + '.')
  return text
