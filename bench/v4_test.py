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

"""Tests of benchmark v4's phase A: the bound, the placements, the schema."""

import functools
import json
import statistics
from pathlib import Path

import pytest

from bench import costs
from bench import deploy
from bench import policies
from bench import v4
from bench import v4_summary
from bench import workloads

SPEC = policies.TwoStageSpec(
    rate_per_shard=1.0,
    split_from=2.0,
    max_shards=64,
    decay_secs=30.0,
    run_batches=1,
    own_batches_from=8)
# Every v4 workload at a size a test runs in seconds.
TINY = tuple(
    w.scaled(
        requests=600 if w.name != 'W2' else 900,
        workers=4 if w.name != 'W2' else 6) for w in v4.WORKLOADS)


def _quick_run(workloads_run, **kwargs):
  """v4.run_all(SPEC, ...) of a quick run, in this process, quietly."""
  return v4.run_all(
      SPEC,
      costs.GPU,
      quick=True,
      progress=lambda _: None,
      processes=1,
      chosen=tuple(workloads_run),
      **kwargs)


@functools.cache
def _done():
  return json.dumps(
      _quick_run(
          w.scaled(requests=w.requests * v4.QUICK_DIVISOR) for w in TINY))


def done():
  """The tasks of a tiny quick run (JSON round trip: as results.json
  holds them)."""
  out = json.loads(_done())
  for task in out:
    for dep in task['deployments'].values():
      figures = dep['figures']
      for key in list(figures):
        if key != 'p_sweep':
          figures[int(key)] = figures.pop(key)
      if 'p_sweep' in figures:
        figures['p_sweep'] = {int(p): v for p, v in figures['p_sweep'].items()}
  return out


def test_the_bound_is_above_every_strategy_at_every_placement():
  checked = 0
  for task in done():
    for dep, info in task['deployments'].items():
      for decode, rows in info['figures'].items():
        if decode == 'p_sweep':
          continue
        (bound, ) = rows['bound']
        (shuffled, ) = rows['bound_shuffled']
        for name, figures in rows.items():
          if name == 'bound':
            continue
          assert name in (
              'baseline',
              'default',
              'adaptive_v3',
              'keyed_8',
              'lpt',
              'stateless',
              'bound_shuffled')
          for figure in figures:
            for window, capacity in figure['capacity'].items():
              if window == deploy.FROM_START:
                # Scored from the start, cold caches included: the bound is
                # of the steady state.
                continue
              assert bound['capacity'][window] >= capacity, (
                  task['task'], dep, decode, name, window)
              if name in ('default', 'adaptive_v3', 'lpt'):
                # They shuffle each element twice, as the shuffled bound.
                assert shuffled['capacity'][window] >= capacity, (
                    task['task'], dep, decode, name, window)
              checked += 1
  assert checked > 1000


def test_placements_are_namespaced_by_seed():
  assert v4.salts_of(1) != v4.salts_of(2)
  assert len(set(v4.salts_of(1))) == len(v4.SALTS)
  assert not set(v4.EVAL_SEEDS) & set(v4.TUNING_SEEDS)


def test_the_summary_holds_every_required_point():
  section = v4_summary.summarize(done(), {'eval_seeds': [v4.EVAL_SEEDS[0]]})
  assert v4_summary.missing_points(section) == []
  point = section['streaming_F3']['W1']['R4']['D64']
  for name in ('default',
               'keyed_8',
               'lpt',
               'bound',
               'baseline',
               'aa',
               'adaptive_v3',
               'stateless'):
    for field in ('ratio', 'ratio_min', 'ratio_max'):
      assert isinstance(point[name][field], float), (name, field)
  for name in ('default', 'adaptive_v3', 'keyed_8', 'baseline'):
    for field in ('hit_rate', 'mean_batch_size'):
      assert 0 < point[name][field]
  assert point['baseline']['ratio'] == 1.0
  # adaptive_v3 is measured on its own, not copied from the default.
  assert point['adaptive_v3']['ratios'] != point['default']['ratios']
  assert len(point['default']['ratios']) == len(v4.SALTS)
  # W0 is one run, written under every required R.
  w0 = section['batch']['W0']
  assert w0['R0_25']['D64'] == w0['R4']['D64'] == w0['R64']['D64']
  sweep = section['streaming_F2']['p_sweep']['processes']
  assert set(sweep) == {str(p) for p in v4.P_SWEEP}
  # At the deployment's own P the sweep is the point itself; elsewhere the
  # default runs with P processes as the baseline does.
  assert sweep[str(v4.PROCESSES_PER_WORKER)]['ratio'] == (
      section['streaming_F2']['W1']['R4']['D0']['default']['ratio'])
  for task in done():
    figures = task['deployments'].get('streaming_F2', {}).get('figures', {})
    for rows in figures.get('p_sweep', {}).values():
      assert set(rows) == {'baseline', 'default'}
      assert len(rows['default']) == len(v4.SALTS)


def test_batch_points_report_no_delay_and_streaming_points_a_real_one():
  section = v4_summary.summarize(done(), {})
  batch = section['batch']['W1']['R4']['D64']
  streaming = section['streaming_F3']['W1']['R4']['D64']
  # A batch job's batches have an order, not an emission time.
  for name, row in batch.items():
    assert 'p99_delay_s' not in row, name
  for name in ('default', 'baseline', 'lpt'):
    # Buffering holds an element at most its buffering period, and the
    # runner emits it no sooner than it arrives.
    assert 0 < streaming[name]['p99_delay_s'] <= v4.BUFFERING_S


def test_streaming_is_also_scored_from_the_runs_start():
  tasks = done()
  section = v4_summary.summarize(tasks, {})
  later = 0
  for task in tasks:
    for dep, info in task['deployments'].items():
      for decode, rows in info['figures'].items():
        if decode == 'p_sweep':
          continue
        for name in ('baseline', 'default', 'stateless'):
          for figure in rows.get(name, []):
            capacity = figure['capacity']
            # Batch scores the whole job: it has no steady state to leave.
            streaming = dep.startswith('streaming')
            assert (deploy.FROM_START in capacity) == streaming, dep
            if streaming and info['t0_s'] == 0:
              assert capacity[deploy.FROM_START] == capacity['10s']
            if streaming and info['t0_s'] > 0:
              later += capacity[deploy.FROM_START] != capacity['10s']
  # Where the steady state starts later, the cold start is scored too.
  assert later
  for dep, _, _, _, point in v4_summary.points(section):
    assert ('ratio_from_start'
            in point['default']) == dep.startswith('streaming')
  below = v4_summary.goals(section)['below_from_start']
  assert all(b['ratio'] < v4_summary.NEVER_SLOWER for b in below)
  assert [b['ratio'] for b in below] == sorted(b['ratio'] for b in below)


def test_goals_list_the_points_below_the_floor():
  section = v4_summary.summarize(done(), {})
  goals = v4_summary.goals(section)
  assert goals['points'] == sum(1 for _ in v4_summary.points(section))
  for below in goals['below']:
    assert below['ratio'] < v4_summary.NEVER_SLOWER
  assert [b['ratio'] for b in goals['below']
          ] == sorted(b['ratio'] for b in goals['below'])
  assert {(w['deployment'], w['workload'])
          for w in goals['wins']} == {(d, w)
                                      for d in v4.DEPLOYMENTS
                                      for w in ('W1', 'W2', 'W4')}


def test_the_median_interval_takes_the_order_statistics_that_cover_it():
  # Twelve placements: the 3rd least and 3rd greatest cover the median
  # with chance 1 - 2 * (1 + 12 + 66) / 4096; the 4th would cover it with
  # only 0.854.
  values = [1.2, 0.9, 1.0, 0.8, 1.1, 0.95, 1.05, 0.85, 1.15, 0.7, 1.3, 0.99]
  low, high, coverage = v4_summary.median_interval(values, 0.95)
  assert (low, high) == (0.85, 1.15)
  assert coverage == pytest.approx(1 - 2 * 79 / 4096)
  # Coverage can be asked for: at 0.8 the 4th values do.
  assert v4_summary.median_interval(values, 0.8)[:2] == (0.9, 1.1)
  # Three values cannot cover it with 0.95; four seeds' least and
  # greatest cover it with 0.875, the default's least coverage.
  assert v4_summary.median_interval([1.0, 0.9, 1.1], 0.95) is None
  assert v4_summary.median_interval([1.0, 0.9, 1.1, 0.8]) == (0.8, 1.1, 0.875)
  assert v4_summary.median_interval([1.0, 0.9]) is None


def test_the_interval_is_over_seeds_not_placements():
  # A seed's salts share its requests: a point's ratios (seed-major, one
  # per salt) count as one median per seed.
  salts = len(v4.SALTS)
  ratios = [0.8] * salts + [1.0] * salts + [1.2] * salts + [0.9] * salts
  assert v4_summary.seed_medians(ratios) == [0.8, 1.0, 1.2, 0.9]


def test_the_regimes_set_the_shareable_tokens():
  for workload in v4.WORKLOADS[1:]:
    for ratio in (0.25, 4, 64):
      point = workloads.at_ratio(workload, ratio)
      assert point.shareable_tokens == pytest.approx(
          ratio * workloads.CACHE_TOKENS, rel=0.2)
  with pytest.raises(ValueError, match='ratio must be positive'):
    workloads.at_ratio(v4.WORKLOADS[1], 0)


def test_each_task_describes_the_cache_it_ran_with():
  # Benchmark v3's cache followed the workload's cache_prefixes; v4's
  # is CACHE_TOKENS for every workload.
  for task in done():
    described = task['shape']['prefix_count_workload']
    assert described['cache_blocks'] * described['block_tokens'] == (
        workloads.CACHE_TOKENS)


def test_off_goal_points_use_fewer_seeds():
  assert len(v4.seeds_for('W1', '4', quick=False)) == 4
  assert len(v4.seeds_for('W1', '16', quick=False)) == 2
  assert v4.decodes_for('W2', '64', 'streaming_F3') == (64, )
  # R0_25, where the default loses most, runs at every decode length.
  assert v4.decodes_for('W2', '0_25', 'batch') == v4.DECODES
  assert v4.decodes_for('W1', '64', 'streaming_F3') == v4.DECODES


def _committed_section():
  """The committed run's v4 section."""
  path = Path(__file__).resolve().parent / 'results.json'
  section = json.loads(path.read_text()).get('v4')
  if section is None:
    pytest.skip('the committed run has no v4 section')
  return section


def _committed_points():
  """The points of the committed run's v4 section."""
  return list(v4_summary.points(_committed_section()))


def test_the_committed_runs_points_below_the_floor_carry_an_interval():
  section = _committed_section()
  points = {'.'.join(at): point for *at, point in v4_summary.points(section)}
  goals = v4_summary.goals(section)
  assert goals['below']
  for below in goals['below']:
    ratios = points[below['at']]['default']['ratios']
    if below['interval'] is None:
      # Away from the goal points: two seeds give no interval of 85%.
      assert len(ratios) == 6
      continue
    low, high, _ = below['interval']
    # Twelve placements, four seeds: the least and greatest seed median.
    assert len(ratios) == 12
    seeds = v4_summary.seed_medians(ratios)
    assert len(seeds) == 4
    assert (low, high) == (min(seeds), max(seeds))
    assert low <= statistics.median(seeds) <= high


def _below(point, names, tops):
  """Checks each strategy's ratio at every placement against tops; returns
  how many it checked."""
  checked = 0
  for name in names:
    if name not in point:
      continue
    ratios = point[name].get('ratios', [point[name]['ratio']] * len(tops))
    assert len(ratios) == len(tops), name
    for mine, top in zip(ratios, tops):
      # Where a strategy reaches the bound (batch W0 without decoding: the
      # baseline's full, balanced batches), they differ by rounding only.
      assert top >= mine * (1 - 1e-9), name
      checked += 1
  return checked


def test_the_committed_runs_bound_is_above_every_strategy_at_every_placement():
  checked = 0
  for *at, point in _committed_points():
    names = ('default', 'keyed_8', 'lpt', 'baseline', 'stateless')
    try:
      checked += _below(point, names, point['bound']['ratios'])
    except AssertionError as e:
      raise AssertionError((at, str(e))) from e
  assert checked > 1000


def test_the_shuffled_bound_is_above_the_strategies_that_shuffle_as_often():
  # The default and its LPT placement shuffle each element twice; the
  # bound with two shuffles is above them and below the bound.
  checked = 0
  for *at, point in _committed_points():
    shuffled = point['bound_shuffled']['ratios']
    try:
      assert len(shuffled) == len(point['bound']['ratios'])
      for top, bound in zip(shuffled, point['bound']['ratios']):
        assert top <= bound
      checked += _below(point, ('default', 'adaptive_v3', 'lpt'), shuffled)
    except AssertionError as e:
      raise AssertionError((at, str(e))) from e
  assert checked > 500


def test_sorted_input_groups_each_key_and_keeps_its_order():
  requests = TINY[1].requests_at(v4.RATE_PER_WORKER, 52301)
  assert v4.in_input_order(requests, 'arrival') == requests
  ordered = v4.in_input_order(requests, 'sorted')
  assert sorted(r.rid for r in ordered) == [r.rid for r in requests]
  runs = [
      k for i, k in enumerate(r.key for r in ordered)
      if i == 0 or ordered[i - 1].key != k
  ]
  assert len(runs) == len(set(runs)) > 1
  for key in runs:
    rids = [r.rid for r in ordered if r.key == key]
    assert rids == sorted(rids)
  with pytest.raises(ValueError,
                     match="input_order must be 'arrival' or 'sorted', "
                     "got 'shuffled'"):
    _quick_run(
        TINY[1:2], groups=('batch', ), input_order='shuffled')


def test_sorted_input_gives_the_batch_baseline_its_reuse():
  # Read grouped by key, each worker's split holds few prefixes, and the
  # baseline's per-bundle batches reuse them as routing would.
  def hit_rates(input_order):
    done = _quick_run(
        [TINY[1].scaled(requests=TINY[1].requests * v4.QUICK_DIVISOR)],
        groups=('batch', ),
        input_order=input_order)
    (task, ) = [t for t in done if t['task'][2] == '4']
    rows = task['deployments']['batch']['figures'][0]
    return {name: rows[name][0]['hit_rate'] for name in ('baseline', 'default')}

  arrival = hit_rates('arrival')
  grouped = hit_rates('sorted')
  assert arrival['baseline'] < arrival['default'] - 0.1
  assert grouped['baseline'] > arrival['baseline'] + 0.1
  assert grouped['baseline'] >= grouped['default'] - 0.05


def test_each_strategy_pays_the_shuffles_its_pipeline_has():
  # 2.77.0's stateful path shuffles each element once (to its process's
  # shared key), its stateless path never; the default shuffles once to
  # batch and once more to measure the key's rate.
  charges = v4._charges(SPEC)  # pylint: disable=protected-access
  assert (charges['baseline'].shuffles,
          charges['baseline'].first_stage) == (1, False)
  assert (charges['stateless'].shuffles,
          charges['stateless'].first_stage) == (0, False)
  assert (charges['default'].shuffles,
          charges['default'].first_stage) == (1, True)
  assert (charges['keyed_8'].shuffles,
          charges['keyed_8'].first_stage) == (1, False)


def test_batch_hash_hashes_the_keyed_state_keys_and_shares_the_rest():
  def median_capacity(rows):
    return statistics.median(f['capacity']['whole'] for f in rows)

  tasks = [t for t in done() if t['task'][0] == 'batch']
  assert tasks
  for task in tasks:
    cut, hashed = (
        task['deployments'][dep]['figures'] for dep in ('batch', 'batch_hash'))
    assert cut.keys() == hashed.keys()
    for rows_cut, rows_hashed in zip(cut.values(), hashed.values()):
      for name in ('baseline', 'lpt', 'bound', 'bound_shuffled'):
        assert rows_hashed[name] == rows_cut[name], name
      # Few state keys balance worse hashed than cut by their work.
      assert median_capacity(rows_hashed['default']) < median_capacity(
          rows_cut['default']), task['task']
