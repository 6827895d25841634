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

"""Tests of beampq.gates.differential's pure parts: the matrix, the
comparison and the report (differential_pipelines_test.py runs pipelines)."""

import pytest

from beampq import Error
from beampq.gates import differential

SECOND = 1_000_000
GLOBAL_END = 9_223_371_950_454_775


def batch(elements, timestamp, w=(0, 10)):
  """A recorded batch in window w (seconds; 'global' for the global one)."""
  if w == 'global':
    window, last = 'global', GLOBAL_END
  else:
    window, last = [w[0] * SECOND, w[1] * SECOND], w[1] * SECOND - 1
  return {
      'elements': list(elements),
      'timestamp': int(timestamp * SECOND),
      'window': window,
      'window_max_timestamp': last,
  }


def result(*batches, specs=()):
  return {'batches': list(batches), 'specs': list(specs)}


def sized(sizes, w):
  """Batches of these sizes in window w, stamped inside it."""
  out, n = [], 0
  for size in sizes:
    out.append(batch([f'e{n + i}' for i in range(size)], w[0] + n * 0.01, w))
    n += size
  return out


def test_elements_interleave_three_windows_and_two_length_buckets():
  elements = differential.elements()
  assert len(elements) == differential.ELEMENTS
  for i, (_, timestamp, _) in enumerate(elements):
    assert i % 3 * 10 <= timestamp < i % 3 * 10 + 10
  lengths = {len(payload) for _, _, payload in elements}
  assert min(lengths) < 16 <= max(lengths)
  arrivals = [arrival for arrival, _, _ in elements]
  assert arrivals == sorted(arrivals)


def test_bursts_follow_the_burst_sizes():
  bursts = differential.bursts(differential.elements())
  sizes = [len(items) for _, items in bursts]
  cycle = list(differential.BURST_SIZES)
  assert sizes[:len(cycle) * 2] == cycle * 2
  assert sum(sizes) == differential.ELEMENTS
  gaps = {b[0] - a[0] for a, b in zip(bursts, bursts[1:])}
  assert gaps == {differential.BURST_GAP_SECS}


def test_cases_are_every_config_on_every_runner():
  names = [case['name'] for case in differential.cases()]
  assert len(names) == len(differential.CONFIGS) * len(differential.RUNNERS)
  assert 'stateful-windows-adaptive/BundleBasedDirectRunner' in names
  assert [case['name'] for case in differential.cases('buckets/FnApi')] == [
      'stateful-global-buckets/FnApiRunner',
      'stateful-windows-buckets/FnApiRunner',
  ]


def test_the_matrix_covers_the_issue_cases():
  configs = differential.CONFIGS
  stateful = {
      name
      for name, config in configs.items()
      if 'max_batch_duration_secs' in config['batch']
  }
  assert stateful and set(configs) - stateful
  adaptive = {
      name
      for name, config in configs.items()
      if config['batch']['min_batch_size'] < config['batch']['max_batch_size']
  }
  # Interleaved windows, adaptive sizes, on both paths.
  assert {'stateless-windows-adaptive', 'stateful-windows-adaptive'} <= adaptive
  assert configs['stateful-windows-adaptive']['windows'] == 3
  assert configs['stateful-global-buckets']['batch']['bucket_boundaries'] == [
      16
  ]
  # A non-unit element_size_fn on the stateful path only where documented.
  for name in stateful:
    if configs[name]['batch'].get('element_size_fn'):
      assert name in differential.DOCUMENTED


def test_same_batches_compare_equal():
  one = result(*sized([1, 2, 4], (0, 10)), *sized([1, 2], (10, 20)))
  assert differential.compare(one, one) == []


def test_windows_are_not_ordered_against_each_other():
  a, b = sized([1, 2], (0, 10)), sized([3], (10, 20))
  assert differential.compare(result(*a, *b), result(b[0], *a)) == []


def test_order_within_a_window_counts():
  a = sized([1, 2], (0, 10))
  lines = differential.compare(result(*a), result(a[1], a[0]))
  assert lines[0].startswith('batches differ')
  assert '    base:    [1, 2]' in lines and '    patched: [2, 1]' in lines


def test_the_issue_s_windows_show_their_sizes():
  base = result(
      *[
          b for w in ((0, 10), (10, 20), (20, 30))
          for b in sized([1, 2, 4, 8, 16, 9], w)
      ])
  patched = result(
      *sized([1, 8, 31], (0, 10)),
      *sized([2, 16, 22], (10, 20)),
      *sized([4, 32, 4], (20, 30)))
  text = '\n'.join(differential.compare(base, patched))
  assert '  [10, 20)\n    base:    [1, 2, 4, 8, 16, 9]\n    patched: [2, 16, 22]' in (
      text)
  assert 'first difference in order, batch 1' in text


def test_a_timestamp_or_content_difference_counts():
  a = sized([2], (0, 10))[0]
  moved = dict(a, timestamp=a['timestamp'] + 1)
  assert differential.compare(result(a), result(moved))
  changed = dict(a, elements=['e0', 'other'])
  assert differential.compare(result(a), result(changed))


def test_end_race_accepts_either_timer_at_the_end():
  """On the FnApiRunner the end-of-window timer or a buffering timer flushes
  what is left, in either order."""
  start = 4e9
  early = sized([1, 2], (0, 10))
  by_window_end = [batch(['x'], 10, (0, 10)), batch(['y'], 20, (10, 20))]
  by_buffering = [
      batch(['y'], start + 1000.5, (10, 20)),
      batch(['x'], start + 1001.5, (0, 10)),
  ]
  one = result(*early, *by_window_end)
  other = result(*early, *by_buffering)
  assert differential.compare(one, other, start, end_race=True) == []
  assert differential.compare(one, other, start, end_race=False)
  bigger = result(*early, batch(['x', 'z'], 10, (0, 10)), by_window_end[1])
  lines = differential.compare(one, bigger, start, end_race=True)
  assert any('among those flushed at the end' in line for line in lines)


def test_end_race_keeps_the_order_of_batches_flushed_on_the_way():
  a = sized([1, 2], (0, 10))
  lines = differential.compare(
      result(*a), result(a[1], a[0]), 4e9, end_race=True)
  assert lines


def test_global_window_batches_at_its_end_are_end_flushes():
  """The stateless path stamps every batch with the window's end."""
  a = batch(['a'], 0, 'global')
  a['timestamp'] = GLOBAL_END
  b = dict(a, elements=['b'])
  assert differential.canonical(
      [a, b], 4e9,
      True)['global'] == ([],
                          [dict(a, timestamp='end'), dict(b, timestamp='end')])
  assert differential.canonical([a, b], 4e9, False)['global'] == ([a, b], [])


def test_spec_differences_are_named():
  specs = [{
      'states': {
          'count': ['combining_spec', ['c']], 'batch_size': ['rmw', ['p']]
      },
      'timers': {
          'ts-window_end': 'EVENT_TIME'
      }
  }]
  changed = [{
      'states': {
          'count': ['combining_spec', ['c']]
      },
      'timers': {
          'ts-window_end': 'PROCESSING_TIME'
      }
  }]
  lines = differential.compare(result(specs=specs), result(specs=changed))
  assert lines[0] == 'state and timer specs differ:'
  assert any(
      "state 'batch_size'" in line and 'patched null' in line for line in lines)
  assert any("timer 'ts-window_end'" in line for line in lines)
  assert not any("'count'" in line for line in lines)


def test_an_error_is_reported_with_its_traceback_tail():
  failed = {'error': 'Traceback\n  File x\nValueError: boom\n'}
  lines = differential.compare(result(), failed)
  assert lines[0] == 'the patched tree failed:'
  assert lines[-1].strip() == 'ValueError: boom'


def _results(configs, runner='FnApiRunner', **overrides):
  return {
      f'{config}/{runner}': overrides.get(config, result())
      for config in configs
  }


def test_verdicts():
  documented = next(iter(differential.DOCUMENTED))
  plain = 'stateful-windows-adaptive'
  base = _results([documented, plain])
  different = result(*sized([1], (0, 10)))
  verdicts = {
      name: verdict
      for name, verdict, _ in differential.verdicts(
          base, _results([documented, plain], **{documented: different}))
  }
  assert verdicts == {
      f'{documented}/FnApiRunner': 'documented',
      f'{plain}/FnApiRunner': 'same',
  }
  verdicts = {
      name: (verdict, lines)
      for name, verdict, lines in differential.verdicts(
          base, _results([documented, plain], **{plain: different}))
  }
  assert verdicts[f'{documented}/FnApiRunner'][0] == 'UNDOCUMENTED-SAME'
  assert 'drop it from DOCUMENTED' in verdicts[f'{documented}/FnApiRunner'][1][
      0]
  assert verdicts[f'{plain}/FnApiRunner'][0] == 'DIFFERS'


def test_lost_duplicated_or_empty_output_fails_even_when_documented():
  documented = next(iter(differential.DOCUMENTED))
  expected = ['e0', 'e1', 'e2']
  whole = result(batch(['e0', 'e1'], 1), batch(['e2'], 2))
  cases = {
      'lost': result(batch(['e0', 'e1'], 1)),
      'duplicated': result(batch(['e0', 'e1'], 1), batch(['e1', 'e2'], 2)),
      'empty': result(batch([], 1), batch(['e0', 'e1', 'e2'], 2)),
  }
  for label, patched in cases.items():
    got = differential.verdicts(
        _results([documented], **{documented: whole}),
        _results([documented], **{documented: patched}),
        expected)
    ((_, verdict, lines), ) = got
    assert verdict == 'INCOMPLETE', label
    assert lines[0].startswith('the patched tree'), (label, lines)
  # The base may emit empty batches (the documented bug that 0001 fixes),
  # not lose elements; without expected, nothing is counted.
  base_empty = result(batch([], 1), batch(['e0', 'e1', 'e2'], 2))
  ((_, verdict, _), ) = differential.verdicts(
      _results([documented], **{documented: base_empty}),
      _results([documented], **{documented: whole}),
      expected)
  assert verdict == 'documented'
  ((_, verdict, lines), ) = differential.verdicts(
      _results([documented], **{documented: cases['lost']}),
      _results([documented], **{documented: whole}),
      expected)
  assert verdict == 'INCOMPLETE' and 'the base tree lost 1' in lines[0]
  ((_, verdict, _), ) = differential.verdicts(
      _results([documented], **{documented: whole}),
      _results([documented], **{documented: cases['lost']}))
  assert verdict == 'documented'


def test_a_documented_case_may_not_change_its_specs():
  documented = next(iter(differential.DOCUMENTED))
  specs = [{'states': {'count': ['combining_spec', ['c']]}, 'timers': {}}]
  changed = [{'states': {'count': ['rmw', ['c']]}, 'timers': {}}]
  ((_, verdict, lines), ) = differential.verdicts(
      _results([documented], **{documented: result(specs=specs)}),
      _results([documented],
               **{documented: result(*sized([1], (0, 10)), specs=changed)}))
  assert verdict == 'DIFFERS'
  assert 'not in its state and timer specs' in lines[0]


def test_errors_and_missing_cases_fail_even_when_documented():
  documented = next(iter(differential.DOCUMENTED))
  base = _results([documented, 'stateless-global-fixed'])
  patched = _results([documented], **{documented: {'error': 'boom'}})
  got = {name: v for name, v, _ in differential.verdicts(base, patched)}
  assert got == {
      f'{documented}/FnApiRunner': 'ERROR',
      'stateless-global-fixed/FnApiRunner': 'MISSING',
  }
  _, passed = differential.report(differential.verdicts(base, patched))
  assert not passed


def test_report_passes_only_on_same_and_documented():
  text, passed = differential.report([
      ('a/FnApiRunner', 'same', []),
      ('b/FnApiRunner', 'documented', ['allowed: because']),
  ])
  assert passed
  assert text.splitlines()[-1] == (
      'differential: 2 cases: 1 documented, 1 same: '
      'the patched tree emits what the base emits')
  assert '            allowed: because' in text
  text, passed = differential.report([
      ('a/FnApiRunner', 'same', []),
      ('c/FnApiRunner', 'DIFFERS', ['batches differ']),
  ])
  assert not passed
  assert 'FAILED' in text.splitlines()[-1]
  assert '   DIFFERS  c/FnApiRunner' in text


def test_a_tree_that_cannot_run_the_pipelines_is_an_error(tmp_path):
  empty = tmp_path / 'sdk'
  (empty / 'apache_beam').mkdir(parents=True)
  with pytest.raises(Error) as raised:
    differential.run_trees(empty, empty, 'nothing')
  message = str(raised.value)
  assert 'failed on the base tree' in message
  assert 'apache_beam' in message


def test_slowest_lists_both_trees():
  base = {'a': {'seconds': 1.0}, 'b': {'seconds': 3.0}}
  patched = {'a': {'seconds': 2.0}, 'b': {'error': 'x'}}
  assert differential.slowest(base, patched, 2) == [(3.0, 'base', 'b'),
                                                    (2.0, 'patched', 'a')]


def test_a_selection_that_matches_no_case_is_an_error():
  # Checked before either tree runs: the workspace is never read.
  with pytest.raises(Error, match="-k 'no-such-case' matches no case"):
    differential.run(None, 'no-such-case')


def test_the_gate_counts_the_whole_input(monkeypatch, capsys):
  # run() hands verdicts the input's payloads: a patched tree that loses an
  # element fails the gate even where it may differ.
  documented = next(iter(differential.DOCUMENTED))
  payloads = [payload for _, _, payload in differential.elements()]
  whole = result(batch(payloads, 1))
  short = result(batch(payloads[1:], 1))
  name = f'{documented}/FnApiRunner'

  class Tree:
    base_sdk = sdk = None

  monkeypatch.setattr(
      differential,
      'run_trees', lambda base, patched, select: ({
          name: whole
      }, {
          name: short
      }))
  assert differential.run(Tree(), documented) == 1
  assert f'INCOMPLETE  {name}' in capsys.readouterr().out
  monkeypatch.setattr(
      differential,
      'run_trees', lambda base, patched, select: ({
          name: whole
      }, {
          name: whole
      }))
  assert differential.run(Tree(), documented) == 1  # documented, yet same
  assert 'UNDOCUMENTED-SAME' in capsys.readouterr().out


def _verdict(config, base_batches, patched_batches):
  ((_, verdict, lines), ) = differential.verdicts(
      _results([config], **{config: result(*base_batches)}),
      _results([config], **{config: result(*patched_batches)}))
  return verdict, lines


def test_a_documented_case_may_differ_only_by_its_change():
  # 0001's bug fix drops the empty batches ahead of large elements (which
  # moves the sizes the estimator picks next), and reorders nothing.
  oversized = 'stateless-global-oversized'
  empty, a, bc = batch([], 1), batch(['a'], 2), batch(['b', 'c'], 3)
  recut = [batch(['a', 'b'], 2), batch(['c'], 3)]
  assert _verdict(oversized, [empty, a, bc], recut)[0] == 'documented'
  verdict, lines = _verdict(oversized, [empty, a, bc], [bc, a])
  assert verdict == 'DIFFERS'
  assert "reorder the base's elements" in lines[1]
  # 0001's stateful path cuts the same elements, in the same order, where
  # their sizes (element_size: 1 + length % 4) would pass 8.
  sized_case = 'stateful-global-sized'
  payloads = ['aaa', 'bbb', 'c', 'dd', 'eee', 'f']  # sizes 4, 4, 2, 3, 4, 2
  assert [differential.element_size(p) for p in payloads] == [4, 4, 2, 3, 4, 2]
  base = [batch(payloads, 1)]
  recut = [
      batch(payloads[:2], 1), batch(payloads[2:4], 2), batch(payloads[4:], 3)
  ]
  assert _verdict(sized_case, base, recut)[0] == 'documented'
  reordered = [
      batch(payloads[2:4], 1), batch(payloads[:2], 2), batch(payloads[4:], 3)
  ]
  verdict, lines = _verdict(sized_case, base, reordered)
  assert verdict == 'DIFFERS'
  assert "reorder the base's elements" in lines[1]
  heavy = [batch(payloads[:3], 1), batch(payloads[3:], 2)]
  verdict, lines = _verdict(sized_case, base, heavy)
  assert verdict == 'DIFFERS'
  assert 'a patched batch of 3 elements weighs 10, over 8' in lines[1]
