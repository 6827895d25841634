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

"""Tests of phase C's pure parts: the runs, their order, the ratios."""

import pytest

from bench import overhead


def test_every_ratio_is_over_a_base_run():
  plan = overhead.runs(quick=False)
  for name, (numerator, denominator, _) in overhead.RATIOS.items():
    assert plan[denominator]['tree'] == 'base', name
    assert plan[numerator]['tree'] == 'patched', name
    # The same elements and batch sizes as the denominator.
    for field in ('elements', 'keys', 'repetitions'):
      assert plan[numerator][field] == plan[denominator][field], name
    for field in ('min_batch_size', 'max_batch_size'):
      assert plan[numerator]['batch'][field] == plan[denominator]['batch'][
          field], name


def test_the_runs_of_the_issue():
  plan = overhead.runs(quick=False)
  for keys in (10_000, 30_000):
    assert plan[f'keyed_{keys}']['keys'] == keys
    assert plan[f'keyed_{keys}']['batch']['num_shards'] == 1
    assert plan[f'default_{keys}']['batch']['num_shards'] == 'default'
    assert f'default_{keys}_over_stateful' in overhead.RATIOS
  assert plan['keyed_10000']['elements'] == 160_000
  assert plan['keyed_30000']['repetitions'] == 5
  quick = overhead.runs(quick=True)
  assert quick['keyed_10000']['keys'] > 1000
  assert all(quick[name]['elements'] <= plan[name]['elements'] for name in plan)


def test_schedule_runs_each_once_per_repetition_in_rotating_order():
  order = overhead.schedule(['a', 'b', 'c'], 4)
  assert [name for _, name in order
          ] == ['a', 'b', 'c', 'b', 'c', 'a', 'c', 'a', 'b', 'a', 'b', 'c']
  assert [r for r, _ in order] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]


def test_percentile_interpolates():
  values = [5.0, 1.0, 3.0, 2.0, 4.0]
  assert overhead.percentile(values, 0) == 1.0
  assert overhead.percentile(values, 50) == 3.0
  assert overhead.percentile(values, 100) == 5.0
  assert overhead.percentile(values, 10) == pytest.approx(1.4)
  assert overhead.percentile([7.0], 90) == 7.0
  with pytest.raises(ValueError, match='no values'):
    overhead.percentile([], 50)


def test_summarize_takes_ratios_repetition_by_repetition():
  summary = overhead.summarize([12.0, 11.0, 30.0], [10.0, 11.0, 20.0])
  assert summary['per_repetition'] == [1.2, 1.0, 1.5]
  assert summary['median'] == 1.2
  assert summary['min'] == 1.0 and summary['max'] == 1.5
  assert summary['p10'] == pytest.approx(1.04)
  assert summary['p90'] == pytest.approx(1.44)
  with pytest.raises(ValueError, match='2 numerators for 1 denominators'):
    overhead.summarize([1.0, 2.0], [1.0])


def test_state_keys():
  plan = overhead.runs(quick=False)
  assert overhead.state_keys(plan['stateful_10000'], 8) == 1
  assert overhead.state_keys(plan['keyed_10000'], 8) == 10_000
  assert overhead.state_keys(plan['default_30000'], 4) == 120_000
  assert overhead.state_keys(plan['default_10000'], object()) is None


def test_measures():
  result = {'seconds': 2.0, 'batches': 4, 'elements': 10, 'weighings': 30}
  assert overhead.measures(result, 10) == {
      'seconds': 2.0,
      'mean_batch': 2.5,
      'batches': 4,
      'weighings_per_state_key': 3.0,
  }
  assert overhead.measures(result, None)['weighings_per_state_key'] is None


def fake_measurements(plan):
  """Made-up run results: a run's seconds grow with its elements and its
  repetition; keyed runs form batches of 1."""
  measured = {}
  for name, run in plan.items():
    batch = 1 if run.get('keyed') else 4
    measured[name] = [
        overhead.measures({
            'seconds': run['elements'] / 1000 * (1 + r / 10) *
            (1.5 if run.get('keyed') else 1.0),
            'batches': run['elements'] // batch,
            'elements': run['elements'],
            'weighings': 7 * run['keys'],
        },
                          overhead.state_keys(run, 8))
        for r in range(run['repetitions'])
    ]
  return measured


def test_figures_report_every_ratio_with_its_interval():
  plan = overhead.runs(quick=True)
  figures, runs = overhead.figures(plan, fake_measurements(plan), 1, 8)
  assert set(figures) == set(overhead.RATIOS)
  assert figures['keyed_10000_over_stateful'] == pytest.approx(1.5)
  assert figures['default_30000_mean_batch_over_stateful'] == pytest.approx(
      0.25)
  ratio = runs['ratios']['default_10000_over_stateful']
  assert ratio['per_repetition'] == pytest.approx([1.5])
  assert runs['default_num_shards'] == '8'
  assert runs['runs']['keyed_10000']['median_s'] == pytest.approx(
      plan['keyed_10000']['elements'] / 1000 * 1.5)
