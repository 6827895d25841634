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

"""Tests of the fleet-size runs of bench/research_v4.py."""

import json

import pytest

from bench import research_v4
from bench import v4
from bench.deploy_test import shared_request

# A fleet run of a few seconds: W1 or W4 on 4 workers, one seed.
SMALL = dict(workers=4, requests=600, seeds=[7])


def _figures(default, steady):
  return {
      'default': default,
      'lpt': default + 0.5,
      'bound': default + 1.0,
      'share': 0.25,
      'steady': steady,
      't0_s': 12.0,
  }


def test_fleet_table_puts_runs_side_by_side_and_marks_unsteady_points():
  text = research_v4.fleet_table({
      'small': {
          'batch.W2.R4.D0': _figures(2.0, True),
          'streaming_F2.W2.R4.D0': _figures(1.5, True),
      },
      'large': {
          'batch.W2.R4.D0': _figures(2.25, True),
      },
  })
  lines = text.splitlines()
  assert lines[0] == '| point | small | large |'
  assert lines[2] == (
      '| batch.W2.R4.D0 | 2.00 (lpt 2.50, bound 3.00) '
      '| 2.25 (lpt 2.75, bound 3.25) |')
  # A point one run lacks is a dash there.
  assert lines[3] == (
      '| streaming_F2.W2.R4.D0 | 1.50 (lpt 2.00, bound 2.50) | - |')
  # A point only a later run has is shown too.
  later = research_v4.fleet_table({
      'small': {}, 'large': {
          'batch.W2.R4.D0': _figures(2.25, True)
      }
  })
  assert later.splitlines()[2] == (
      '| batch.W2.R4.D0 | - | 2.25 (lpt 2.75, bound 3.25) |')
  unsteady = research_v4.fleet_table(
      {'small': {
          'batch.W2.R4.D0': _figures(2.0, False)
      }})
  assert 'bound 3.00, not steady)' in unsteady


def test_fleet_table_counts_and_averages_the_points_all_runs_share():
  low = dict(_figures(0.9, True), serial={'default': 0.8, 'lpt': 1, 'bound': 2})
  high = dict(
      _figures(1.6, True), serial={
          'default': 1.8, 'lpt': 2, 'bound': 3
      })
  runs = {
      'a': {
          'batch.W1.R4.D0': low, 'streaming_F2.W1.R4.D0': high
      },
      'b': {
          'batch.W1.R4.D0': high
      },
  }
  lines = research_v4.fleet_table(runs).splitlines()
  # Only the point both runs have counts: 0.9 against 1.6.
  assert lines[-2] == '| below 0.97, of 1 shared points | 1 | 0 |'
  assert lines[-1] == '| geometric mean, shared points | 0.900 | 1.600 |'
  serial = research_v4.fleet_table({'a': runs['a']}, serial=True)
  # sqrt(0.8 * 1.8) = 1.2
  assert serial.splitlines()[-2:] == [
      '| below 0.97, of 2 shared points | 1 |',
      '| geometric mean, shared points | 1.200 |',
  ]
  # Runs that share no point get no summary.
  alone = research_v4.fleet_table({'a': {}, 'b': runs['b']}).splitlines()
  assert not alone[-1].startswith('| geometric')


def test_fleet_runs_every_required_point_at_the_fleet_size_asked():
  pytest.importorskip('apache_beam.transforms.util')
  seeds, charges = v4.EVAL_SEEDS, v4._charges
  points = research_v4.fleet('W2', workers=6, requests=900, seeds=[7])
  # The module's seeds and charges are as they were.
  assert v4.EVAL_SEEDS == seeds and v4._charges is charges
  for deployment in v4.DEPLOYMENTS:
    for r_key, decode in v4.REQUIRED:
      figures = points[f'{deployment}.W2.R{r_key}.D{decode}']
      assert figures['workers'] == 6
      assert figures['seeds'] == [7]
      assert figures['bound'] >= figures['default'] > 0
      assert figures['bound'] >= figures['lpt'] > 0


def test_a_free_measuring_step_is_never_slower_in_batch():
  pytest.importorskip('apache_beam.transforms.util')
  kwargs = dict(
      SMALL, groups=('batch', ))
  own = research_v4.fleet('W1', **kwargs)
  free = research_v4.fleet('W1', measuring_spread=0, **kwargs)
  assert set(own) == set(free) and all(p.startswith('batch') for p in own)
  # The same placement without the measuring step's shuffles.
  assert all(free[p]['default'] >= own[p]['default'] for p in own)
  assert any(free[p]['default'] > own[p]['default'] for p in own)
  with pytest.raises(ValueError, match='measuring_spread.*-1'):
    research_v4.fleet('W1', measuring_spread=-1, **kwargs)


def test_the_measuring_shards_of_the_model_can_be_changed():
  pytest.importorskip('apache_beam.transforms.util')
  kwargs = dict(
      SMALL, groups=('batch', ))
  own = research_v4.fleet('W1', **kwargs)
  other = research_v4.fleet(
      'W1', measuring_shards=4, measured_whole_batches=0, **kwargs)
  assert set(own) == set(other)
  assert any(other[p]['default'] != own[p]['default'] for p in own)
  # The model's own values are back once the run ends.
  assert research_v4.fleet('W1', **kwargs) == own
  with pytest.raises(ValueError, match='measuring_shards.*1'):
    research_v4.fleet('W1', measuring_shards=1, **kwargs)
  with pytest.raises(ValueError, match='measured_whole_batches.*-1'):
    research_v4.fleet('W1', measured_whole_batches=-1, **kwargs)


def test_sorted_input_changes_only_the_batch_reading_order():
  pytest.importorskip('apache_beam.transforms.util')
  kwargs = dict(
      SMALL, groups=('batch', ))
  arrival = research_v4.fleet('W1', **kwargs)
  grouped = research_v4.fleet('W1', input_order='sorted', **kwargs)
  assert set(arrival) == set(grouped)
  # Read grouped by prefix, the baseline reuses its caches as keyed
  # batching does: the default gains less over it.
  for point in ('batch.W1.R0_25.D0', 'batch.W1.R4.D0'):
    assert grouped[point]['default'] < arrival[point]['default'] - 0.1
  assert sum(p['default'] for p in grouped.values()) < sum(
      p['default'] for p in arrival.values())
  with pytest.raises(ValueError, match="input_order.*'random'"):
    research_v4.fleet('W1', input_order='random', **kwargs)


def test_batch_hash_moves_only_the_keyed_placement():
  pytest.importorskip('apache_beam.transforms.util')
  points = research_v4.fleet('W1', **dict(SMALL, groups=('batch', )))
  cut = {p: v for p, v in points.items() if p.startswith('batch.')}
  hashed = {
      p.replace('batch_hash.', 'batch.'): v
      for p, v in points.items() if p.startswith('batch_hash.')
  }
  assert cut and set(cut) == set(hashed)
  # The baseline (so the bound's ratio) and lpt's own placement stay.
  for point in cut:
    assert hashed[point]['bound'] == cut[point]['bound']
    assert hashed[point]['lpt'] == cut[point]['lpt']
  assert any(hashed[p]['default'] != cut[p]['default'] for p in cut)


def test_the_rate_can_be_changed_for_a_run():
  # Batch reads its input at once: the rate moves streaming only.
  pytest.importorskip('apache_beam.transforms.util')
  kwargs = dict(
      SMALL, groups=('streaming', ))
  own = research_v4.fleet('W1', **kwargs)
  faster = research_v4.fleet('W1', rate=4 * v4.RATE_PER_WORKER, **kwargs)
  assert any(faster[p]['default'] != own[p]['default'] for p in own)
  # The run's own rate is back once the run ends.
  assert research_v4.fleet('W1', **kwargs) == own


def test_the_engine_model_can_be_changed_for_a_run():
  pytest.importorskip('apache_beam.transforms.util')
  kwargs = dict(
      SMALL, groups=('batch', ))
  own = research_v4.fleet('W4', **kwargs)
  dearer = research_v4.fleet('W4', engine={'request_tokens': 200}, **kwargs)
  # A dearer request weighs the prefill the cache saves less.
  assert dearer['batch.W4.R4.D0']['bound'] < own['batch.W4.R4.D0']['bound']
  with pytest.raises(TypeError, match='request_cost'):
    research_v4.fleet('W4', engine={'request_cost': 1}, **kwargs)


def test_a_fleet_run_records_the_settings_it_ran_with(tmp_path):
  pytest.importorskip('apache_beam.transforms.util')
  research_v4.main([
      'fleet',
      'run',
      'W1',
      '--workers',
      '4',
      '--requests',
      '600',
      '--seeds',
      '7',
      '--groups',
      'batch',
      '--out',
      str(tmp_path),
      '--rate',
      '8',
      '--engine',
      '{"request_tokens": 50}'
  ])
  doc = json.loads((tmp_path / 'run.json').read_text())
  assert (doc['rate'], doc['engine']) == (8, {'request_tokens': 50})
  assert {point.split('.')[0]
          for point in doc['points']} == {'batch', 'batch_hash'}


def test_fleet_table_balanced_gives_the_even_spread_and_its_share():
  streaming = dict(
      _figures(1.5, True), balanced={
          'default': 1.2, 'lpt': 1.25, 'bound': 1.4
      })
  text = research_v4.fleet_table({
      'run': {
          'batch.W1.R4.D0': _figures(2.0, True),
          'streaming_F3.W1.R4.D0': streaming,
      }
  },
                                 balanced=True)
  lines = text.splitlines()
  # A point without balanced figures is a dash; the share is
  # (1.2 - 1) / 0.4.
  assert lines[2] == '| batch.W1.R4.D0 | - |'
  assert lines[3] == (
      '| streaming_F3.W1.R4.D0 | 1.20 (lpt 1.25, bound 1.40, share 0.50) |')


def test_fleet_table_serial_gives_the_one_at_a_time_ratios_and_share():
  figures = dict(
      _figures(1.5, True),
      balanced={
          'default': 1.2, 'lpt': 1.25, 'bound': 1.4
      },
      serial={
          'default': 1.1, 'lpt': 1.3, 'bound': 1.5
      })
  runs = {'run': {'streaming_F3.W1.R4.D0': figures}}
  lines = research_v4.fleet_table(runs, serial=True).splitlines()
  # The share is (1.1 - 1) / 0.5.
  assert lines[2] == (
      '| streaming_F3.W1.R4.D0 | 1.10 (lpt 1.30, bound 1.50, share 0.20) |')
  with pytest.raises(ValueError, match='balanced or serial'):
    research_v4.fleet_table(runs, balanced=True, serial=True)


def test_fleet_weighs_a_policy_other_than_the_default():
  pytest.importorskip('apache_beam.transforms.util')
  kwargs = dict(
      SMALL, groups=('streaming', ))
  own = research_v4.fleet('W1', **kwargs)
  assert research_v4.fleet('W1', policy={}, **kwargs) == own
  other = research_v4.fleet('W1', policy={'own_batches_from': 8}, **kwargs)
  assert set(other) == set(own)
  assert any(other[p]['default'] != own[p]['default'] for p in own)
  assert any(
      other[p]['serial']['default'] != own[p]['serial']['default'] for p in own)
  # The bound does not depend on the policy (lpt places its batches).
  assert all(other[p]['bound'] == own[p]['bound'] for p in own)
  with pytest.raises(TypeError, match='split_for'):
    research_v4.fleet('W1', policy={'split_for': 1}, **kwargs)


def test_balanced_ratios_are_bounded_by_the_bound():
  pytest.importorskip('apache_beam.transforms.util')
  points = research_v4.fleet('W1', workers=4, requests=600, seeds=[7])
  for figures in points.values():
    balanced = figures['balanced']
    # The baseline spread evenly is at least as fast as on its busiest
    # worker, while the bound's capacity is the same both ways: the bound
    # gains less over it. Spread evenly, no strategy's total work passes
    # the bound's.
    assert balanced['bound'] <= figures['bound'] + 1e-9
    assert balanced['bound'] >= balanced['default'] > 0
    assert balanced['bound'] >= balanced['lpt'] > 0


def test_cold_keys_pooled_for_the_fleet_change_only_streaming():
  pytest.importorskip('apache_beam.transforms.util')
  kwargs = dict(SMALL)
  own = research_v4.fleet('W0', **kwargs)
  pooled = research_v4.fleet('W0', cold_scope='fleet', **kwargs)
  assert set(own) == set(pooled)
  # W0's prompts share nothing, so every key is cold.
  streaming = [p for p in own if p.startswith('streaming')]
  assert any(pooled[p]['default'] != own[p]['default'] for p in streaming)
  for point in own:
    if point.startswith('batch'):
      assert pooled[point]['default'] == own[point]['default']
  with pytest.raises(ValueError, match="cold_scope.*'worker'"):
    research_v4.fleet('W0', cold_scope='worker', **kwargs)


def test_the_cold_split_of_the_model_can_be_changed():
  pytest.importorskip('apache_beam.transforms.util')
  kwargs = dict(
      SMALL, groups=('streaming', ))
  own = research_v4.fleet('W0', cold_scope='fleet', **kwargs)
  finer = research_v4.fleet(
      'W0', cold_scope='fleet', cold_split_fills=2, **kwargs)
  assert any(finer[p]['default'] != own[p]['default'] for p in own)
  # The model's own value is back once the run ends.
  assert research_v4.fleet('W0', cold_scope='fleet', **kwargs) == own
  with pytest.raises(ValueError, match='cold_split_fills.*1'):
    research_v4.fleet('W0', cold_split_fills=1, **kwargs)


def test_lru_hit_rate_counts_hits_from_t0_on():
  requests = [shared_request(i, 1.0 * i, i % 2) for i in range(6)]
  # Everything fits: each prefix computed once, 4 of its 5 blocks a hit
  # in every later request.
  assert research_v4.lru_hit_rate(requests, 100, 0) == pytest.approx(4 * 4 / 30)
  # A cache of 5 blocks holds the last request only: prefixes take turns
  # and never hit.
  assert research_v4.lru_hit_rate(requests, 5, 0) == 0.0
  # From the cell of 2 s on (2 s cells): the last 4 requests, all hits.
  assert research_v4.lru_hit_rate(requests, 100, 1) == pytest.approx(4 * 4 / 20)


def test_pooled_lru_prints_the_three_hit_rates(capsys):
  research_v4.main(['pooled-lru', 'W1', '64', '--seed', '1', '--t0-s', '0'])
  line = capsys.readouterr().out
  assert line.startswith('W1 R64 seed 1: pooled ')
  rates = dict(part.split()[-2:] for part in line.split(': ')[1].split(', '))
  assert set(rates) == {'pooled', 'one_worker', 'bound'}
  assert float(rates['one_worker']) <= float(rates['pooled'])
  assert float(rates['pooled']) <= float(rates['bound'])


def test_table_reads_the_serial_ratios_when_asked(tmp_path, capsys):
  for name, ratios, serial in (('a', 1.2, 0.8), ('b', 1.1, 1.05)):
    (tmp_path / f'{name}.json').write_text(
        json.dumps({
            'ratios': {
                'streaming_F2.W1.R4.D64': ratios
            },
            'ratios_serial': {
                'streaming_F2.W1.R4.D64': serial
            },
        }))
  research_v4.main(['table', str(tmp_path), 'a', 'b'])
  assert '| streaming_F2.W1.R4.D64 | 1.20 | 1.10 |' in capsys.readouterr().out
  research_v4.main(['table', str(tmp_path), 'a', 'b', '--serial'])
  out = capsys.readouterr().out
  assert '| streaming_F2.W1.R4.D64 | 0.80 | 1.05 |' in out
  assert '| below 0.97 | 1 | 0 |' in out


def test_fleet_points_take_a_full_runs_workload_and_deployments():
  from bench.report_test import small_results
  section = small_results()['v4']
  every = research_v4.fleet_points(section)
  streaming = research_v4.fleet_points(section, 'W2', ('streaming', ))
  assert streaming and set(streaming) < set(every)
  assert all(
      p.startswith(('streaming_F2.W2.', 'streaming_F3.W2.')) for p in streaming)
  assert {
      p
      for p in every if p.split('.')[1] == 'W2' and not p.startswith('batch')
  } == set(streaming)
  point = section['streaming_F3']['W2']['R4']['D64']
  figures = streaming['streaming_F3.W2.R4.D64']
  assert figures['default'] == point['default']['ratio']
  assert figures['lpt'] == point['lpt']['ratio']
  assert figures['serial']['default'] == point['default']['ratio_serial']
  assert figures['balanced']['bound'] == point['bound']['ratio_balanced']
  batch = research_v4.fleet_points(section, 'W2', ('batch', ))
  assert batch and all(
      p.startswith(('batch.W2.', 'batch_hash.W2.')) for p in batch)


def test_from_results_writes_a_full_runs_workload_as_a_fleet_run(tmp_path):
  from bench.report_test import small_results
  results = small_results()
  path = tmp_path / 'results.json'
  path.write_text(json.dumps(results))
  research_v4.main([
      'from-results',
      'full_W2',
      'W2',
      '--results',
      str(path),
      '--groups',
      'batch',
      '--out',
      str(tmp_path / 'runs'),
  ])
  written = json.loads((tmp_path / 'runs' / 'full_W2.json').read_text())
  assert written['points'] == research_v4.fleet_points(
      results['v4'], 'W2', ('batch', ))
  assert written['groups'] == ['batch'] and written['workload'] == 'W2'


def test_a_run_from_before_batch_hash_reads_its_hashed_points_under_it(
    tmp_path):
  figures = {'default': 0.8, 'lpt': 0.9, 'bound': 1.0}
  for name, placement in (('cut', 'cut'), ('hashed', 'hash'), ('new', None)):
    doc = {'points': {'batch.W1.R4.D0': figures, 'streaming_F2.W1.R4.D0': {}}}
    if placement:
      doc['batch_placement'] = placement
    (tmp_path / f'{name}.json').write_text(json.dumps(doc))
  read = research_v4._read(  # pylint: disable=protected-access
      tmp_path, ['cut', 'hashed', 'new'], 'points')
  assert set(read['hashed']) == {'batch_hash.W1.R4.D0', 'streaming_F2.W1.R4.D0'}
  assert read['cut'] == read['new'] == {
      'batch.W1.R4.D0': figures, 'streaming_F2.W1.R4.D0': {}
  }
