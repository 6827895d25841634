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

"""Tests of the report: it is rendered from results.json alone."""

import json

from bench import report
from bench import streaming
from bench.workloads_test import SMALL


def small_results():
  builders = streaming.strategies(8, SMALL.batch_size)
  figures, sweep, runs = streaming.phase(
      [SMALL], (1, 2), (2, 4, 8), builders, (16, 2), (1, ), (1.1, ),
      progress=lambda _: None)
  workloads = {SMALL.name: SMALL.describe()}
  workloads[SMALL.name]['bound'] = figures[SMALL.name].pop('bound')
  return {
      'meta': {
          'command': 'tox -e bench',
          'skipped': ['validate', 'engine', 'overhead'],
          'started_utc': 'then',
          'duration_s': 12.0,
          'machine': 'here',
          'python': '3.11',
          'beam_tree_commit': 'abc123',
          'packages': {
              'apache-beam': '2.77.0'
          },
          'seeds': [1, 2],
          'rates_per_worker': [2, 4, 8],
          'middle_rate_per_worker': 4,
          'default_num_shards': '8',
          'adaptive': False,
          'batch_overhead_tokens': 16.0,
          'request_overhead_tokens': 2.0,
          'overhead_source': 'reference',
          'strategies': list(builders),
      },
      'workloads': workloads,
      'streaming': figures,
      'streaming_sweep': sweep,
      'streaming_runs': runs,
  }


def test_report_shows_the_results_figures():
  results = json.loads(json.dumps(small_results()))
  text = report.render(results)
  assert 'abc123' in text and 'validate, engine, overhead' in text
  row = results['streaming'][SMALL.name]['keyed_1']
  assert f'{row["hit_rate"]:.3f}' in text
  assert f'{row["throughput_vs_baseline"]:.2f}' in text
  bound = results['workloads'][SMALL.name]['bound']['hit_rate']
  assert f'{bound:.3f}' in text


def test_write_puts_results_and_report_side_by_side(tmp_path):
  results = small_results()
  report.write(results, tmp_path)
  written = json.loads((tmp_path / 'results.json').read_text())
  assert written['meta']['beam_tree_commit'] == 'abc123'
  assert (tmp_path / 'report.md').read_text() == report.render(written)


def test_overhead_ratios_are_shown_repetition_by_repetition():
  times = {'keyed_512': [12.0, 11.0], 'stateful': [10.0, 11.0]}
  ratios = report._per_repetition('keyed_512_over_stateful', times)
  assert ratios == '1.20, 1.00'
  assert report._per_repetition('state_cache_weighings_per_key', times) == ''
